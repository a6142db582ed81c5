"""What a `TrainLoop` job across ``torchrun`` ranks costs a DDP loop, and how fast a stop ends every rank.

Launches itself under ``torchrun`` (``python -m torch.distributed.run
--nproc-per-node N``, 127.0.0.1, the gloo backend on CPU, one thread per
rank), each rank running this file with ``--worker``: a
``DistributedDataParallel`` MLP (32 -> 256 -> 256 -> 1, SGD, 32 examples a
rank and item; every item's backward is an allreduce).

Pacing: a step of that MLP takes well under 5 ms here, so each item is
padded with a fixed amount of real compute, a chain of 128 x 128 matrix
products (``torch.mm``, one thread; by an orthogonal matrix, so the values
keep their size), to about ``--step-ms`` (default 5).
The number of products is calibrated once per job, before anything is
timed: every rank times the bare step (the fastest of 31) and one product
(the fastest of 20 chains of 10), which give a first count; then, three
times, the paced step's median (of 31) scales the count towards the
target (on this VM the median step is ~1.5x the fastest). Every figure is
the slowest rank's (an allreduce of max), so every rank uses the same
count from then on. The paced step's median is printed (``paced step ms``).

In the same processes, round after round in a rotating order:

- per-item cost: ``plain`` (``for epoch in range(E): for i in range(B):``
  the step, ``loss.item()``; no `TrainLoop`) and ``control`` (the same
  body inside ``TrainLoop(..., autosave=0, save_at_end=False)`` with
  ``loop.epochs`` / ``loop.batches`` / ``loop.log(loss=...)``; the job is
  found by itself from the default process group: rank 0 owns the run and
  its FIFO, a watcher thread per rank polls the torch store). A new run
  per round; each rank times every epoch after the first (only the items:
  ``loop.batches`` and the body). A round's figure is the slowest rank's
  median per item; ``control / plain`` is taken per round, then its median
  (goal 1.02x at 5 ms steps);
- the loop's part alone: before the rounds, every rank runs one epoch of
  20,000 items with an empty body (``loop.log`` only) in a `TrainLoop`
  with the job, timed against a bare ``for`` over as many items; the
  slowest rank's difference per item, over a ``plain`` item, is the
  overhead free of the machine's noise (``boundary ratio``);
- stop latency: a `TrainLoop` with the job, training; at a random moment
  (0.3-1.5 s in) a thread of rank 0 writes ``stop`` into the run's FIFO,
  as ``echo stop > FIFO`` would, and notes the time; every rank notes when
  its ``with`` block was left (the stop's checkpoint and the run's close
  included) and when its loop body ended. The latency is from the write to
  the last rank's end (one machine: one clock, ``time.time()``).

Usage::

    python benchmarks/torch_job.py                 # 2 ranks, 9 rounds of 4 epochs x 100 items, 5 stops (~1 min)
    python benchmarks/torch_job.py --ranks 2 --ranks 4 --step-ms 10
    python benchmarks/torch_job.py --quick         # 2 ranks, 1 round, 1 stop (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

GOAL_RATIO = 1.02  # control / plain
VARIANTS = ["plain", "control"]
FEATURES, WIDTH, BATCH_SIZE, PAD_SIZE = 32, 256, 32, 128


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The worker: one rank of the job ------------------------------------------------------


def worker(out: Path, rounds: int, epochs: int, items: int, stops: int, step_ms: float, seed: int,
           boundary_items: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from jupyter_traincontrol import TrainLoop

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    log = open(out / f"rank-{rank}.jsonl", "a", buffering=1)

    def note(**event) -> None:
        log.write(json.dumps({"rank": rank, **event}) + "\n")

    torch.manual_seed(seed)  # the same initial weights on every rank
    net = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(FEATURES, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 1)))
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(seed + rank)  # each rank its shard
    x = torch.rand(items * BATCH_SIZE, FEATURES, generator=generator)
    batches = [(x[i:i + BATCH_SIZE], x[i:i + BATCH_SIZE].sum(1, keepdim=True)) for i in range(0, len(x), BATCH_SIZE)]
    pad_a = torch.rand(PAD_SIZE, PAD_SIZE, generator=generator)
    # Orthogonal: the chain's values keep their size (no denormals, no overflow) however long it is.
    pad_b = torch.linalg.qr(torch.randn(PAD_SIZE, PAD_SIZE, generator=generator))[0]
    pad = [0]  # products per item, calibrated below

    def step(index: int) -> float:
        xb, yb = batches[index]
        product = pad_a
        for _ in range(pad[0]):  # the fixed amount of real compute that paces an item
            product = torch.mm(product, pad_b)
        loss = torch.nn.functional.mse_loss(net(xb), yb) + 0.0 * product[0, 0]
        optimizer.zero_grad()
        loss.backward()  # an allreduce: every rank takes part in every item
        optimizer.step()
        return loss.item()

    def slowest(value: float) -> float:
        tensor = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    # Calibration: the bare step, then one product, each timed on every rank.
    def step_times(count: int = 31) -> list:
        times = []
        for n in range(count):
            start = time.perf_counter()
            step(n % items)
            times.append(time.perf_counter() - start)
        return sorted(times)

    for index in range(min(10, items)):
        step(index)
    bare = slowest(step_times()[0])  # the fastest: what the machine does when nothing else runs
    units = []
    for _ in range(20):
        start = time.perf_counter()
        product = pad_a
        for _ in range(10):
            product = torch.mm(product, pad_b)
        units.append((time.perf_counter() - start) / 10)
    unit = slowest(min(units))
    pad[0] = max(0, round((step_ms / 1000 - bare) / unit))
    for _ in range(3):  # then to the target by the median step (the fastest ones run well below it here)
        paced = slowest(step_times()[15])
        pad[0] = max(0, round(pad[0] * (step_ms / 1000) / paced)) if pad[0] else 0
    paced = slowest(step_times()[15])  # the median
    note(kind="pace", bare=bare, unit=unit, products=pad[0], step=paced)

    def time_epochs(per_epoch) -> float:
        """Runs epochs + 1 epochs (per_epoch yields each epoch's item iterator);
        returns the median per item of the epochs after the first."""
        times = []
        for epoch, run_items in per_epoch():
            start = time.perf_counter()
            run_items()
            if epoch > 0:
                times.append((time.perf_counter() - start) / items)
        return sorted(times)[len(times) // 2]

    def plain() -> float:
        def per_epoch():
            for epoch in range(epochs + 1):
                def run_items():
                    for index in range(items):
                        step(index)
                yield epoch, run_items
        return time_epochs(per_epoch)

    def control(round_: int) -> float:
        with TrainLoop(name=f"torch-bench-{round_}", checkpoint_dir=str(out / "ck" / f"round-{round_}"),
                       state={"net": net, "optimizer": optimizer}, autosave=0, save_at_end=False,
                       verbose=False) as loop:
            def per_epoch():
                for epoch in loop.epochs(epochs + 1):
                    def run_items():
                        for index in loop.batches(range(items)):
                            loop.log(loss=step(index))
                    yield epoch, run_items
            seconds = time_epochs(per_epoch)
        if loop.state != "finished":
            raise RuntimeError(f"the control round {round_} ended {loop.state}, not finished")
        return seconds

    # The loop's part alone, free of the machine's noise: one item's boundary in the job
    # (`loop.batches` yielding an item, `loop.log`) with an empty body, against a bare `for`.
    with TrainLoop(name="torch-bench-boundary", checkpoint_dir=str(out / "ck" / "boundary"),
                   state={"net": net, "optimizer": optimizer}, autosave=0, save_at_end=False, verbose=False) as loop:
        for epoch in loop.epochs(1):
            start = time.perf_counter()
            for index in loop.batches(range(boundary_items)):
                loop.log(loss=0.5)
            boundary = (time.perf_counter() - start) / boundary_items
    start = time.perf_counter()
    for index in range(boundary_items):
        pass
    bare_for = (time.perf_counter() - start) / boundary_items
    note(kind="boundary", seconds=boundary - bare_for)
    dist.barrier()

    for round_ in range(rounds):
        shift = round_ % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            seconds = plain() if variant == "plain" else control(round_)
            note(kind="item", round=round_, variant=variant, seconds=seconds)

    def send_stop(fifo: str, delay: float, stop: int) -> None:
        """Rank 0's thread: `stop` into the run's FIFO after `delay` seconds."""
        time.sleep(delay)
        sent = time.time()
        with open(fifo, "w") as pipe:  # as `echo stop > FIFO` does
            pipe.write("stop\n")
        note(kind="sent", stop=stop, time=sent)

    rng = random.Random(seed)
    for stop in range(stops):
        delay = rng.uniform(0.3, 1.5)
        trained = 0
        with TrainLoop(name=f"torch-stop-{stop}", checkpoint_dir=str(out / "ck" / f"stop-{stop}"),
                       state={"net": net, "optimizer": optimizer}, autosave=0, save_at_end=False,
                       verbose=False) as loop:
            if rank == 0:
                sender = threading.Thread(target=send_stop, args=(loop.fifo, delay, stop), name="bench-send-stop",
                                          daemon=True)
                sender.start()
            for epoch in loop.epochs(1_000_000):
                for index in loop.batches(range(items)):
                    loop.log(loss=step(index))
                    trained += 1
            body_ended = time.time()
        ended = time.time()
        if rank == 0:
            sender.join(30)
        note(kind="stopped", stop=stop, body=body_ended, time=ended, state=loop.state, ended_by=str(loop.ended_by),
             trained=trained, checkpoints=len(loop.checkpoints))
        dist.barrier()  # every rank has left this run before the next one begins
    log.close()
    dist.destroy_process_group()


# The driver -------------------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (Linux: from /proc), children first."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop(0)
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
            found.extend(children)
            queue.extend(children)
    return found


def _end_job(launcher: subprocess.Popen) -> None:
    """Kills the launcher, its process group and every rank: torchrun starts
    each rank in a session of its own, out of the launcher's group."""
    ranks = _descendants(launcher.pid)
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in ranks:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_job(ranks: int, folder: Path, args, epochs: int, items: int, stops: int, timeout: float) -> dict:
    out = folder / f"job-{ranks}"
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
               __file__, "--worker", "--out", str(out), "--rounds", str(args.rounds), "--epochs", str(epochs),
               "--items", str(items), "--stops", str(stops), "--step-ms", str(args.step_ms), "--seed", str(args.seed),
               *(["--quick"] if args.quick else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(_common.REPO), os.environ.get("PYTHONPATH", "")])}
    with open(out / "torchrun.log", "w+") as output:
        launcher = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # its own process group: ended with its ranks
        try:
            launcher.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if launcher.poll() is None or launcher.returncode:
                _end_job(launcher)
            launcher.wait()
        output.seek(0)
        text = output.read()
    if launcher.returncode:
        raise SystemExit(f"the {ranks}-rank job failed (exit status {launcher.returncode}, timeout {timeout:.0f} s):\n"
                         f"{text[-4000:]}")
    events = [json.loads(line) for rank in range(ranks) for line in (out / f"rank-{rank}.jsonl").read_text().splitlines()]
    times = {v: [] for v in VARIANTS}
    ratios = []
    for round_ in range(args.rounds):
        # A job steps together: its per-item time is its slowest rank's.
        per = {v: max(e["seconds"] for e in events if e["kind"] == "item" and e["round"] == round_ and e["variant"] == v)
               for v in VARIANTS}
        for v in VARIANTS:
            times[v].append(per[v])
        ratios.append(per["control"] / per["plain"])
    sent = {e["stop"]: e["time"] for e in events if e["kind"] == "sent"}
    stopped = [e for e in events if e["kind"] == "stopped"]
    bad = [e for e in stopped if e["state"] != "stopped" or e["ended_by"] != "stop"]
    if bad or len(sent) != stops or len(stopped) != stops * ranks:
        raise SystemExit(f"the {ranks}-rank job did not stop as asked: {len(sent)} of {stops} sent, "
                         f"{len(stopped)} of {stops * ranks} rank ends, not stopped: {bad}")
    latency = [max(e["time"] for e in stopped if e["stop"] == stop) - sent[stop] for stop in range(stops)]
    body = [max(e["body"] for e in stopped if e["stop"] == stop) - sent[stop] for stop in range(stops)]
    pace = max((e for e in events if e["kind"] == "pace"), key=lambda e: e["step"])
    boundary = max(e["seconds"] for e in events if e["kind"] == "boundary")
    return {**times, "ratios": ratios, "latency": latency, "body": body, "pace": pace, "boundary": boundary}


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=9, quick_rounds=1)
    parser.add_argument("--ranks", type=int, action="append", help="ranks of the job (repeatable; default 2)")
    parser.add_argument("--epochs", type=int, default=None, help="measured epochs per round (default 4; 1 with --quick)")
    parser.add_argument("--items", type=int, default=None, help="items per epoch (default 100; 20 with --quick)")
    parser.add_argument("--stops", type=int, default=None, help="stop commands timed per job (default 5; 1 with --quick)")
    parser.add_argument("--step-ms", type=float, default=5.0, help="an item's length the compute is padded to (default 5)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = _common.parse_args(parser, argv)
    epochs = args.epochs or (1 if args.quick else 4)
    items = args.items or (20 if args.quick else 100)
    stops = args.stops or (1 if args.quick else 5)
    if args.worker:
        worker(Path(args.out), args.rounds, epochs, items, stops, args.step_ms, args.seed, 2000 if args.quick else 20000)
        return 0
    sizes = [2] if args.quick else (args.ranks or [2])
    rows, summary = [], []
    with _common.scratch_folder(args.dir, "traincontrol-bench-") as folder:
        for ranks in sizes:
            # Start-up (torch, the rendezvous) is ~10 s; each item ~step-ms x (epochs + 1) per variant and round;
            # each stop up to a few seconds. Generous: the limit only ends a job that hangs.
            budget = 60 + args.rounds * 2 * (epochs + 1) * items * args.step_ms / 1000 * 4 + args.rounds * 10 + stops * 20
            result = run_job(ranks, folder, args, epochs, items, stops, timeout=min(budget, 100 if args.quick else 3600))
            ratio = _common.median(result["ratios"])
            latency = _common.median(result["latency"]) * 1000
            plain = _common.median(result["plain"])
            share = 1 + result["boundary"] / plain  # what the loop adds to an item, free of the machine's noise
            rows.append((ranks, result["pace"]["step"] * 1000, result["pace"]["products"],
                         plain * 1000, _common.median(result["control"]) * 1000, ratio,
                         min(result["ratios"]), max(result["ratios"]), result["boundary"] * 1e6, share,
                         _common.median(result["body"]) * 1000, latency, max(result["latency"]) * 1000))
            summary.append(f"{ranks} ranks control/plain {ratio:.3f}x per item ({plain * 1000:.2f} ms plain; "
                           f"boundary alone {share:.4f}x), stop in {latency:.0f} ms")
    _common.print_table(
        ["ranks", "paced step ms", "pad products", "plain ms/item", "control ms/item", "control/plain",
         "ratio min", "ratio max", "boundary us", "boundary ratio", "stop body ms", "stop median ms", "stop max ms"], rows)
    print(f"goal: control/plain <= {GOAL_RATIO} at {args.step_ms:g} ms steps; {args.rounds} rounds of {epochs} epochs x "
          f"{items} items, {stops} stops (stop body: to the last rank's loop body ending; stop: to its with block left)")
    _common.print_summary("torch_job: " + "; ".join(summary) + f" (goal control/plain <= {GOAL_RATIO}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
