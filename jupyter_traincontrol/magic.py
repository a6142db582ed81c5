"""``%%interruptible_fit``: train in the background, under control, from a cell.

::

    %load_ext jupyter_traincontrol

    %%interruptible_fit --name mnist
    history = model.fit(x, y, epochs=50, validation_split=0.1)

The cell's code runs on a background thread in the user namespace; every
``fit`` it calls gets the control callback. The cell returns at once with the
run, whose display is its control panel (Save, Stop, Abort, Pause/Resume,
progress, metrics, a loss chart and a log). Names the cell assigns are in the
namespace once the run ends, however it ends.

Defaults are traitlets of `TrainControlMagics`, settable with ``%config`` or
in ``ipython_config.py``::

    %config TrainControlMagics.keep = 5
"""

from __future__ import annotations

from pathlib import Path

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Enum, Float, Int, Unicode

from .registry import NameTakenError, unique_name, validate_name

__all__ = ["TrainControlMagics"]


@magics_class
class TrainControlMagics(Magics):
    """The ``%%interruptible_fit`` cell magic and its configurable defaults."""

    checkpoint_dir = Unicode(
        "checkpoints/{name}",
        help="Where a run's checkpoints go unless --checkpoint-dir is given; "
        "{name} is replaced by the run's name. Relative to the kernel's working directory.",
    ).tag(config=True)
    keep = Int(3, help="How many of the newest checkpoints a run keeps.").tag(config=True)
    on_interrupt = Enum(
        ["stop", "save", "abort"],
        default_value="stop",
        help="What interrupting the kernel does to its active runs.",
    ).tag(config=True)
    refresh_rate = Float(5.0, help="Panel redraws a second, at most.").tag(config=True)
    name_prefix = Unicode("fit", help="Default run names are PREFIX-1, PREFIX-2, ...").tag(config=True)

    def __init__(self, shell, extension):
        super().__init__(shell=shell)
        self._extension = extension

    @magic_arguments()
    @argument("--name", help="the run's name, unique among live runs (default: fit-N)")
    @argument("--checkpoint-dir", help="folder of the run's checkpoints (default: checkpoints/NAME)")
    @argument("--keep", type=int, help="how many of the newest checkpoints to keep (default: 3)")
    @argument("--resume", action="store_true", help="continue from the latest checkpoint in the checkpoint dir")
    @argument("--wait", action="store_true", help="keep the cell busy until the run ends")
    @argument(
        "--on-interrupt", choices=["stop", "save", "abort"],
        help="what a kernel interrupt does to this run (default: stop)",
    )
    @cell_magic
    def interruptible_fit(self, line: str, cell: str):
        """Run the cell's ``fit`` in the background, controllable by buttons,
        kernel interrupts, the terminal and JupyterLab.

        The cell returns at once with the run (its panel). Interrupting the
        kernel stops active runs with a checkpoint; a second interrupt while
        they stop aborts them. From a terminal:
        ``jupyter-traincontrol send NAME stop`` (or save, abort, pause,
        resume).
        """
        args = parse_argstring(self.interruptible_fit, line)
        if not cell.strip():
            raise UsageError("%%interruptible_fit: the cell is empty. Put the code that calls fit below the magic line.")
        keep = self.keep if args.keep is None else args.keep
        if keep < 1:
            raise UsageError(f"%%interruptible_fit: --keep must be at least 1, got {keep}.")
        try:
            name = validate_name(args.name) if args.name else unique_name(self.name_prefix)
        except ValueError as error:
            raise UsageError(f"%%interruptible_fit: {error}") from None
        checkpoint_dir = args.checkpoint_dir or self.checkpoint_dir.format(name=name)
        try:
            run = self._extension.start_run(
                self.shell.transform_cell(cell),
                name=name,
                checkpoint_dir=str(Path(checkpoint_dir).expanduser()),
                keep=keep,
                resume=args.resume,
                on_interrupt=args.on_interrupt or self.on_interrupt,
                refresh_rate=self.refresh_rate,
            )
        except NameTakenError as error:
            raise UsageError(f"%%interruptible_fit: {error}") from None
        except SyntaxError as error:
            raise UsageError(f"%%interruptible_fit: the cell is not valid Python: {error}") from None
        if args.wait:
            from IPython.display import display

            display(run)
            self._extension.wait_in_cell(run)
            return None
        return run
