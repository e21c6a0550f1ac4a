"""A shuffled_stream state resumes on the output it was taken on (or a copy), never on a rebuild with another seed."""

from __future__ import annotations

import shutil
from itertools import islice

import pytest

from pipelines.build import main
from schemas import UserError, shuffled_stream

from conftest import REPO


@pytest.fixture(scope="module")
def demo_outputs(tmp_path_factory):
    """configs/demo.yaml's output and its rebuild with --seed 5: the same samples, as many, in another order."""
    work = tmp_path_factory.mktemp("resume")
    config = str(REPO / "configs" / "demo.yaml")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        assert main(["--quiet"]) == 0  # the demo: its archive (demo/era5) and configs/demo.yaml's output
        assert main(["--config", config, "--output", "b", "--seed", "5", "--quiet"]) == 0
    return work / "demo" / "patches", work / "b"


def keys(samples) -> list[tuple]:
    return [(int(s["index/time"]), float(s["coord/lat"][0]), float(s["coord/lon"][0])) for s in samples]


def test_a_state_is_refused_on_a_rebuild_with_another_seed(demo_outputs):
    a, b = demo_outputs
    stream = shuffled_stream(str(a), "data", seed=1)
    assert len(keys(islice(stream, 300))) == 300
    # Resumed there, 165 samples of the epoch came twice and 165 never.
    with pytest.raises(UserError, match=r"state: taken on another output than .*b \(or on a build of it with another"):
        shuffled_stream(str(b), "data", seed=1, state=stream.state())


def test_a_state_resumes_on_a_copy_of_its_output_sample_for_sample(demo_outputs, tmp_path):
    a, _ = demo_outputs
    n = len(shuffled_stream(str(a), seed=1).source)
    whole = keys(islice(shuffled_stream(str(a), seed=1), n))
    stream = shuffled_stream(str(a), seed=1)
    head = keys(islice(stream, 300))
    shutil.copytree(a, tmp_path / "copy")
    tail = keys(islice(shuffled_stream(str(tmp_path / "copy"), seed=1, state=stream.state()), n - 300))
    assert head + tail == whole and len(set(whole)) == n
