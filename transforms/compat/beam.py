"""The patches of Beam's internals: its look for DoFn state, its GCS credentials, its local runner's workers."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import weakref
from collections.abc import Callable

from transforms.compat.patches import CORRECTNESS, SPEED, Patch, put_in

logger = logging.getLogger(__name__)

#: setup.py's range of Beam: Beam keeps these internals within a major release (each patch also checks its target).
BEAM = ">=2.77,<3"
#: The Beam the tests run on (constraints.txt).
BEAM_TESTED = "2.77.0"


def beam_patch(**fields) -> Patch:
    """A patch of Beam's internals: written for setup.py's range of Beam, tested on constraints.txt's."""
    return Patch(library="apache-beam", written_for=BEAM, tested=BEAM_TESTED, **fields)


#: What Beam runs as each worker process of ``--direct_running_mode=multi_processing``.
BEAM_WORKER_MODULE = b"apache_beam.runners.worker.sdk_worker_main"


# --- Beam's look for state and timers in a DoFn, once per DoFn object ------------------------------------------


def once_per_object(look: Callable) -> Callable:
    """``look``, answering again from a memo for an object still alive (by identity; held weakly)."""
    memo: dict[int, tuple[weakref.ref, object]] = {}

    @functools.wraps(look)  # (its signature stays the look's: what tests of the target read)
    def remembered(obj):
        held = memo.get(id(obj))
        if held is not None and held[0]() is obj:
            return held[1]
        found = look(obj)
        try:
            alive = weakref.ref(obj)
        except TypeError:  # no weak references to it: asked again, it is looked over again
            return found
        key = id(obj)
        memo[key] = (alive, found)
        weakref.finalize(obj, memo.pop, key, None)  # gone with the object, before its id can be reused
        return found

    return remembered


def _dofn_specs_present() -> bool:
    from apache_beam.transforms import userstate

    return callable(getattr(userstate, "get_dofn_specs", None))


def _look_once_per_dofn() -> None:
    from apache_beam.transforms import userstate

    userstate.get_dofn_specs = once_per_object(userstate.get_dofn_specs)


#: Beam looks a DoFn over (every method's signature) whenever it asks whether the DoFn is stateful: about 230 times
#: while a small build's graph is built and run. What it finds depends only on the DoFn's methods.
DOFN_SPECS = beam_patch(
    name="dofn-specs-once",
    purpose=SPEED,
    target="apache_beam.transforms.userstate.get_dofn_specs",
    present=_dofn_specs_present,
    apply=_look_once_per_dofn,
)


# --- Beam's state sampler, sampling often enough that the end of a bundle does not wait for it -----------------

#: The period of this process's state samplers (Beam's default: 200 ms, statesampler.DEFAULT_SAMPLING_PERIOD_MS).
SAMPLING_PERIOD_MS = 10


def _sampler_present() -> bool:
    from apache_beam.runners.worker import statesampler

    default = getattr(statesampler, "DEFAULT_SAMPLING_PERIOD_MS", None)
    return default is not None and statesampler.StateSampler.__init__.__defaults__ == (default,)


def _sample_often() -> None:
    from apache_beam.runners.worker import statesampler

    statesampler.StateSampler.__init__.__defaults__ = (SAMPLING_PERIOD_MS,)


#: Each bundle starts a thread that samples which step runs, sleeping between samples in periods that grow to
#: 200 ms, and the bundle's end joins that thread: a bundle of a second or more ends up to 200 ms after its last
#: element, on each of a local run's threads. Each sample is a few counter updates made without the GIL.
SAMPLE_OFTEN = beam_patch(
    name="sample-often",
    purpose=SPEED,
    target="apache_beam.runners.worker.statesampler.StateSampler.__init__ (its sampling_period_ms default)",
    present=_sampler_present,
    apply=_sample_often,
)


# --- Beam's GCS credentials, none to look for when a storage emulator stands in --------------------------------


def _credentials_cache():
    from apache_beam.internal.gcp import auth

    return getattr(auth, "_Credentials", None)


def _credentials_present() -> bool:
    cache = _credentials_cache()
    return cache is not None and all(hasattr(cache, a) for a in ("_credentials_lock", "_credentials_init"))


def _no_credentials_to_look_for() -> None:
    cache = _credentials_cache()
    with cache._credentials_lock:
        cache._credentials = None
        cache._credentials_init = True


#: google-cloud-storage already uses anonymous credentials when STORAGE_EMULATOR_HOST is set, but Beam's GCS
#: filesystem first looks for Google credentials itself and retries for about 25 s per process before giving up.
EMULATOR_CREDENTIALS = beam_patch(
    name="emulator-credentials",
    purpose=SPEED,
    target="apache_beam.internal.gcp.auth._Credentials",
    present=_credentials_present,
    apply=_no_credentials_to_look_for,
)


def use_anonymous_credentials_for_emulator() -> bool:
    """Tell Beam's GCS filesystem there are no credentials to find when a storage emulator is configured.

    Called by the driver (compat.install) and by every DoFn that writes files, in setup(); does nothing
    without STORAGE_EMULATOR_HOST (a later process, or test, may set it: then it goes in).

    Returns:
        Whether Beam now looks for no credentials.
    """
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        return False
    return put_in(EMULATOR_CREDENTIALS)


# --- The local runner: whole elements, quiet workers, watched worker processes ---------------------------------


def _no_timed_flush_present() -> bool:
    from apache_beam.portability import python_urns
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    from apache_beam.transforms.environments import EmbeddedPythonGrpcEnvironment

    handler = getattr(worker_handlers, "EmbeddedGrpcWorkerHandler", None)
    return (
        hasattr(python_urns, "EMBEDDED_PYTHON_GRPC")
        and callable(getattr(EmbeddedPythonGrpcEnvironment, "parse_config", None))
        and handler is not None
        and "data_buffer_time_limit_ms" in handler.__init__.__code__.co_consts
    )


#: The period of the timed flush of Beam's in-process (multi_threading) workers: the longest it takes. Their
#: output streams are flushed every second (Beam's default; 0 means that default) from a timer thread that does
#: not wait for the element being encoded, so an element whose encoding runs Python code (pickling a block of
#: samples) across the tick is sent in two messages, which the runner decodes one by one: values lost, wrong
#: values, "Invalid PaneInfoEncoding", or a decode that loops until the process runs out of memory. Beam has no
#: option for it. Batch bundles need no timed flush: their outputs go when a buffer fills, and when the bundle ends.
NO_TIMED_FLUSH_MS = 2**31 - 1

NO_TIMED_FLUSH = beam_patch(
    name="no-timed-flush",
    purpose=CORRECTNESS,
    target="the embedded worker's data_buffer_time_limit_ms (worker_handlers.EmbeddedGrpcWorkerHandler)",
    present=_no_timed_flush_present,
    apply=lambda: None,  # LocalRunner sets it in each run's environment
)


def _watched_present() -> bool:
    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    handler = getattr(worker_handlers, "SubprocessSdkWorkerHandler", None)
    return (
        handler is not None
        and callable(getattr(worker_handlers.WorkerHandler, "register_environment", None))
        and all(callable(getattr(handler, m, None)) for m in ("start_worker", "stop_worker"))
        and "_worker_command_line" in handler.__init__.__code__.co_names
        and callable(getattr(getattr(local_job_service, "SubprocessSdkWorker", None), "run", None))
        and "_futures_by_id" in worker_handlers.ControlConnection.__init__.__code__.co_names
    )


#: The environment of this tool's local worker processes: Beam's subprocess environment, each process watched.
#: A name of its own, so that Beam's handler of its own environment stays as it is.
WATCHED_SUBPROCESS_SDK = "xarray_tfrecords:env:watched_subprocess_sdk:v1"

#: What the watched handler calls when a worker process dies, with Beam's error: the text every instruction still
#: waiting on that process fails with (the runner that installs it ends the build in one line).
_on_worker_death: list[Callable[[BaseException], str]] = []


def _register_watched_handler() -> None:
    """Register the handler of WATCHED_SUBPROCESS_SDK: Beam's handler of a worker process, which also acts when
    the process dies.

    Beam's own runs the process from a thread that raises when it exits with an error, and tells no one: the
    runner waits for ever for the results of the bundles the process had (a worker the out-of-memory killer ended
    froze the build at "cut 0/1 units"). This one fails those bundles, as a worker that reports an error fails
    them, so the runner unwinds.
    """
    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    @worker_handlers.WorkerHandler.register_environment(WATCHED_SUBPROCESS_SDK, bytes)
    class WatchedSubprocessSdkWorkerHandler(worker_handlers.SubprocessSdkWorkerHandler):
        def start_worker(self):
            # As Beam's own, the process's thread aside.
            self.worker = local_job_service.SubprocessSdkWorker(
                self._worker_command_line, self.control_address, self.provision_info, self.worker_id
            )
            self._stopped = threading.Event()
            self.worker_thread = threading.Thread(name="run_worker", target=self._run_watched)
            self.worker_thread.start()

        def stop_worker(self):
            self._stopped.set()
            super().stop_worker()

        def _run_watched(self):
            try:
                self.worker.run()  # raises once the process exits with an error (a clean exit, 0, is the run's end)
            except Exception as error:
                said = _on_worker_death[-1](error) if _on_worker_death else str(error)
                # The runner may still send the dead process work: every instruction fails until it lets go.
                while True:
                    fail_instructions(self.control_conn, said)
                    if self._stopped.wait(0.1):
                        return


#: One handler registered per process, whichever runner asks first.
WATCHED_WORKERS = beam_patch(
    name="watched-worker-processes",
    purpose=CORRECTNESS,
    target="apache_beam.runners.portability.fn_api_runner.worker_handlers.SubprocessSdkWorkerHandler",
    present=_watched_present,
    apply=_register_watched_handler,
)


def fail_instructions(connection, error: str) -> None:
    """Answer every instruction still waiting on a worker's control connection with ``error``.

    An answer with an error is what the runner waits for (``ControlConnection.abort`` is not: the runner's wait
    for a bundle's data polls only for an answer). The pending instructions are the connection's
    ``_futures_by_id``, Beam's own bookkeeping (WATCHED_WORKERS checks it is there).
    """
    from apache_beam.portability.api import beam_fn_api_pb2

    pending = getattr(connection, "_futures_by_id", None)
    for instruction, future in list(pending.items() if isinstance(pending, dict) else ()):
        with contextlib.suppress(Exception):
            future.set(beam_fn_api_pb2.InstructionResponse(instruction_id=instruction, error=error))


def local_runner_class(worker_command: Callable[[bytes], bytes], worker_died: Callable[[BaseException], str]):
    """Beam's FnApiRunner, whose in-process workers send only whole elements (NO_TIMED_FLUSH), whose worker
    processes run ``worker_command(Beam's command line)`` and are watched (WATCHED_WORKERS).

    Args:
        worker_command: the shell command line a worker process runs, from Beam's own (which runs
            ``python -m`` BEAM_WORKER_MODULE); called only for that one.
        worker_died: called with Beam's error when a worker process dies; returns the error every instruction
            still waiting on that process fails with.

    Returns:
        The runner class (``graph_bytes`` is the size of the last job graph it was given).

    Raises:
        UserError: the installed Beam has not the internals these correctness patches change.
    """
    from apache_beam.portability import python_urns
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.transforms.environments import EmbeddedPythonGrpcEnvironment

    whole_elements = put_in(NO_TIMED_FLUSH)
    watched = put_in(WATCHED_WORKERS)
    _on_worker_death[:] = [worker_died]

    class LocalRunner(fn_runner.FnApiRunner):
        #: Bytes of the job graph this runner was given (the summary's "job graph" line): measured here, as
        #: serialising the graph again only to weigh it cost a local run a tenth of its start-up.
        graph_bytes: int | None = None

        def run_via_runner_api(self, pipeline_proto, options):
            self.graph_bytes = pipeline_proto.ByteSize()
            for environment in pipeline_proto.components.environments.values():
                if whole_elements and environment.urn == python_urns.EMBEDDED_PYTHON_GRPC:
                    config = EmbeddedPythonGrpcEnvironment.parse_config(environment.payload.decode() or "{}")
                    config["data_buffer_time_limit_ms"] = NO_TIMED_FLUSH_MS
                    environment.payload = json.dumps(config).encode()
                # The payload is the command line run with ``sh -c``: only Beam's own worker's is changed.
                if environment.urn == python_urns.SUBPROCESS_SDK and BEAM_WORKER_MODULE in environment.payload:
                    environment.payload = worker_command(environment.payload)
                    if watched:
                        environment.urn = WATCHED_SUBPROCESS_SDK
            return super().run_via_runner_api(pipeline_proto, options)

    return LocalRunner
