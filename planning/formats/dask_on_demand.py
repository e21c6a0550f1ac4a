"""xarray without dask until a run uses it: its checks for dask arrays import dask (0.3 s) on numpy data."""

from __future__ import annotations

import sys
import types

_INSTALLED = False


def defer_dask() -> None:
    """Make xarray's "is this a dask array?" answer no without importing dask, while dask is not imported.

    No object is a dask array (or collection) before dask has been imported, so the answer is the same;
    once anything imports dask (the Dask runner, a user's code), xarray's own checks run unchanged.
    Installed when a build runs (never at import: importing the packages patches nothing); idempotent.
    """
    global _INSTALLED
    if _INSTALLED:
        return
    from packaging.version import Version
    from xarray.namedarray import pycompat, utils

    # What xarray's duck-array cache holds for a module it cannot import: no array type is dask's.
    not_loaded = types.SimpleNamespace(module=None, version=Version("0.0.0"), type=(), available=False)
    cached = getattr(pycompat, "_get_cached_duck_array_module", None)
    is_collection = getattr(utils, "is_dask_collection", None)
    if cached is None or is_collection is None:  # another xarray than the tested ones: dask is imported, as before
        _INSTALLED = True
        return

    def duck_array_module(mod):
        if mod == "dask" and "dask" not in sys.modules:
            return not_loaded
        return cached(mod)

    def is_dask_collection(x: object) -> bool:
        return "dask" in sys.modules and is_collection(x)

    pycompat._get_cached_duck_array_module = duck_array_module
    utils.is_dask_collection = is_dask_collection
    _INSTALLED = True
