"""Everything IPython and ipywidgets: the notebook side of jupyter-traincontrol.

- `extension`: ``%load_ext jupyter_traincontrol``: the ``%%interruptible_fit``
  magic and the kernel hooks, installed and removed as one unit.
- `run`: a `TrainingRun`, the cell's code on a background thread under control.
- `fit_hook`: adds the run's callback to every ``fit`` on that thread (Keras 3's and ``tf_keras``'s).
- `output`: what that thread prints goes to the run, not to the current cell.
- `panel`: the ipywidgets panel; `chart_svg` its loss chart; `panel_text` its
  words and numbers (written as the JupyterLab side panel writes them);
  `click_notes` what it says of its clicks (and of those its run never took);
  `front_end_notes` what it says where clicks travel through the kernel.
- `widget_compat`: what differs between ipywidgets 7.7 (Colab) and 8, for the panel.
- `output_mime`: the mime type by which a cell's output names its run, for
  the JupyterLab extension once the widgets are gone (a kernel restart).
- `text_reporter`: the panel's stand-in outside a notebook front end.
- `kernel_interrupts`: hears kernel interrupts whether the kernel is idle or busy.
- `kernel_shutdown`: holds SIGTERM while active runs stop at a kernel shutdown or restart.

Nothing below this layer imports it, IPython or ipywidgets.
"""
