"""Jobs across processes (the documented import path): see `jupyter_traincontrol.job`."""

from .job import JOB_REGISTRY, Job, JobLostError, current_job

__all__ = ["JOB_REGISTRY", "Job", "JobLostError", "current_job"]
