"""A stopped launcher cancels its remote job, and waits for it, before removing files; no missing shard is committed."""

from __future__ import annotations

import pytest
from apache_beam.runners.dataflow.dataflow_runner import DataflowPipelineResult
from apache_beam.runners.runner import PipelineState
from google.cloud import dataflow

from pipelines import graph, remote_job, stopping
from pipelines.remote_job import RemoteJob
from planning.run.manifest import ShardRule, build_manifest
from schemas.errors import UserError
from schemas.schema import Shard
from transforms.finalize import _check_shards_exist

JOB = "2026-12-01_09_00_00-123"
RUNNING, CANCELLING, CANCELLED = (
    dataflow.JobState.JOB_STATE_RUNNING,
    dataflow.JobState.JOB_STATE_CANCELLING,
    dataflow.JobState.JOB_STATE_CANCELLED,
)


class DataflowService:
    """Dataflow's API as the result object calls it (no Dataflow is reachable here): a job that cancels slowly."""

    def __init__(self, states_after_cancel=(CANCELLING, CANCELLING, CANCELLED), accepts=True):
        self.state, self.after, self.accepts, self.cancels = RUNNING, list(states_after_cancel), accepts, []

    def get_job(self, job_id):
        if self.cancels and self.after:
            self.state = self.after.pop(0)
        return dataflow.Job(id=job_id, current_state=self.state)

    def modify_job_state(self, job_id, new_state):
        self.cancels.append((job_id, new_state))
        return self.accepts


def dataflow_job(service: DataflowService) -> RemoteJob:
    runner = type("Runner", (), {"dataflow_client": service})()
    return RemoteJob(DataflowPipelineResult(dataflow.Job(id=JOB, current_state=RUNNING), runner), "DataflowRunner")


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    monkeypatch.setattr(remote_job, "POLL", 0.01)


def test_a_dataflow_job_is_cancelled_once_and_waited_for_until_it_has_stopped():
    service = DataflowService()
    job = dataflow_job(service)
    assert job.name == f"the DataflowRunner job {JOB}"
    assert not job.ended()
    assert job.stop()
    assert service.cancels == [(JOB, "JOB_STATE_CANCELLED")]
    assert job.result.state == PipelineState.CANCELLED and job.ended() and job.problem is None
    assert job.stop() and len(service.cancels) == 1  # the clean-up asks again: an ended job is not cancelled twice


def test_a_job_that_refuses_to_be_cancelled_is_reported_and_its_files_are_left(tmp_path, monkeypatch):
    job = dataflow_job(DataflowService(accepts=False))
    assert not job.stop()
    assert job.problem.startswith(f"could not cancel the DataflowRunner job {JOB} (Failed to cancel job {JOB}")
    # The launcher's clean-up then removes nothing the job may still write ...
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"written by the job")
    manifest = build_manifest("0123456789ab", [ShardRule("train", 1)])
    monkeypatch.setattr(stopping, "_job", job)
    assert graph._remove_run_files(str(tmp_path), manifest, None)
    assert (tmp_path / "train-00000-of-00001.tfrecord").read_bytes() == b"written by the job"
    # ... and its last line says so, and what to do.
    line = stopping.stopped_line(2)
    assert line.startswith(f"error: interrupted; could not cancel the DataflowRunner job {JOB} (Failed to cancel"), line
    assert line.endswith(
        "cancel it yourself; its files were left, and the output is not complete (--overwrite "
        "removes them once it has stopped)"
    ), line


def test_a_job_that_does_not_stop_in_time_is_reported():
    job = dataflow_job(DataflowService(states_after_cancel=[CANCELLING] * 1000))
    assert not job.stop(wait=0.05)
    assert job.problem == f"the DataflowRunner job {JOB} did not stop within 0 s of being cancelled"


def test_an_unreachable_service_counts_as_running():
    service = DataflowService()
    service.get_job = lambda job_id: (_ for _ in ()).throw(ConnectionError("no route to dataflow.googleapis.com"))
    job = dataflow_job(service)
    assert not job.ended() and not job.stop()
    assert "no route to dataflow.googleapis.com" in job.problem


def test_finalize_commits_no_shard_that_is_missing_or_of_another_size(tmp_path):
    (tmp_path / "a.tfrecord").write_bytes(b"x" * 10)
    _check_shards_exist(str(tmp_path), [Shard("a.tfrecord", 1, 10, 1)])
    with pytest.raises(UserError, match=r"shard .*a.tfrecord holds 10 bytes where 12 were written"):
        _check_shards_exist(str(tmp_path), [Shard("a.tfrecord", 1, 12, 1)])
    with pytest.raises(UserError, match=r"shard .*b.tfrecord is missing .* schema.json was not written"):
        _check_shards_exist(str(tmp_path), [Shard("a.tfrecord", 1, 10, 1), Shard("b.tfrecord", 1, 10, 1)])
