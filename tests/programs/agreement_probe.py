"""The agreement of a one-process JAX job, with the real coordination service.

Usage: ``python agreement_probe.py PORT``. A watcher thread blocks on the next
proposal for up to a minute; the main thread puts an end marker in the
sequence (what ending a `fit` does), then proposes ``save``; then a ``pause``
and a ``save`` while the step the pause is due at runs. Prints one JSON line:
what the blocked read returned and how long it waited, the request received
after the marker, and the requests due at the pause's step and the next.
"""

import json
import sys
import threading
import time

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{sys.argv[1]}", num_processes=1, process_id=0)

from jax._src import distributed  # noqa: E402

from jupyter_traincontrol.job.agreement import Agreement  # noqa: E402
from jupyter_traincontrol.job.coordination import Coordination  # noqa: E402
from jupyter_traincontrol.protocol import parse_request  # noqa: E402

BLOCK_SECONDS = 60

kv = Coordination(distributed.global_state.client)
kv.begin("probe")
agreement = Agreement(kv, 0, 1, agree_timeout=10)
woken = {}


def watch():
    begin = time.monotonic()
    woken["received"] = agreement.receive(BLOCK_SECONDS)
    woken["waited"] = time.monotonic() - begin


watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
time.sleep(0.3)  # the watcher is blocked in its read by now
agreement.mark_ended()
watcher.join(BLOCK_SECONDS + 10)
agreement.propose(parse_request("save #probe-1"))
after = agreement.receive(10)
request = agreement.pop_due(10**6)

# A job that pauses at the end of step 21: its training thread has begun that step, the pause is due
# there. A save proposed meanwhile is agreed for step 21 too (the process acts there, and holds there
# while paused), not for step 22, which would never come while the job is paused.
agreement.dispatched = 20
agreement.propose(parse_request("pause #probe-2"))
agreement.receive(10)
agreement.dispatched = 21
agreement.propose(parse_request("save #probe-3"))
agreement.receive(10)
at_21 = [str(due) for due in iter(lambda: agreement.pop_due(21), None)]
print(json.dumps({**woken, "block_seconds": BLOCK_SECONDS, "after_marker": after,
                  "request": None if request is None else [str(request), request.request_id],
                  "due_at_21": at_21, "due_at_22": [str(due) for due in iter(lambda: agreement.pop_due(22), None)]}),
      flush=True)
jax.distributed.shutdown()
