"""``jupyter-traincontrol``: list training runs and send them commands.

Also reachable as ``jupyter traincontrol``. It reads run records and writes
FIFOs only, and never imports Keras, so it answers in milliseconds.

A command may be one argument or several words: ``send mnist "set lr=1e-4"``
and ``send mnist set lr=1e-4`` are the same.

Exit codes: 0 done; 2 bad usage or unknown command (also a ``set`` or
``rollback`` whose arguments are not valid); 3 no such run; 4 the run no
longer listens (it ended, or its process is gone, also while ``--wait``
waited); 5 the command could not be delivered; 6 the run could not carry
the command out (``--wait``: a save that could not be written, a ``set``
this optimizer refuses, a ``rollback`` to a checkpoint it does not have);
7 ``--wait`` timed out before the run acknowledged the command (a run
still ``starting``, whose code has not called ``fit`` yet, is said to be).

``list --all`` also shows the ended runs of the last 7 days (at most 50, 5 of one name),
with how each ended (``end_reason``), after kernel and server restarts too;
for a run whose process died (killed, a kernel that died), it says its
newest checkpoint and how to continue from it (``--resume``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import sys
import time
from typing import Any, Sequence

from ..protocol import COMMAND_HELP, COMMAND_NAMES, UnknownCommandError, resume_hint
from ..registry import RunNotFoundError, list_runs
from ..system.private_fs import UnsafePathError
from ..system.processes import pid_gone
from ..transport.channels import ChannelError, NotListeningError
from .client import CommandFailedError, public_record, send, wait_for_ack

__all__ = ["main", "format_table"]

EXIT_USAGE, EXIT_NO_RUN, EXIT_NOT_LISTENING, EXIT_NOT_DELIVERED, EXIT_FAILED, EXIT_TIMEOUT = 2, 3, 4, 5, 6, 7


def _age(started: Any, now: float) -> str:
    if not isinstance(started, (int, float)):
        return "-"
    seconds = max(0, int(now - started))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _fraction(done: Any, total: Any) -> str:
    if not done and not total:
        return "-"
    return f"{done}/{total}" if total else f"{done}"


def _loss(metrics: Any) -> str:
    if not isinstance(metrics, dict) or "loss" not in metrics:
        return "-"
    value = metrics["loss"]
    return f"{value:.4g}" if isinstance(value, (int, float)) else "nan"  # NaN and infinities are null in JSON


def _learning_rate(tunables: Any) -> str:
    value = tunables.get("learning_rate") if isinstance(tunables, dict) else None
    return f"{value:.3g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _state(record: dict[str, Any]) -> str:
    """The state, with a job's process count and the process it lost
    (``gone`` for a run whose process died before it ended)."""
    state = "gone" if record.get("end_reason") == "process-gone" else str(record.get("state"))
    count, lost = record.get("num_processes"), record.get("lost_process")
    if isinstance(lost, int):
        return f"{state} (process {lost} of {count} lost)"
    return f"{state} ({count} processes)" if isinstance(count, int) and count > 1 else state


def _ended(record: dict[str, Any], now: float) -> str:
    """How and how long ago an ended run ended (``interrupt, 3m02s ago``), or ``-``."""
    reason = record.get("end_reason")
    if not isinstance(reason, str):
        return "-"
    ended = record.get("ended")
    return f"{reason}, {_age(ended, now)} ago" if isinstance(ended, (int, float)) else reason


def _where(record: dict[str, Any]) -> str:
    """Where the run lives or lived: ``train.py (pid 4711)``, with ``, gone``
    once its process is (an ended run of a kernel that lives on is not)."""
    pid = record.get("pid")
    gone = not record.get("live", True) and (not isinstance(pid, int) or pid <= 0 or pid_gone(pid))
    return f"{record.get('origin') or '-'} (pid {pid}{', gone' if gone else ''})"


def format_table(records: Sequence[dict[str, Any]], now: float | None = None, *, ended: bool = False) -> str:
    """Renders run records as an aligned text table.

    Args:
        records: Run records, as `list_runs` returns them.
        now: The time ages count to. Defaults to now.
        ended: Add an ENDED column: how each ended run ended, and when.
    """
    now = time.time() if now is None else now
    rows = [("NAME", "STATE", "EPOCH", "STEP", "LOSS", "LR", "AGE", *(("ENDED",) if ended else ()), "WHERE")]
    for record in records:
        rows.append(
            (
                str(record.get("name")),
                _state(record),
                _fraction(record.get("epoch"), record.get("epochs")),
                _fraction(record.get("step"), record.get("steps")),
                _loss(record.get("metrics")),
                _learning_rate(record.get("tunables")),
                _age(record.get("started"), now),
                *((_ended(record, now),) if ended else ()),
                _where(record),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def _command_list(args: argparse.Namespace) -> int:
    records = list_runs(ended=args.all)
    if args.json:
        print(json.dumps([public_record(record) for record in records], indent=1, sort_keys=True))
    elif records:
        print(format_table(records, ended=args.all))
        for record in records:  # a run whose process died: where it can go on from
            if hint := resume_hint(record):
                print(f"{record.get('name')}: its process is gone. {hint}")
    else:
        print("No training runs are listed." if not args.all else "No training runs are listed, and none ended lately.")
    return 0


def _command_send(args: argparse.Namespace) -> int:
    if not args.command:  # one word given: a command whose run's name was forgotten, or a name alone
        if args.name.strip().lower() in COMMAND_NAMES:
            return _fail(f"send {args.name}: the run's name is missing; expected `jupyter-traincontrol send NAME "
                         f"{args.name}` (`jupyter-traincontrol list` shows the names).", EXIT_USAGE)
        return _fail(f"send {args.name}: the command is missing; expected one of: {', '.join(COMMAND_NAMES)}.",
                     EXIT_USAGE)
    try:
        request = send(args.name, " ".join(args.command), sender="cli", waited=args.wait is not None)
    except UnknownCommandError as error:
        return _fail(str(error), EXIT_USAGE)
    except RunNotFoundError as error:
        return _fail(str(error), EXIT_NO_RUN)
    except NotListeningError as error:
        return _fail(str(error), EXIT_NOT_LISTENING)
    except (ChannelError, UnsafePathError) as error:
        return _fail(str(error), EXIT_NOT_DELIVERED)
    if args.wait is None:
        print(f"Sent {request} to {args.name}.")
        return 0
    try:
        ack = wait_for_ack(args.name, request, args.wait)
    except NotListeningError as error:
        return _fail(str(error), EXIT_NOT_LISTENING)
    except CommandFailedError as error:
        return _fail(str(error), EXIT_FAILED)
    except TimeoutError as error:
        return _fail(str(error), EXIT_TIMEOUT)
    print(f"Sent {request} to {args.name}: {ack['message'].rstrip('.')}.")
    return 0


def _seconds(text: str) -> float:
    """``--wait``'s argument: a number of seconds, not negative."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text[:80]!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds of at least 0, got {text[:80]!r}")
    return value


def _fail(message: str, code: int) -> int:
    print(f"jupyter-traincontrol: error: {message}", file=sys.stderr)
    return code


def _version() -> str:
    try:
        return importlib.metadata.version("jupyter-traincontrol")
    except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        return "(not installed)"


#: The help's epilog: this module's docstring from its third paragraph, as
#: plain text (its double backticks are markup for the reference docs).
_EPILOG = __doc__.split("\n\n", 2)[2].replace("``", "")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``jupyter-traincontrol``."""
    parser = argparse.ArgumentParser(
        prog="jupyter-traincontrol",
        description="List Keras training runs; stop, save, abort, pause, resume, steer (set lr=...) or roll them back.",
        epilog=_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    verbs = parser.add_subparsers(dest="verb", metavar="{list,send}")
    verbs.required = True

    list_parser = verbs.add_parser(
        "list",
        help="show the runs of this user",
        description="Show the training runs of this user (live, and ended ones whose process still lives).",
    )
    list_parser.add_argument("--json", action="store_true", help="print a JSON array of run records")
    list_parser.add_argument(
        "--all", action="store_true",
        help="also the ended runs of the last 7 days (at most 50, 5 of one name), after a kernel or server "
        "restart too, with how each ended (end_reason) and its checkpoints",
    )
    list_parser.set_defaults(handler=_command_list)

    send_parser = verbs.add_parser(
        "send",
        help="send a command to a run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Send one command to a run; it acts at the run's next batch boundary.\n\n"
        + "\n".join(f"  {command.value:<9} {text}" for command, text in COMMAND_HELP.items()),
        epilog=_EPILOG,
    )
    send_parser.add_argument("name", help="the run's name, as `list` shows it")
    send_parser.add_argument(
        "command", nargs="*", metavar="command",
        help=f"one of: {', '.join(COMMAND_NAMES)}, with its arguments (set lr=1e-4, rollback 2)",
    )
    send_parser.add_argument(
        "--wait", nargs="?", type=_seconds, const=60.0, default=None, metavar="SECONDS",
        help="wait until the run has acknowledged the command (default at most 60 s)",
    )
    send_parser.set_defaults(handler=_command_send)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI. Returns the exit code."""
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
