"""The patch of xarray's checks for dask arrays: answered without importing dask while nothing has imported it."""

from __future__ import annotations

import sys
import types

from transforms.compat.patches import SPEED, Patch

#: setup.py's lower bound of xarray, up to the releases after the tested one (xarray has no upper bound there; its
#: calendar versions say nothing of its internals, so the patch trusts them only this far).
XARRAY = ">=2025.1,<2028"
#: The xarray the tests run on (constraints.txt).
XARRAY_TESTED = "2026.9.0"


def _present() -> bool:
    from xarray.namedarray import pycompat, utils

    return callable(getattr(pycompat, "_get_cached_duck_array_module", None)) and callable(
        getattr(utils, "is_dask_collection", None)
    )


def _defer_dask() -> None:
    """Make xarray's "is this a dask array?" answer no without importing dask, while dask is not imported.

    No object is a dask array (or collection) before dask has been imported, so the answer is the same;
    once anything imports dask (the Dask runner, a user's code), xarray's own checks run unchanged.
    """
    from packaging.version import Version
    from xarray.namedarray import pycompat, utils

    # What xarray's duck-array cache holds for a module it cannot import: no array type is dask's.
    not_loaded = types.SimpleNamespace(module=None, version=Version("0.0.0"), type=(), available=False)
    cached = pycompat._get_cached_duck_array_module
    is_collection = utils.is_dask_collection

    def duck_array_module(mod):
        if mod == "dask" and "dask" not in sys.modules:
            return not_loaded
        return cached(mod)

    def is_dask_collection(x: object) -> bool:
        return "dask" in sys.modules and is_collection(x)

    pycompat._get_cached_duck_array_module = duck_array_module
    utils.is_dask_collection = is_dask_collection


#: xarray's checks for dask arrays import dask (0.3 s, and 40 MB) on numpy data, in every build.
DEFER_DASK = Patch(
    name="dask-on-demand",
    library="xarray",
    written_for=XARRAY,
    tested=XARRAY_TESTED,
    purpose=SPEED,
    target="xarray.namedarray.pycompat._get_cached_duck_array_module",
    present=_present,
    apply=_defer_dask,
)
