"""Beam's package without running the HTTP clients it imports for GCP and job services until they are used (0.07 s)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import types

#: Imported whole by Beam's package (apache_beam.internal.http_client, io.gcp.gce_metadata_util) and used only
#: inside the functions of its GCP and job-service clients; httplib2 brings pyparsing. Measured: ~0.07 s of a
#: build's start-up, which a local build never gets back.
ON_FIRST_USE = ("httplib2", "requests")

#: Held while a deferred module's code runs: a thread that reads one of its attributes meanwhile waits.
_RUNNING_LOCK = threading.RLock()
_RUNNING: set[int] = set()
#: What the import system reads of a module already imported (``import requests`` again): answered without running it.
_METADATA = frozenset({"__spec__", "__name__", "__loader__", "__class__"})


class _RunsOnFirstUse(types.ModuleType):
    """A module whose code runs when one of its attributes is first read, once, while other threads wait.

    importlib.util.LazyLoader's modules let a second thread read a half-run module before Python 3.12.3
    (CPython gh-114763); a build's worker threads may be the first to use requests (gcsfs).
    """

    def __getattribute__(self, name: str):
        if name in _METADATA:
            return types.ModuleType.__getattribute__(self, name)
        with _RUNNING_LOCK:
            # type() and id() read no attribute; while the module's own code runs, its reads go through
            if type(self) is _RunsOnFirstUse and id(self) not in _RUNNING:
                _run(self)
        return types.ModuleType.__getattribute__(self, name)


def _run(module: types.ModuleType) -> None:
    spec = types.ModuleType.__getattribute__(module, "__spec__")
    _RUNNING.add(id(module))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if sys.modules.get(spec.name) is module:  # as a failed import leaves it: the next import tries again
            del sys.modules[spec.name]
        raise
    finally:
        _RUNNING.discard(id(module))
        module.__class__ = types.ModuleType


class _DeferredLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.machinery.SourceFileLoader):
        self.loader = loader

    def create_module(self, spec):
        return None  # the default module, as a source file's loader makes

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__.loader = module.__loader__ = self.loader  # the real loader runs it, on first use
        module.__class__ = _RunsOnFirstUse


class OnFirstUseFinder(importlib.abc.MetaPathFinder):
    """Makes the top-level modules ``names`` run on first use while it is on ``sys.meta_path``."""

    def __init__(self, names: tuple[str, ...]):
        self.names = frozenset(names)

    def find_spec(self, name, path, target=None):
        if name not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
            return None  # not a plain source module (or not found): imported as usual
        spec.loader = _DeferredLoader(spec.loader)
        return spec


def import_beam() -> None:
    """Import Beam's package with ON_FIRST_USE run on first use; nothing changes if Beam is already imported.

    The deferral covers only Beam's own import: a module imported later, by anyone, is imported as usual.
    A deferred module behaves as if imported (``import`` gives it, ``from requests import get`` runs it).
    """
    if "apache_beam" in sys.modules:
        return
    finder = OnFirstUseFinder(ON_FIRST_USE)
    sys.meta_path.insert(0, finder)
    try:
        import apache_beam  # noqa: F401
    finally:
        sys.meta_path.remove(finder)
