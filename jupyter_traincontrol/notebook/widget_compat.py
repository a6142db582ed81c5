"""What differs between ipywidgets 7.7 and 8, in one place: a widget's display data and its tooltip.

Colab renders only ipywidgets 7 (it ships 7.7.1); JupyterLab 4 and Notebook 7
render 8. The panel uses only what both versions have, except for two
things, which go through this module:

- Display: a widget of ipywidgets 8 has ``_repr_mimebundle_``; one of 7.x
  has none (its ``_ipython_display_`` publishes the same data itself).
  `view_bundle` returns that data with either, so a run's own mime bundle
  can hold its panel's view.
- Tooltips: in 8 every widget has ``tooltip``; in 7.x only buttons do, and
  a field has ``description_tooltip`` (shown on its label). `set_tooltip`
  sets whichever the widget has.

Example:

>>> import ipywidgets
>>> view_bundle(ipywidgets.VBox())[WIDGET_VIEW_MIME_TYPE]["version_major"]   # doctest: +SKIP
2
"""

from __future__ import annotations

__all__ = ["WIDGET_VIEW_MIME_TYPE", "view_bundle", "set_tooltip"]

#: The mime type of a widget's view in a cell's output (both versions).
WIDGET_VIEW_MIME_TYPE = "application/vnd.jupyter.widget-view+json"
#: What ipywidgets 7.x's ``_repr_`` text is cut to, as 8's is.
_TEXT_LENGTH = 110


def view_bundle(widget) -> dict:
    """The display data of `widget`: its text and, while it is open, its view.

    With ipywidgets 8, what its ``_repr_mimebundle_`` returns; with 7.x, the
    data its ``_ipython_display_`` would publish (the same keys and values).

    Args:
        widget: An ipywidgets widget (a `DOMWidget`: it has a view).
    """
    own = getattr(widget, "_repr_mimebundle_", None)  # ipywidgets 8 (None once the widget is closed)
    if callable(own):
        return dict(own() or {})
    text = repr(widget)
    bundle = {"text/plain": text if len(text) <= _TEXT_LENGTH else text[:_TEXT_LENGTH] + "…"}
    if getattr(widget, "comm", None) is not None:  # ipywidgets 7.x, open: widget protocol 2.0
        bundle[WIDGET_VIEW_MIME_TYPE] = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
    return bundle


def set_tooltip(widget, text: str) -> None:
    """Sets `widget`'s tooltip: ``tooltip`` where it has one (every widget of
    ipywidgets 8, a 7.x button), else ``description_tooltip`` (a 7.x field)."""
    name = "tooltip" if widget.has_trait("tooltip") else "description_tooltip"
    setattr(widget, name, text)
