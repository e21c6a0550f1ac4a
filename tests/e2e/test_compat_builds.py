"""Builds with the patches of other libraries (transforms.compat): put in when a build runs, changing none of its
output; left out, the build still runs; a Beam without a correctness patch's target refuses the build in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from apache_beam.runners.worker import statesampler

from transforms import compat
from transforms.compat import beam as beam_patches

from conftest import REPO

_BUILD = """
import json, sys
from transforms import compat
compat.disable(*json.loads(sys.argv[2]))
for name, purpose in json.loads(sys.argv[3]).items():  # a faked Beam for a patch: its target gone
    import dataclasses
    from transforms.compat import beam
    for attr, patch in vars(beam).items():
        if isinstance(patch, compat.Patch) and patch.name == name:
            setattr(beam, attr, dataclasses.replace(patch, present=lambda: False))
from pipelines.build import main
code = main(["--config", sys.argv[1], "--quiet"])
from transforms.compat import patches
print(json.dumps({"code": code, "in": sorted(n for n, done in patches._DONE.items() if done)}))
"""


def _build(small_archive, tmp_path, name: str, disabled=(), gone=()) -> tuple[dict, subprocess.CompletedProcess]:
    config = {
        "input": {"paths": [str(small_archive / "*.nc")], "concat_dim": "time"},
        "variables": ["t"],
        "sample": {"window": {"lat": 9, "lon": 9}, "keep": ["level"]},
        "output": {"path": str(tmp_path / name), "num_shards": 2},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    args = [str(path), json.dumps(list(disabled)), json.dumps(dict.fromkeys(gone, ""))]
    run = subprocess.run([sys.executable, "-c", _BUILD, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = run.stdout.splitlines()
    return (json.loads(lines[-1]) if lines else {}), run


def test_a_build_without_its_speed_patches_writes_the_same_shards(small_archive, tmp_path):
    speed = [p.name for p in compat.every_patch() if p.purpose == compat.SPEED]
    patched, run = _build(small_archive, tmp_path, "patched")
    assert patched.get("code") == 0, run.stderr[-2000:]
    assert {"dask-on-demand", "dofn-specs-once", "sample-often", "options-views-once"} <= set(patched["in"])
    assert {"no-timed-flush", "watched-worker-processes"} <= set(patched["in"])  # the local runner's
    plain, run = _build(small_archive, tmp_path, "plain", disabled=speed)
    assert plain.get("code") == 0, run.stderr[-2000:]
    assert not set(plain["in"]) & set(speed)
    shards = sorted(p.relative_to(tmp_path / "patched") for p in (tmp_path / "patched").rglob("*.tfrecord*"))
    assert shards
    for shard in shards:
        assert (tmp_path / "patched" / shard).read_bytes() == (tmp_path / "plain" / shard).read_bytes(), shard


def test_a_beam_without_the_worker_handler_a_local_build_watches_refuses_the_build_in_one_line(small_archive, tmp_path):
    result, run = _build(small_archive, tmp_path, "refused", gone=[beam_patches.WATCHED_WORKERS.name])
    assert result.get("code") == 2, run.stdout + run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
    assert errors[0].startswith("error: apache-beam ") and "SubprocessSdkWorkerHandler" in errors[0]
    assert "pip install 'apache-beam==2.77.0'" in errors[0]
    assert not (tmp_path / "refused" / "schema.json").exists()


def test_a_local_build_runs_its_bundles_samplers_at_the_short_period(tmp_path, monkeypatch):
    """Through the command line, as a user runs it: the build's bundles were made with the short period."""
    from pipelines.build import main

    start = statesampler.StateSampler.__init__
    monkeypatch.setattr(start, "__defaults__", (statesampler.DEFAULT_SAMPLING_PERIOD_MS,))
    monkeypatch.setattr(beam_patches, "SAMPLE_OFTEN", _fresh_sample_often())
    periods = []
    made = statesampler.StateSampler.start

    def start_and_note(sampler):
        periods.append(sampler.sampling_period_ms)
        made(sampler)

    monkeypatch.setattr(statesampler.StateSampler, "start", start_and_note)
    monkeypatch.chdir(tmp_path)  # (the demo writes its archive here)
    assert main(["--output", str(tmp_path / "demo-output"), "--quiet"]) == 0
    assert periods and set(periods) == {beam_patches.SAMPLING_PERIOD_MS}


def _fresh_sample_often():
    """The sampler's patch as if not yet put in (this test process may have put it in, and its monkeypatch undone)."""
    import dataclasses

    return dataclasses.replace(beam_patches.SAMPLE_OFTEN, name="sample-often-in-this-build")
