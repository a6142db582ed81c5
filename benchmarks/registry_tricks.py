"""What each of the registry's short-fit tricks saves a short `fit`, on and off side by side.

A run per `fit` writes its record as it opens and as it closes, takes and
lets go of a checkpoint folder, and (for a new callback of an ended run's
name) claims the name again. Two tricks of `registry.folder` make that
cheaper for the training thread:

- frees left to the run's thread: a checkpoint folder's last descriptor
  closed, a folder set aside removed, the history bounded and the
  registry swept by the run's thread, not the training thread
  (`close_later`, `remove_later`, ``claim(sweep_later=True)``);
- take-over: a new callback of the name of an ended run of the same
  process takes that run's folder as it is, where a claim otherwise sets
  the folder aside and stages a new one (`_release_own(keep_folder=True)`).

Two more were retired on what this benchmark measured (2026-12-06, at
``f7c225b``, which still switches them; benchmarks/README.md has the
figures): empty files made ahead for the training thread's record
writes, and the records those writes replaced kept under a second name
for the run's thread to remove. Neither stood out of the noise.

Each trick is switched off here by patching it to do the plain thing (what
the package would do without it). Two loops of 2-batch fits, as code that
calls `fit` in a loop has them: one `ControlCallback` reused (a run each
fit), and a new `ControlCallback` of one name each fit. Each round runs
every variant once, in random order (all tricks on, each one off, all
off, and a plain `fit` for scale); reported: the whole `fit`'s median wall
time (what a user waits for) and the median of the per-round ratios to
"all on". "all on, again" is all on a second time, with runs of its own
name: how far two identical variants differ here, the noise a trick's
figure must stand out of. The order is drawn anew each round (see
`shuffled_rounds`).

Usage::

    python benchmarks/registry_tricks.py --backend jax      # ~1 min: 200 rounds
    python benchmarks/registry_tricks.py --quick            # a smoke run
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common.prepare_environment()

BATCH_SIZE = 32
FEATURES = 32
TRICKS = ("frees left to the run's thread", "take-over")


def trick_off(trick: str) -> contextlib.AbstractContextManager:
    """A context in which `trick` is switched off (patched to do the plain thing)."""
    from jupyter_traincontrol.registry import folder as folder_module
    from jupyter_traincontrol.registry.tombstones import remove_old_tombstones

    RunFolder = folder_module.RunFolder
    stack = contextlib.ExitStack()

    def patch(owner, name, value):
        original = getattr(owner, name)
        setattr(owner, name, value)
        stack.callback(setattr, owner, name, original)
        return original

    if trick == "frees left to the run's thread":
        claim = RunFolder.__dict__["claim"].__func__

        def remove_now(self, trash, prune_history=False):
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
            if prune_history:
                remove_old_tombstones(self.path.parent)

        patch(RunFolder, "close_later", lambda self, fd: os.close(fd))
        patch(RunFolder, "remove_later", remove_now)
        patch(RunFolder, "claim", classmethod(lambda cls, name, root=None, run_id=None, *, sweep_later=False:
                                              claim(cls, name, root, run_id, sweep_later=False)))
    elif trick == "take-over":
        release_own = folder_module._release_own
        patch(folder_module, "_release_own", lambda folder, heir, only_ended, keep_folder=False:
              not keep_folder and release_own(folder, heir, only_ended))
    else:
        raise ValueError(f"Unknown trick {trick!r}. Expected one of: {', '.join(TRICKS)}.")
    return stack


@contextlib.contextmanager
def tricks_off(tricks) -> None:
    """Switches each of `tricks` off for the block."""
    with contextlib.ExitStack() as stack:
        for trick in tricks:
            stack.enter_context(trick_off(trick))
        yield


def shuffled_rounds(variants, rounds: int, warmup: int, seed: int) -> dict[str, list[float]]:
    """Runs each of `variants` once a round, in a new random order each
    round; returns each one's values (after `warmup` rounds).

    Not a rotation: a run's thread ends after its `fit` returns, doing the
    chores its run left it, on the same two cores as the next `fit`. A
    rotation keeps each variant's neighbours; the one after the plain `fit`
    (which leaves nothing behind) would always start on a quiet machine.
    """
    import random

    order, results = random.Random(seed), {name: [] for name in variants}
    for index in range(warmup + rounds):
        names = list(variants)
        order.shuffle(names)
        for name in names:
            value = variants[name]()
            if index >= warmup:
                results[name].append(value)
    return results


def measure(args) -> dict[str, dict[str, list[float]]]:
    """Per loop (``reused``, ``new``), per variant, the seconds of each fit."""
    os.environ["KERAS_BACKEND"] = args.backend
    import numpy as np

    from jupyter_traincontrol import ControlCallback

    rng = np.random.default_rng(args.seed)
    x = rng.random((BATCH_SIZE * 2, FEATURES), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    model = _common.dense_model(FEATURES, [16, 16], seed=args.seed)
    variants = {"all on": (), "all on, again": (), **{f"{trick} off": (trick,) for trick in TRICKS}, "all off": TRICKS}
    results = {}
    with _common.scratch_folder(args.dir, "traincontrol-bench-tricks-") as scratch:
        # Each variant has runs of its own name (and folders): what one leaves behind (an ended run of
        # the name, a folder set aside) meets only its own next fit.
        names = {variant: f"bench-{index}" for index, variant in enumerate(variants)}
        reused = {variant: ControlCallback(save_at_end=False, name=f"{name}-reused", checkpoint_dir=scratch / name,
                                           verbose=False) for variant, name in names.items()}
        loops = {
            "reused": lambda variant: [reused[variant]],
            "new": lambda variant: [ControlCallback(save_at_end=False, name=f"{names[variant]}-new",
                                                    checkpoint_dir=scratch / names[variant], verbose=False)],
        }
        for loop, callbacks in loops.items():
            def timed(variant, callbacks=callbacks):
                with tricks_off(variants.get(variant, ())):
                    chosen = callbacks(variant) if variant in variants else []
                    begin = time.perf_counter()
                    model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0, callbacks=chosen)
                    return time.perf_counter() - begin

            runs = {name: functools.partial(timed, name) for name in [*variants, "plain fit"]}
            results[loop] = shuffled_rounds(runs, args.rounds, warmup=2 if args.quick else 20, seed=args.seed)
    return results


def main(argv=None) -> int:
    parser = _common.make_parser(__doc__, rounds=200, quick_rounds=3)
    _common.add_backend_option(parser)
    args = _common.parse_args(parser, argv)
    results = measure(args)
    summary = []
    for loop, runs in results.items():
        ratios = _common.paired_ratios(runs, "all on")
        on = _common.median(runs["all on"])
        print(f"\n{loop}: {'one ControlCallback reused' if loop == 'reused' else 'a new ControlCallback each fit'}, "
              f"{args.rounds} rounds of 2-batch fits on {args.backend}")
        _common.print_table(
            ["variant", "ms a fit", "- all on (ms)", "x all on"],
            [[name, _common.median(values) * 1e3, (_common.median(values) - on) * 1e3,
              _common.median(ratios[name])] for name, values in runs.items()])
        summary.append(f"{loop}: all on {on * 1e3:.2f} ms, all off {_common.median(ratios['all off']):.3f}x, "
                       f"plain fit {_common.median(runs['plain fit']) * 1e3:.2f} ms")
    _common.print_summary(f"registry_tricks: {args.backend}: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
