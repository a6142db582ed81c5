"""A real fit whose second save hits RLIMIT_FSIZE (as a full disk would).

Usage: python fit_under_file_size_limit.py CHECKPOINT_FOLDER. Prints one JSON
line: the run's final state, its errors, whether it trained on after the
failed save, the folder's files and its checkpoints.
"""

import json, os, resource, signal, sys, threading
import numpy as np
from helpers import At, EventLog, build_model, wait_until
from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.transport.channels import deliver
from jupyter_traincontrol.protocol import Command

WAIT = 60  # seconds: the first save and the steps, under a loaded test run
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death, as for a full disk
log = EventLog()
control = ControlCallback(name="fsize", checkpoint_dir=sys.argv[1], verbose=False)
control.lifecycle.add_listener(log)
trained_after = []

def script():
    try:
        steps()
    except BaseException:
        control.lifecycle.channel.inject(Command.ABORT)
        raise

def steps_trained():
    progress = control.lifecycle.progress
    return progress.step + 8 * progress.epoch  # 8 batches an epoch

def steps():
    deliver(control.fifo, "save")
    log.wait_count("checkpoint", None, 1, timeout=WAIT)
    size = os.path.getsize(control.checkpoints[0])
    resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, resource.RLIM_INFINITY))
    deliver(control.fifo, "save")
    log.wait_count("error", None, 1, timeout=WAIT)
    started = steps_trained()
    wait_until(lambda: steps_trained() > started + 10, timeout=WAIT, message="10 steps after the failed save")
    trained_after.append(control.state)
    deliver(control.fifo, "stop")

x = np.random.default_rng(0).random((64, 3), dtype="float32")
start = lambda cb: threading.Thread(target=script, daemon=True).start()
build_model().fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=100000, verbose=0, callbacks=[control, At(0, 0, start)])
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(json.dumps({"state": control.state, "errors": log.messages("error"), "trained_after": trained_after,
                  "files": sorted(os.listdir(sys.argv[1])), "checkpoints": [str(p) for p in control.checkpoints]}))
