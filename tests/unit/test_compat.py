"""The patches of other libraries (transforms.compat): each target as the patch knows it, each patch's effect, the
version check that leaves a speed patch out and refuses a build whose correctness patch lost its target."""

from __future__ import annotations

import dataclasses
import gc
import inspect
import itertools
import logging

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.worker import statesampler
from apache_beam.transforms import userstate
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.utils.counters import CounterFactory

from schemas.errors import UserError
from transforms import compat
from transforms.compat import beam as beam_patches
from transforms.compat import options, patches, xarray_dask

from conftest import REPO

_fresh = itertools.count()


def fresh(patch: patches.Patch, **changes) -> patches.Patch:
    """``patch`` under a name of its own: put in afresh, whatever this process already put in."""
    return dataclasses.replace(patch, name=f"{patch.name}-test-{next(_fresh)}", **changes)


# --- every target, as each patch knows it ----------------------------------------------------------------------


@pytest.mark.parametrize("patch", compat.every_patch(), ids=lambda p: p.name)
def test_every_patch_finds_its_target_in_the_installed_libraries(patch):
    """Fails when a library changes what a patch changes: then the patch (or its range) must change too."""
    assert patches.in_range(patches.installed_version(patch.library), patch.written_for), patch.library
    if patch is beam_patches.SAMPLE_OFTEN and statesampler.StateSampler.__init__.__defaults__ != (
        statesampler.DEFAULT_SAMPLING_PERIOD_MS,
    ):
        return  # put in already by a build in this process: its own test below checks Beam's default
    assert patch.present(), f"{patch.target} is not as {patch.name} knows it"


@pytest.mark.parametrize("patch", compat.every_patch(), ids=lambda p: p.name)
def test_every_patch_was_tested_on_the_version_constraints_txt_pins_within_setup_pys_range(patch):
    pins = dict(
        line.split(";")[0].strip().split("==")
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line
    )
    assert pins[patch.library] == patch.tested
    assert patches.in_range(patch.tested, patch.written_for)
    assert patch.written_for.split(",")[0] in (REPO / "setup.py").read_text()  # (its lower bound is setup.py's)


def test_the_patches_are_named_once_and_install_puts_in_the_processes_own():
    names = [p.name for p in compat.every_patch()]
    assert len(set(names)) == len(names)
    compat.install()
    process_wide = (xarray_dask.DEFER_DASK, beam_patches.DOFN_SPECS, options.OPTIONS_VIEWS)
    assert all(patches._DONE.get(p.name) for p in process_wide)


# --- dofn-specs-once: Beam's look for state and timers in a DoFn, once per DoFn object ---------------------------


class _Plain(beam.DoFn):
    def process(self, element):
        yield element


class _Counting(beam.DoFn):
    COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())

    def process(self, element, count=beam.DoFn.StateParam(COUNT)):  # noqa: B008 (how Beam declares state)
        yield element


def test_beam_asks_for_dofn_specs_through_the_patched_name_with_one_dofn_argument():
    assert list(inspect.signature(userstate.get_dofn_specs).parameters) == ["dofn"]
    # Beam's stateful checks look the function up in their module at each call: a patched name is what they use.
    for asker in (userstate.is_stateful_dofn, userstate.validate_stateful_dofn):
        assert "get_dofn_specs" in asker.__code__.co_names, asker.__name__


def test_each_object_is_looked_over_once_while_it_lives():
    looked = []

    def look(dofn):
        looked.append(type(dofn).__name__)
        return userstate.get_dofn_specs(dofn)

    remembered = beam_patches.once_per_object(look)
    plain, counting = _Plain(), _Counting()
    for _ in range(3):
        assert remembered(plain) == (set(), set())
        assert {spec.name for spec in remembered(counting)[0]} == {"count"}
    assert looked == ["_Plain", "_Counting"]
    del plain
    gc.collect()
    assert remembered(_Plain()) == (set(), set()) and looked[-1] == "_Plain" and len(looked) == 3
    assert remembered(3) == remembered(3) and looked[-2:] == ["int", "int"]  # no weak reference: looked at each time


def test_installed_beam_still_sees_a_stateful_dofn():
    compat.install()
    compat.install()  # idempotent
    assert userstate.get_dofn_specs.__wrapped__ is not None  # in: Beam's own function, wrapped once
    assert not hasattr(userstate.get_dofn_specs.__wrapped__, "__wrapped__")
    counting, plain = _Counting(), _Plain()
    for _ in range(2):
        assert userstate.is_stateful_dofn(counting) and not userstate.is_stateful_dofn(plain)
    userstate.validate_stateful_dofn(counting)


# --- sample-often: Beam's state samplers, every 10 ms ----------------------------------------------------------


def test_beams_sampler_takes_its_period_as_a_keyword_defaulting_to_its_modules_constant():
    parameters = inspect.signature(statesampler.StateSampler.__init__).parameters
    assert list(parameters)[-1] == "sampling_period_ms"
    assert statesampler.DEFAULT_SAMPLING_PERIOD_MS == 200
    made = statesampler.StateSampler("default", CounterFactory(), sampling_period_ms=7)
    assert made.sampling_period_ms == 7


def test_a_bundles_sampler_samples_often_once_put_in_and_putting_it_in_again_changes_nothing(monkeypatch):
    start = statesampler.StateSampler.__init__
    monkeypatch.setattr(start, "__defaults__", (statesampler.DEFAULT_SAMPLING_PERIOD_MS,))  # (restored after)
    assert statesampler.StateSampler("before", CounterFactory()).sampling_period_ms == 200
    patch = fresh(beam_patches.SAMPLE_OFTEN)
    assert patches.put_in(patch) and patches.put_in(patch)
    assert statesampler.StateSampler("after", CounterFactory()).sampling_period_ms == 10
    assert statesampler.StateSampler("chosen", CounterFactory(), sampling_period_ms=50).sampling_period_ms == 50


def test_a_beam_whose_sampler_takes_its_period_otherwise_is_left_alone(monkeypatch, caplog):
    start = statesampler.StateSampler.__init__
    monkeypatch.setattr(start, "__defaults__", (123,))  # another release's default: not the one this patch knows
    with caplog.at_level(logging.DEBUG, logger=patches.__name__):
        assert not patches.put_in(fresh(beam_patches.SAMPLE_OFTEN))
    assert start.__defaults__ == (123,)
    assert "left out" in caplog.text


# --- options-views-once: one view per options class ------------------------------------------------------------


def test_beams_views_write_through_to_the_options_shared_dictionary():
    plain = PipelineOptions(["--runner=DirectRunner"])
    view = plain.view_as(StandardOptions)
    assert view._all_options is plain._all_options  # what makes one view per class enough
    view.runner = "DataflowRunner"
    assert plain.view_as(StandardOptions).runner == "DataflowRunner"
    made = options.RunOptions(["--runner=DirectRunner"])
    assert made.view_as(StandardOptions) is made.view_as(StandardOptions)


def test_options_left_unpatched_make_a_view_at_every_call(monkeypatch):
    monkeypatch.setattr(options, "OPTIONS_VIEWS", fresh(options.OPTIONS_VIEWS, written_for=">=99"))
    made = options.RunOptions(["--runner=DirectRunner"])
    assert made.view_as(StandardOptions) is not made.view_as(StandardOptions)  # as Beam's own
    assert made.view_as(StandardOptions).runner == "DirectRunner"


# --- emulator-credentials: no Google credentials looked for when a storage emulator stands in ------------------


def test_beams_credentials_are_looked_up_once_behind_the_flag_the_patch_sets():
    from apache_beam.internal.gcp import auth

    asked = auth._Credentials.get_service_credentials.__func__.__code__.co_names
    assert {"_credentials_lock", "_credentials_init", "_credentials"} <= set(asked)
    assert "_Credentials" in auth.get_service_credentials.__code__.co_names


def test_with_an_emulator_beam_finds_no_credentials_at_once_and_without_one_nothing_changes(monkeypatch):
    from apache_beam.internal.gcp import auth

    monkeypatch.setattr(auth._Credentials, "_credentials_init", False)  # (restored after)
    monkeypatch.setattr(auth._Credentials, "_credentials", None)
    monkeypatch.setattr(beam_patches, "EMULATOR_CREDENTIALS", fresh(beam_patches.EMULATOR_CREDENTIALS))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert not compat.use_anonymous_credentials_for_emulator()
    assert auth._Credentials._credentials_init is False
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    assert compat.use_anonymous_credentials_for_emulator()
    assert auth.get_service_credentials(PipelineOptions([])) is None  # answered, not looked for (~25 s)


# --- dask-on-demand: xarray's checks for dask arrays, without importing dask -----------------------------------


def test_xarray_checks_for_dask_through_the_names_the_patch_replaces():
    from xarray.namedarray import pycompat, utils

    assert list(inspect.signature(pycompat._get_cached_duck_array_module).parameters) == ["mod"]
    assert list(inspect.signature(utils.is_dask_collection).parameters) == ["x"]
    # xarray's own checks call them by these module-level names (else the patch would change nothing)
    assert "_get_cached_duck_array_module" in pycompat.array_type.__code__.co_names
    assert "is_dask_collection" in utils.is_duck_dask_array.__code__.co_names


def test_with_dask_not_imported_xarray_sees_no_dask_array_and_once_imported_sees_them(monkeypatch):
    import sys

    import numpy as np
    from xarray.namedarray import pycompat, utils

    patches.put_in(xarray_dask.DEFER_DASK)
    dask = sys.modules.get("dask")
    monkeypatch.delitem(sys.modules, "dask", raising=False)  # (put back after)
    assert pycompat.array_type("dask") == ()
    assert not utils.is_duck_dask_array(np.zeros(3))
    if dask is not None:
        monkeypatch.setitem(sys.modules, "dask", dask)
    da = pytest.importorskip("dask.array")  # (the [dask] extra: in the test install)

    assert utils.is_duck_dask_array(da.zeros(3))


# --- no-timed-flush and watched-worker-processes: the local runner's ------------------------------------------


def test_beams_embedded_worker_reads_its_flush_period_from_the_environments_config():
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    from apache_beam.transforms.environments import EmbeddedPythonGrpcEnvironment

    assert "data_buffer_time_limit_ms" in worker_handlers.EmbeddedGrpcWorkerHandler.__init__.__code__.co_consts
    config = EmbeddedPythonGrpcEnvironment.parse_config('{"data_buffer_time_limit_ms": 5}')
    assert config["data_buffer_time_limit_ms"] == 5


def test_the_watched_handler_overrides_methods_beams_worker_handler_has():
    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    handler = worker_handlers.SubprocessSdkWorkerHandler
    assert {"start_worker", "stop_worker"} <= set(vars(handler))
    assert list(inspect.signature(handler.__init__).parameters)[1] == "worker_command_line"
    worker = inspect.signature(local_job_service.SubprocessSdkWorker.__init__).parameters
    assert list(worker)[1:5] == ["worker_command_line", "control_address", "provision_info", "worker_id"]
    assert "environment" not in inspect.signature(worker_handlers.WorkerHandler.register_environment).parameters


def test_a_dead_workers_pending_instructions_are_answered_with_the_error():
    """Through a real control connection: the answer the runner waits for, with the error in it."""
    from apache_beam.portability.api import beam_fn_api_pb2
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    connection = worker_handlers.ControlConnection()
    requests = [beam_fn_api_pb2.InstructionRequest() for _ in range(2)]
    futures = [connection.push(request) for request in requests]  # (each given an id)
    beam_patches.fail_instructions(connection, "a worker process of the local runner died (exit code 3)")
    answers = [future.get(timeout=5) for future in futures]
    assert {answer.error for answer in answers} == {"a worker process of the local runner died (exit code 3)"}
    assert [a.instruction_id for a in answers] == [r.instruction_id for r in requests]


def test_a_local_runner_on_a_beam_without_the_worker_handler_it_watches_is_refused_in_one_line(monkeypatch):
    from pipelines import runners

    gone = fresh(beam_patches.WATCHED_WORKERS, present=lambda: False)
    monkeypatch.setattr(beam_patches, "WATCHED_WORKERS", gone)
    with pytest.raises(UserError) as refused:
        runners.make_runner(runners.RunOptions([]))
    line = str(refused.value)
    version = patches.installed_version("apache-beam")
    assert "\n" not in line and line.startswith(f"apache-beam {version}: ")
    assert "SubprocessSdkWorkerHandler" in line and "'apache-beam==2.77.0'" in line and "constraints.txt" in line


# --- the version check -----------------------------------------------------------------------------------------


def _probe(purpose: str, written_for: str, present: bool = True) -> tuple[patches.Patch, list[str]]:
    applied: list[str] = []
    patch = patches.Patch(
        name=f"probe-{next(_fresh)}",
        library="apache-beam",
        written_for=written_for,
        tested="2.77.0",
        purpose=purpose,
        target="apache_beam.nothing",
        present=lambda: present,
        apply=lambda: applied.append("in"),
    )
    return patch, applied


def test_a_speed_patch_outside_its_versions_is_left_out_with_a_debug_line(caplog):
    patch, applied = _probe(compat.SPEED, "<2.0")  # a faked range: the installed Beam is outside it
    with caplog.at_level(logging.DEBUG, logger=patches.__name__):
        assert not patches.put_in(patch) and not patches.put_in(patch)
    assert applied == []
    assert f"apache-beam {patches.installed_version('apache-beam')} is outside <2.0" in caplog.text
    inside, applied = _probe(compat.SPEED, ">=2.77,<3")
    assert patches.put_in(inside) and patches.put_in(inside) and applied == ["in"]  # once


def test_a_correctness_patch_goes_in_outside_its_versions_while_its_target_is_there_and_refuses_once_gone():
    patch, applied = _probe(compat.CORRECTNESS, "<2.0")
    assert patches.put_in(patch) and applied == ["in"]
    gone, applied = _probe(compat.CORRECTNESS, ">=2.77,<3", present=False)
    for _ in range(2):  # refused at every build, not only the first
        with pytest.raises(
            UserError,
            match=r"^apache-beam \S+: apache_beam\.nothing is not as .*'apache-beam==2\.77\.0'.*>=2\.77,<3 that",
        ):
            patches.put_in(gone)
    assert applied == []


def test_a_disabled_patch_stays_out_until_enabled(monkeypatch):
    patch, applied = _probe(compat.SPEED, ">=2.77,<3")
    monkeypatch.setattr(patches, "_DISABLED", {patch.name})
    assert not patches.put_in(patch) and applied == []
    monkeypatch.setattr(patches, "_DISABLED", set())
    assert patches.put_in(patch) and applied == ["in"]


@pytest.mark.parametrize(
    ("version", "specifier", "fits"),
    [("2.77.0", ">=2.77,<3", True), ("3.0.0", ">=2.77,<3", False), ("2.80.0rc1", ">=2.77,<3", True),
     ("not-a-version", ">=2.77", False), (None, ">=0", False)],
)  # fmt: skip
def test_versions_in_range(version, specifier, fits):
    assert patches.in_range(version, specifier) is fits


def test_installed_versions_are_read_from_the_installed_distributions():
    import sys

    import xarray

    assert patches.installed_version("xarray") == xarray.__version__
    assert patches.installed_version("python") == "{}.{}.{}".format(*sys.version_info[:3])
    assert patches.installed_version("no-such-distribution-here") is None
