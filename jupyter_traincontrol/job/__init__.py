"""A multi-process job (JAX, or torch.distributed) as one run (optional; imports neither unless it runs in one).

Imports run one way: `job` composes the parts; `agreement`, `liveness`,
`checkpoints` and `signals` work through `coordination` (the key-value
store) only.

- `coordination`: the keys of one `fit`, and waits a lost process ends.
- `agreement`: commands proposed by one process, applied by all at one step.
- `liveness`: heartbeats, the verdict that a process was lost, a way out.
- `checkpoints`: process 0 writes, the others wait for its word.
- `signals`: SIGTERM on any process is an agreed stop.
- `job`: `Job`, one process's part, composing the parts above.
- `port`: `JobRun`, what the job uses of its run.
- `runtime`: `current_job`, the job of this process (JAX's distributed runtime, or a torch process group).
- `torch_store`: a torch process group's store, as `coordination` reads one.
- `receipts`: what every process did with a command, told to its sender.
"""

from .coordination import JobLostError
from .job import JOB_REGISTRY, Job
from .port import JobRun
from .runtime import current_jax_job, current_job, current_torch_job

__all__ = ["JOB_REGISTRY", "Job", "JobLostError", "JobRun", "current_job", "current_jax_job", "current_torch_job"]
