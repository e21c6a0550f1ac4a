"""The schema a build will commit: its features, how samples were cut, its inputs and provenance."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from importlib import metadata

from planning.config.model import BuildConfig
from planning.formats.sources import SourceFile
from planning.inputs.coords import json_values, time_calendar
from planning.inputs.inventory import Inventory
from planning.reads.source_index import SourceIndex
from planning.sampling import SampleGrid
from planning.selected import SelectedDataset
from planning.splits import SplitPlan
from schemas.grid import describe_coordinate
from schemas.schema import Feature, Schema
from schemas.stored_order import STORED_ORDER, UNIT_ORDER


def package_version() -> str:
    try:
        return metadata.version("xarray-tfrecords")
    except metadata.PackageNotFoundError:
        return "unknown"


def sample_description(
    config: BuildConfig, grid: SampleGrid, dataset: SelectedDataset, splits: Sequence[SplitPlan], origin: int = 0
):
    """schema.json's ``sample``: the dims and their roles, the grid of positions, each split's range.

    Lengths, positions and index ranges count on the selected grid; ``selection`` says where it is in the source.
    ``origin``: the grid position along the concat dim whose index/<dim> is 0 (a backfill's steps come before
    it); written as the concat axis's ``index_origin`` and taken off the splits' index ranges.
    """
    concat_dim, split_dim = config.input.concat_dim, config.split_dim
    calendar = time_calendar(dataset.concat_values[:1])  # the calendar of the concat dim's dates (times only)
    values, _ = dataset.coordinate(split_dim)
    members = dataset.inventory.members
    out = {
        "concat_dim": concat_dim,
        **({"calendar": calendar} if calendar else {}),
        **({"new_dim": {"name": members.dim, **members.to_json()}} if members is not None else {}),
        **({"split_dim": split_dim} if split_dim != concat_dim else {}),
        "axes": [
            {**a.to_json(), "index_origin": origin} if origin and a.dim == concat_dim else a.to_json()
            for a in grid.axes
        ],
        "grid_dims": [a.dim for a in grid.grid_axes],
        "grid_shape": list(grid.shape),
        "num_samples": sum(s.num_samples for s in splits),
        "splits": {s.name: _split_description(s, values, origin, split_dim == concat_dim) for s in splits},
    }
    if config.shuffle.mode == "read":
        out[STORED_ORDER] = UNIT_ORDER  # (without it: shuffled at write, as every output before the key)
    if config.sample.roles:
        out["roles"] = {name: role.model_dump() for name, role in config.sample.roles.items()}
    if dataset.selection:
        out["selection"] = dataset.to_json()
    return out


def _split_description(split: SplitPlan, values, origin: int, along_concat: bool) -> dict:
    """A split's steps in schema.json: first, last, index range; and why it holds no sample yet, if it holds none."""
    out = {
        "first": json_values(values[split.start : split.start + 1])[0] if split.stop > split.start else None,
        "last": json_values(values[split.stop - 1 : split.stop])[0] if split.stop > split.start else None,
        "index_range": [split.start - origin, split.stop - origin] if along_concat else [split.start, split.stop],
    }
    if split.awaiting is not None:
        out["no_data_yet"] = split.awaiting
    return out


#: Files named in schema.json's sources: the first few and the last (the rest are counted).
LISTED_FILES = 3


def describe_sources(config: BuildConfig, sources: SourceIndex, inventory: Inventory) -> dict:
    """schema.json's ``sources``: globs, counts, a fingerprint and a few files (it does not grow with the archive)."""
    listed = [*range(min(LISTED_FILES - 1, len(sources))), len(sources) - 1]
    return {
        "globs": list(config.input.paths),
        "files": len(sources),
        "bytes": sources.total_bytes,
        "fingerprint": f"sha256:{sources.fingerprint()}",
        # Without the version (a modification time): touching an input must not change the output.
        "listed": [
            _listed(sources[i], sources.members is not None, sources.groups is not None) for i in dict.fromkeys(listed)
        ],
        "static": [{"path": info.path, "nbytes": info.nbytes} for info in inventory.static_files],
        **({"variable_groups": inventory.groups.to_json()} if inventory.groups is not None else {}),
        # An Icechunk repository's version read: its data at this snapshot, whatever its branches hold since.
        **({"icechunk_snapshot": inventory.zarr.snapshot} if inventory.zarr and inventory.zarr.snapshot else {}),
    }


def _listed(source: SourceFile, with_member: bool, with_group: bool) -> dict:
    entry = dataclasses.asdict(source)
    del entry["version"], entry["layouts"], entry["classic"]  # how workers read it, not what it holds
    if not with_member:
        del entry["member"]
    if not with_group:
        del entry["group"]
    return entry


def describe_build(
    config: BuildConfig,
    grid: SampleGrid,
    dataset: SelectedDataset,
    sources: SourceIndex,
    features: Sequence[Feature],
    splits: Sequence[SplitPlan],
    drops: dict[str, int],
    scalar_coords: Sequence[dict] = (),
    origin: int = 0,
) -> Schema:
    """The schema without its shards (Finalize adds those once they are written); ``origin``: sample_description's."""
    kept, on_grid = {}, {}
    for axis in grid.axes:
        found = dataset.coordinate(axis.dim)
        if found is None:
            continue
        on_grid[axis.dim] = describe_coordinate(*found)
        if axis.role == "keep":
            kept[axis.dim] = json_values(found[0])
    return Schema(
        features=tuple(features),
        compression=config.output.compression,
        examples_per_record=config.output.examples_per_record,
        sample=sample_description(config, grid, dataset, splits, origin),
        coords=kept,
        scalar_coords=tuple(scalar_coords),
        grid=on_grid,
        sources=describe_sources(config, sources, dataset.inventory),
        counts=drops,
        seed=config.shuffle.seed,
        config=config.model_dump(mode="json", by_alias=True),
        created_by=f"xarray-tfrecords {package_version()}",
    )
