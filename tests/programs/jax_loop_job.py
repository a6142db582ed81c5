"""One process of a JAX job running a `TrainLoop` (for tests/test_loop_jobs.py).

    python jax_loop_job.py PROCESS NUM_PROCESSES PORT NAME CHECKPOINT_DIR

Process 0 prints ``READY NAME FIFO`` once it has trained an item; every
process prints ``RESULT {json}`` after the loop's ``with`` block (its
process, state, items trained, epoch, step, checkpoints, the weights' sum).
The state is the user's own (``save=``/``load=``): process 0 writes it.
"""

import json
import sys
import time

process, processes, port, name, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=processes, process_id=process)

import numpy as np  # noqa: E402

from jupyter_traincontrol import TrainLoop  # noqa: E402

weights = {"w": np.zeros(4, dtype="float32")}


def save(path):
    np.save(path / "w.npy", weights["w"])


def load(path):
    weights["w"] = np.load(path / "w.npy")


step = jax.jit(lambda w: w + 0.5 * jax.numpy.ones_like(w))
trained = 0
with TrainLoop(name=name, checkpoint_dir=folder, save=save, load=load) as loop:
    for epoch in loop.epochs(1000):
        for item in loop.batches(range(8)):
            weights["w"] = np.asarray(step(weights["w"]))
            loop.log(loss=float(weights["w"].sum()))
            trained += 1
            if trained == 1 and process == 0:
                print(f"READY {loop.name} {loop.fifo}", flush=True)
            time.sleep(0.02)
print("RESULT " + json.dumps({"rank": process, "state": loop.state, "ended_by": str(loop.ended_by),
                              "trained": trained, "epoch": loop.epoch, "step": loop.step,
                              "weights": float(weights["w"].sum()),
                              "checkpoints": [str(path) for path in loop.checkpoints]}), flush=True)
