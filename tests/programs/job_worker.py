"""One process of a multi-process JAX job under `ControlCallback` (for tests/test_distributed.py).

    python job_worker.py PROCESS NUM_PROCESSES PORT NAME CHECKPOINT_DIR LOG [--epochs N] [--batch-sleep S]
                         [--lost-after S] [--no-preemption-service] [--resume] [--end-work PROCESS:S ...]
                         [--async-hooks] [--no-save-at-end]

Appends one JSON line per event to LOG.PROCESS: each command this process
applied with the batch boundary it applied it at, its final state as its
own record has it (``final``: state, error, lost process), then its RESULT
if `fit` returned.
"""

import argparse
import faulthandler
import json
import os
import signal
import time

faulthandler.register(signal.SIGUSR1, all_threads=True)  # a test that times out dumps every thread's stack

os.environ["KERAS_BACKEND"] = "jax"
parser = argparse.ArgumentParser()
parser.add_argument("process", type=int)
parser.add_argument("processes", type=int)
parser.add_argument("port")
parser.add_argument("name")
parser.add_argument("checkpoint_dir")
parser.add_argument("log")
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--batch-sleep", type=float, default=0.01)
parser.add_argument("--lost-after", type=float, default=5.0)
parser.add_argument("--exit-grace", type=float, default=5.0)
parser.add_argument("--no-preemption-service", action="store_true", help="SIGTERM handled by our own handler")
parser.add_argument("--resume", action="store_true")
parser.add_argument("--end-work", action="append", default=[], metavar="PROCESS:SECONDS",
                    help="that process works this long at the end of the last epoch, before the control's hook")
parser.add_argument("--no-save-at-end", action="store_true",
                    help="no checkpoint when fit ends (in a job every process takes part in it, so none ends first)")
parser.add_argument("--async-hooks", action="store_true",
                    help="every callback async-safe: Keras runs batch-end hooks on its pool, the training thread runs ahead")
args = parser.parse_args()

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
if args.no_preemption_service:
    jax.config.update("jax_enable_preemption_service", False)
# JAX's own verdict on a hung process (it aborts every process, SIGABRT) comes well after the job's (lost_after,
# then exit_grace: about 11 s here), even on a loaded machine: the job's way out is what the tests check.
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.processes,
                           process_id=args.process, heartbeat_timeout_seconds=60)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from jupyter_traincontrol import ControlCallback  # noqa: E402
from jupyter_traincontrol.distributed import current_job  # noqa: E402

keras.utils.set_random_seed(0)  # the same initial weights in every process
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
rng = np.random.default_rng(0)
x = rng.random((256, 3), dtype="float32")
y = x.sum(axis=1, keepdims=True)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)  # one global batch, whatever the process count
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")

log = open(f"{args.log}.{args.process}", "a", buffering=1)
control = ControlCallback(name=args.name, checkpoint_dir=args.checkpoint_dir, resume=args.resume, verbose=False,
                          save_at_end=not args.no_save_at_end,
                          job=current_job(lost_after=args.lost_after, exit_grace=args.exit_grace))


def note(lifecycle, event):
    if event is not None and event["kind"] in ("command", "state", "error"):
        log.write(json.dumps({"kind": event["kind"], "message": event["message"], "boundary": control.session.progress.boundary}) + "\n")
    if event is not None and event["kind"] == "state" and lifecycle.ended is not None:
        record = lifecycle.record()
        log.write(json.dumps({"kind": "final", "state": record["state"], "error": lifecycle.error,
                              "lost_process": record.get("lost_process"), "processes": record.get("processes")}) + "\n")


class Pace(keras.callbacks.Callback):
    async_safe = args.async_hooks

    def __init__(self):
        super().__init__()
        self.ready = False

    def on_train_batch_end(self, batch, logs=None):
        if not self.ready:
            self.ready = True
            control.lifecycle.add_listener(note)
            print(f"READY {control.name} {control.fifo}", flush=True)
        time.sleep(args.batch_sleep)


END_WORK = {int(process): float(seconds) for process, seconds in (item.split(":") for item in args.end_work)}


class EndWork(keras.callbacks.Callback):
    """Work at the end of the last epoch (chief-only logging, an evaluation), before the control's hook."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch == args.epochs - 1 and END_WORK.get(args.process):
            log.write(json.dumps({"kind": "end-work"}) + "\n")
            time.sleep(END_WORK[args.process])


history = model.fit(data, epochs=args.epochs, verbose=0, callbacks=[EndWork(), control, Pace()])
result = {"process": args.process, "state": str(control.state), "epochs": len(history.epoch),
          "sigterm_restored": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
          "optimizer_step": int(model.optimizer.iterations.numpy()), "boundary": control.session.progress.boundary,
          "checkpoints": [str(p) for p in control.checkpoints]}
log.write(json.dumps({"kind": "result", **result}) + "\n")
print("RESULT " + json.dumps(result), flush=True)
