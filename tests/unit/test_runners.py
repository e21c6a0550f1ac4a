"""What a remote build sends its workers: this checkout's setup.py and, with it, the worker set it installs."""

from __future__ import annotations

import gc
import shutil
import tempfile
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import preflight, runners
from schemas.errors import UserError

from conftest import REPO

DATAFLOW = ["--runner=DataflowRunner", "--project=p", "--region=us-central1", "--temp_location=gs://b/tmp"]
SETUP = f"--setup_file={REPO / 'setup.py'}"
WORKER_SET = f"--requirements_file={REPO / 'worker-requirements.txt'}"


def _added(args: list[str]) -> list[str]:
    return runners.with_runner_defaults(args)[len(args) :]


def test_dataflow_gets_the_checkout_and_the_worker_set():
    assert _added(DATAFLOW) == [SETUP, WORKER_SET, "--requirements_cache=skip"]
    # The README's commands pass --setup_file themselves: the worker set goes with it.
    assert _added([*DATAFLOW, SETUP]) == [WORKER_SET, "--requirements_cache=skip"]
    assert _added([*DATAFLOW, SETUP, "--requirements_cache=/tmp/cache"]) == [WORKER_SET]
    # Beam's other staging runners (Flink, Spark, a job server) install the setup file the same way.
    assert _added(["--runner=PortableRunner", SETUP]) == [WORKER_SET, "--requirements_cache=skip"]


@pytest.mark.parametrize(
    "flags",
    [
        ["--sdk_container_image=gcr.io/p/xarray-tfrecords:0.1.0"],  # the Dockerfile's image has the worker set
        [SETUP, "--sdk_container_image=gcr.io/p/xarray-tfrecords:0.1.0"],
        [SETUP, "--requirements_file=mine.txt"],  # the user's own: preflight checks it
        ["--extra_package=dist/xarray_tfrecords-0.1.0.tar.gz"],
    ],
)
def test_nothing_is_added_where_the_user_chose_how_workers_get_their_packages(flags):
    assert _added([*DATAFLOW, *flags]) == []


def test_no_worker_set_for_runners_that_stage_nothing_or_for_another_project(tmp_path):
    assert _added(["--runner=DaskRunner", "--dask_npartitions=4", SETUP]) == []
    assert "--requirements_file" not in " ".join(_added([SETUP]))  # local: the workers are this machine's
    other = tmp_path / "setup.py"
    other.write_text('from setuptools import setup\nsetup(name="mine")\n')
    shutil.copy(REPO / "worker-requirements.txt", tmp_path)
    assert _added([*DATAFLOW, f"--setup_file={other}"]) == []


def _check(*flags: str) -> None:
    preflight._check_worker_requirements(PipelineOptions([*DATAFLOW, SETUP, *flags]))


def test_a_requirements_file_of_the_users_own_must_list_the_worker_set(tmp_path):
    mine = tmp_path / "requirements.txt"
    mine.write_text("scikit-learn>=1.5\nxarray\n")
    with pytest.raises(UserError) as refused:
        _check(f"--requirements_file={mine}")
    message = str(refused.value)
    assert "\n" not in message and f"--requirements_file={mine} lacks" in message
    assert "netCDF4" in message and "xarray" not in message.split("run (")[1].split(")")[0]
    assert "apache-beam" not in message  # the worker image's own
    assert "worker-requirements.txt to it" in message and "--sdk_container_image" in message
    with pytest.raises(UserError, match="cannot read it"):
        _check(f"--requirements_file={tmp_path / 'missing.txt'}")


def test_a_requirements_file_with_the_worker_set_passes(tmp_path):
    mine = tmp_path / "requirements.txt"
    # Other spellings of the same names, comments and options are what pip accepts too.
    lines = (REPO / "worker-requirements.txt").read_text().replace("PyYAML", "pyyaml").replace("netCDF4", "netcdf4")
    mine.write_text(f"--extra-index-url https://example.invalid/simple\nscikit-learn  # mine\n{lines}")
    _check(f"--requirements_file={mine}")
    _check(f"--requirements_file={mine}", "--sdk_container_image=gcr.io/p/image")
    _check(WORKER_SET)


def test_run_options_keep_one_view_per_class_and_share_every_value():
    import pickle

    from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions

    options = runners.RunOptions(["--runner=DirectRunner", "--project=p"])
    standard = options.view_as(StandardOptions)
    assert options.view_as(StandardOptions) is standard  # made once, not at every call
    standard.runner = "DataflowRunner"  # written through a view: every view and the options see it
    assert options.view_as(GoogleCloudOptions).view_as(StandardOptions).runner == "DataflowRunner"
    assert options.get_all_options()["runner"] == "DataflowRunner"
    assert options.view_as(GoogleCloudOptions).project == "p"
    # The views stay behind when the options travel; the values go, and views are made again there.
    copied = pickle.loads(pickle.dumps(options))
    assert "_views" not in copied.__dict__
    assert copied.view_as(StandardOptions).runner == "DataflowRunner"
    assert PipelineOptions.from_dictionary(options.get_all_options()).view_as(GoogleCloudOptions).project == "p"


class _SlowToPickle:
    """An element whose encoding runs Python code for a while: the GIL goes to other threads meanwhile."""

    def __init__(self, number: int):
        self.number = number

    def __reduce__(self):
        import time

        time.sleep(0.3)
        return (_SlowToPickle, (self.number,))


def test_the_local_runners_threads_send_whole_elements_however_long_they_take_to_encode():
    """Beam's in-process workers flushed their output every second from a timer, cutting an element in two.

    Beam alone, with this pipeline: values came back as None (else "Invalid PaneInfoEncoding", or a decode
    that looped until a test worker held 22 GB). Every element here takes 0.3 s to encode, a few per bundle.
    """
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    options = runners.RunOptions(["--direct_num_workers=2", "--direct_running_mode=multi_threading"])
    with beam.Pipeline(runner=runners.make_runner(options), options=options) as pipeline:
        grouped = (
            pipeline
            | beam.Create(range(12))
            | beam.Reshuffle()
            | beam.Map(lambda i: (i % 2, _SlowToPickle(i)))
            | beam.GroupByKey()
            | beam.MapTuple(lambda key, values: (key, sorted(v.number for v in values)))
        )
        assert_that(grouped, equal_to([(0, [0, 2, 4, 6, 8, 10]), (1, [1, 3, 5, 7, 9, 11])]))


def test_a_pipeline_made_and_never_run_leaves_no_folder_in_the_temp_directory(tmp_path, monkeypatch):
    """Beam makes a folder in the system's temp directory for every pipeline and only its run removes it: a build
    or reassembly refused, failed or dry before its run would leave one behind each time."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pipeline = runners.new_pipeline(runners.RunOptions([]))
    folder = Path(pipeline.local_tempdir)
    assert folder.parent == tmp_path and folder.is_dir()
    del pipeline
    gc.collect()  # (as a built pipeline, in reference cycles, would need)
    assert not folder.exists()
    beams_own = beam.Pipeline()  # the control: what Beam leaves
    left = Path(beams_own.local_tempdir)
    del beams_own
    gc.collect()
    assert left.is_dir()


@pytest.mark.parametrize(
    ("code", "how"),
    [
        (-9, "killed by SIGKILL, as the out-of-memory killer ends a process"),
        (-11, "killed by SIGSEGV"),
        (3, "exit code 3"),
    ],
)
def test_a_dead_worker_process_is_named_by_how_it_ended(code, how):
    """From the error Beam raises when a worker process exits with an error (its local_job_service's words)."""
    error = RuntimeError(f"Worker subprocess exited with return code {code}")
    assert runners.worker_death(error) == f"a worker process of the local runner died ({how})"
