"""A job running on other machines (Dataflow, a Dask cluster): cancelled, and waited for, before its launcher cleans up.

A stopped launcher must not remove a run's files while the job still writes them: a job that
went on would commit a schema for shards that are gone, or leave files no manifest names. So
the stop cancels the job first and waits until none of it runs; only then are the files removed.
"""

from __future__ import annotations

import time

from apache_beam.runners.runner import PipelineResult, PipelineState

#: Seconds a stop waits for a cancelled job to end (Dataflow takes a minute or two to stop its workers).
STOP_WAIT = 300.0
#: Seconds between two looks at a cancelled job's state.
POLL = 1.0


def _dask_tasks_running(client) -> int:
    """Tasks the cluster's workers are executing: a cancelled Dask task runs to its end all the same."""
    busy = client.run(lambda dask_worker: len(dask_worker.state.executing))
    return sum(busy.values())


class RemoteJob:
    """The job of one build on a remote runner, as the launcher's stop handles it."""

    def __init__(self, result: PipelineResult, runner: str):
        self.result = result
        self.runner = runner
        self.problem: str | None = None  # why the job could not be stopped, once a stop failed

    @property
    def name(self) -> str:
        job_id = getattr(self.result, "job_id", None)
        return f"the {self.runner} job {job_id()}" if callable(job_id) else f"the {self.runner} job"

    def ended(self) -> bool:
        """Whether nothing of the job runs any more (finished, failed or cancelled, and its tasks done)."""
        try:
            client = getattr(self.result, "client", None)
            if client is not None:
                return all(f.done() for f in self.result.futures) and not _dask_tasks_running(client)
            return PipelineState.is_terminal(self.result.state)
        except Exception:  # the service cannot say: assume it runs (its files are then left alone)
            return False

    def stop(self, wait: float = STOP_WAIT) -> bool:
        """Cancel the job and wait until none of it runs; whether it did (else ``problem`` says why)."""
        try:
            if not self.ended():
                self.result.cancel()
            deadline = time.monotonic() + wait
            while not self.ended():
                if time.monotonic() >= deadline:
                    self.problem = f"{self.name} did not stop within {wait:.0f} s of being cancelled"
                    return False
                time.sleep(POLL)
            return True
        except Exception as error:
            self.problem = f"could not cancel {self.name} ({' '.join(str(error).split()) or type(error).__name__})"
            return False
