"""Hydra launchers for SLURM (and the same code path locally) through
hydra-submitit-launcher, with checkpoint-and-requeue on preemption.

In a submitted job the run knows it is requeued (:data:`dreamer.run.stopping.REQUEUE_ENV`),
so a stop signal (SIGUSR1/2 before the time limit, SIGTERM on preemption)
makes the train loop checkpoint at its next safe point and return a
``finished_by="preempted"`` result, with submitit's handlers back in place.
The job then hands over to submitit's own requeue machinery by raising
submitit's preemption signal: submitit calls :meth:`checkpoint`, which
resubmits the same job with ``resume=<run dir>`` added, and requeues it
(``scontrol requeue`` on SLURM; a restart of the task under submitit_local).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from hydra.core.utils import JobStatus

from dreamer.run.result import RunResult
from dreamer.run.stopping import REQUEUE_ENV
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import (
    BaseSubmititLauncher,
    LocalLauncher,
    SlurmLauncher,
)

log = logging.getLogger("dreamer")


class _Requeueing(BaseSubmititLauncher):
    _resume_from: str | None = None

    def __call__(self, sweep_overrides, job_dir_key, job_num, job_id, singleton_state):
        before = os.environ.get(REQUEUE_ENV)
        os.environ[REQUEUE_ENV] = "1"  # read by dreamer's entry point, in this process
        try:
            result = super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
        finally:
            if before is None:
                os.environ.pop(REQUEUE_ENV, None)
            else:
                os.environ[REQUEUE_ENV] = before
        run = result._return_value if result.status == JobStatus.COMPLETED else None
        if isinstance(run, RunResult) and run.preempted:  # the run put submitit's handlers back
            import submitit

            self._resume_from = str(run.run_dir)
            log.info("requeueing job %s to resume from %s", job_num, self._resume_from)
            # submitit's handler now checkpoints (self.checkpoint) and requeues; it exits the process.
            signal.raise_signal(submitit.JobEnvironment._usr_sig())
        return result

    def checkpoint(self, sweep_overrides, *args: Any, **kwargs: Any) -> Any:
        """Called by submitit before requeueing: the same job, resuming the run."""
        import submitit

        overrides = list(sweep_overrides)
        if self._resume_from is not None:
            overrides = [o for o in overrides if not o.startswith("resume=")] + [f"resume={self._resume_from}"]
        return submitit.helpers.DelayedSubmission(self, overrides, *args, **kwargs)


class RequeueingSlurmLauncher(_Requeueing, SlurmLauncher):
    pass


class RequeueingLocalLauncher(_Requeueing, LocalLauncher):
    pass
