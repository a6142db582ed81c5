"""What a send costs its sender: `control.client.send` to a listening run.

The CLI, the Jupyter server (the side panel, the REST API) and a script's
`send` all go through `control.client.send`. It writes to the run's FIFO
first, found by the run's name alone, and reads the run's record only when
nothing listens there. Beside it, the same send with the record read first
(found, validated, its liveness lock probed: what every send did before),
forced by giving the FIFO-first lookup nothing. Both send ``save`` to one
run in this process, which listens on its FIFO (no Keras: the run's thread
reads and queues the lines; the queue is emptied between rounds).

Each round runs each variant once (rotating order), a burst of sends each;
it prints the median microseconds a send and the median of the per-round
ratios.

Usage::

    python benchmarks/send_cost.py           # 21 rounds of 300 sends
    python benchmarks/send_cost.py --quick   # 3 rounds of 50 (a smoke run)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

_common.prepare_environment()

SENDS = {False: 300, True: 50}  # a round's burst, by --quick


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=21, quick_rounds=3)
    args = _common.parse_args(parser, argv)
    from jupyter_traincontrol.control import client
    from jupyter_traincontrol.run import RunLifecycle

    sends = SENDS[args.quick]
    with _common.scratch_folder(args.dir, "traincontrol-bench-send-") as scratch:
        run = RunLifecycle("bench-send", scratch / "checkpoints").open()
        fifo_first = client._fifo_of
        try:
            run.move_to("running")
            run.publish(force=True)

            def burst(fifo_of) -> float:
                client._fifo_of = fifo_of
                try:
                    started = time.perf_counter()
                    for _ in range(sends):
                        client.send("bench-send", "save")
                    elapsed = time.perf_counter() - started
                finally:
                    client._fifo_of = fifo_first
                for _ in range(sends):  # every line read and taken before the next burst
                    if run.channel.get(timeout=10) is None:
                        raise TimeoutError("the run's thread did not read a burst of sends within 10 s")
                return elapsed / sends

            times = _common.alternate({
                "FIFO first": lambda: burst(fifo_first),
                "record first": lambda: burst(lambda name: None),
            }, rounds=args.rounds, label="send_cost")
        finally:
            run.close("finished")
    ratios = _common.paired_ratios(times, "FIFO first")
    print(f"send_cost: {args.rounds} rounds of {sends} sends each, to a run listening on its FIFO")
    _common.print_table(["variant", "median us a send", "ratio to FIFO first"],
                        [[name, f"{_common.median(values) * 1e6:.0f}", f"{_common.median(ratios[name]):.2f}"]
                         for name, values in times.items()])
    fast, slow = _common.median(times["FIFO first"]) * 1e6, _common.median(times["record first"]) * 1e6
    _common.print_summary(f"send_cost: a send {fast:.0f} us FIFO first, {slow:.0f} us record first "
                          f"({_common.median(ratios['record first']):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
