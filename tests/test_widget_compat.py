"""The panel's widgets display and take tooltips alike on ipywidgets 8 and 7.7.

Runs in the main venv (ipywidgets 8) and in `make test-colab`'s
.venv-colab (ipywidgets 7.7.1, Colab's), where no widget has
``_repr_mimebundle_`` and a field has no ``tooltip``.
"""

from __future__ import annotations

import ipywidgets

from jupyter_traincontrol.notebook.widget_compat import WIDGET_VIEW_MIME_TYPE, set_tooltip, view_bundle


def test_a_widgets_bundle_holds_its_view_while_it_is_open():
    box = ipywidgets.VBox([ipywidgets.Button(description="Save")])
    bundle = view_bundle(box)
    assert bundle[WIDGET_VIEW_MIME_TYPE] == {"version_major": 2, "version_minor": 0, "model_id": box.model_id}
    assert bundle["text/plain"].startswith("VBox(") and len(bundle["text/plain"]) <= 111
    box.close()
    assert set(view_bundle(box)) == {"text/plain"}  # a closed widget has no view


def test_a_field_and_a_button_take_a_tooltip():
    field, button = ipywidgets.Text(description="lr"), ipywidgets.Button(description="Save")
    set_tooltip(field, "The learning rate")
    set_tooltip(button, "Write a checkpoint")
    major = int(ipywidgets.__version__.split(".")[0])
    assert (field.tooltip if major >= 8 else field.description_tooltip) == "The learning rate"
    assert button.tooltip == "Write a checkpoint"
