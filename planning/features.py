"""What a sample holds: the selected variables, the sample grid, and the features of every record.

With sample.roles (inputs, targets, forcings), the sample is cut once, over every step any role
takes (the config joins the roles' offsets into ``sample.offsets``) and the whole window; each
role's feature ``<role>/<variable>`` is then that variable's values at the role's steps and, with
``crop``, the centred part of the window. A sample exists where all its steps exist, so where
every role's do. Statistics stay per variable, over the cells its role features store (stored_cells).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from planning.config.model import BuildConfig, RoleConfig
from planning.inputs.inventory import Inventory
from planning.inputs.limits import check_dim_sizes
from planning.inputs.metadata import VariableInfo
from planning.run.variables import StackPlan, VariablePlan
from planning.sampling import Axis, SampleGrid
from schemas.errors import UserError
from schemas.schema import Feature


def is_numeric(dtype) -> bool:
    return np.dtype(dtype).kind in "fiub"


def sample_dims(config: BuildConfig) -> set[str]:
    """The dims the sample config names, and the concat dim: a variable chosen by default has them all."""
    sample = config.sample
    return set(sample.window) | set(sample.offsets) | set(sample.keep) | {config.input.concat_dim}


def check_sample_dims(config: BuildConfig, inventory: Inventory) -> None:
    """Every dim the sample config names is a dim of some variable of the input."""
    all_dims = {d for v in inventory.variables.values() for d in v.dims} | set(inventory.sizes)
    sample = config.sample
    for key, dims in (("window", sample.window), ("offsets", sample.offsets), ("keep", sample.keep)):
        for dim in dims:
            if dim not in all_dims:
                raise UserError(
                    f"sample.{key}.{dim}: no variable in {inventory.reference.path} has a dim {dim!r} "
                    f"(dims: {', '.join(sorted(all_dims))}); fix the dim name"
                )


@dataclasses.dataclass(frozen=True)
class Candidates:
    """Variables to choose among, and how an error names them and the fix."""

    variables: Mapping[str, VariableInfo]
    key: str  # the config key that lists names among them: "variables" or "input.preprocess_inputs"
    none_fit: Callable[[str], str]  # the error when no variable has all the sample dims (given as text)
    missing: Callable[[str], str]  # the error's text after "<key>: <name>" for a name not among them
    where: str  # where a variable's dtype was found, e.g. "in <file>"
    numeric_fix: str  # what to do about a variable that holds no numbers
    listed_as: str = ""  # after "none of <names>" when none lies along the concat dim
    coordinates: frozenset[str] = frozenset()  # names that are coordinates of the input, not variables


def choose_variables(
    config: BuildConfig, candidates: Candidates, names: Sequence[str] | None, widest: bool = True
) -> list[VariableInfo]:
    """The variables ``names`` names, or by default every numeric one with all the sample dims.

    ``widest``: of the default ones, only those with the most dims (static fields, e.g. orography
    on lat, lon, must be listed to be taken).
    """
    available = candidates.variables
    if names is None:
        wanted = sample_dims(config)
        found = [v for v in available.values() if wanted <= set(v.dims) and is_numeric(v.dtype)]
        if not found:
            raise UserError(candidates.none_fit(", ".join(sorted(wanted))))
        if not widest:
            return found
        most = set(max(found, key=lambda v: len(v.dims)).dims)
        return [v for v in found if set(v.dims) == most]
    chosen = []
    for name in names:
        if name not in available:
            if name in candidates.coordinates:
                raise UserError(
                    f"{candidates.key}: {name!r} is a coordinate of the input, not a data variable; list it under "
                    "`coords:` to carry it in every record"
                )
            raise UserError(f"{candidates.key}: {name!r} {candidates.missing(name)}")
        var = available[name]
        if not is_numeric(var.dtype):
            raise UserError(
                f"{candidates.key}: {name!r} {candidates.where} has dtype {var.dtype}, which a tf.Example cannot "
                f"hold as numbers; {candidates.numeric_fix}"
            )
        chosen.append(var)
    if not any(config.input.concat_dim in v.dims for v in chosen):
        raise UserError(
            f"{candidates.key}: none of {list(names)}{candidates.listed_as} has the dim {config.input.concat_dim!r}; "
            "include at least one variable along input.concat_dim"
        )
    return chosen


def select_variables(config: BuildConfig, inventory: Inventory) -> list[VariableInfo]:
    """The configured variables, or by default every numeric one with all the sample dims."""
    check_sample_dims(config, inventory)
    available = inventory.variables
    where = inventory.reference.path
    files = (inventory.reference, *inventory.static_files)
    coordinates = frozenset(name for info in files for name in info.coordinates)
    candidates = Candidates(
        available,
        "variables",
        lambda dims: (
            f"{where}: no numeric data variable has all the sample dims ({dims}); "
            "list the variables under `variables:` or change the sample dims"
        ),
        lambda _: f"is not a data variable of the input (it has: {', '.join(available) or 'none'})",
        f"in {where}",
        "remove it from `variables:`",
        coordinates=coordinates,
    )
    return choose_variables(config, candidates, config.variables)


def build_grid(config: BuildConfig, variables: list[VariableInfo], sizes: dict[str, int]) -> SampleGrid:
    """One axis per dim of the selected variables, in the widest variable's dim order; ``sizes``: as selected."""
    check_dim_sizes("input", sizes)
    dims: list[str] = []
    for var in sorted(variables, key=lambda v: -len(v.dims)):
        dims.extend(d for d in var.dims if d not in dims)
    sample = config.sample
    axes = []
    for dim in dims:
        length = sizes[dim]
        selected = ", as selected" if dim in config.select else ""
        if dim in sample.window:
            window = sample.window[dim]
            if window.size > length:
                raise UserError(
                    f"sample.window.{dim}.size: {window.size} is larger than dim {dim!r} ({length}{selected}); "
                    f"use at most {length}"
                )
            axes.append(Axis.window(dim, length, window.size, window.step))
        elif dim in sample.offsets:
            steps = sample.offsets[dim]
            if max(steps) - min(steps) + 1 > length:
                raise UserError(
                    f"sample.offsets.{dim}: {steps} spans {max(steps) - min(steps) + 1} steps "
                    f"but dim {dim!r} has {length}{selected}"
                )
            axes.append(Axis.offsets(dim, length, steps))
        elif dim in sample.keep:
            axes.append(Axis.keep(dim, length))
        else:
            axes.append(Axis.iterate(dim, length))
    grid = SampleGrid(tuple(axes))
    for axis in grid.grid_axes:
        if axis.count == 0:
            raise UserError(
                f"input: dim {axis.dim!r} has length {axis.length}, which leaves no sample; "
                "check the input files and the sample config"
            )
    return grid


def variable_plans(grid: SampleGrid, variables: list[VariableInfo], inventory: Inventory) -> list[VariablePlan]:
    plans = []
    for var in variables:
        shape, dims = grid.feature_shape(var.dims)
        dtype = "float32" if np.dtype(var.dtype).kind == "f" else "int64"
        source = {"variable": var.name, "dtype": var.dtype, "file_dtype": var.source_dtype, "attrs": var.attrs}
        source["dims"] = list(var.dims)  # its dims in the files, the sample's iterated ones too (for reassembly)
        if dtype == "float32" and np.dtype(var.dtype).itemsize > 4:
            source["stored_as"] = "float32 (tf.Example holds no float64)"
        static_path = inventory.static_file_of(var.name)
        if static_path is not None:
            source["static"] = True
        feature = Feature(var.name, dtype, shape, dims, "variable", source)
        plans.append(VariablePlan(var.name, var.dims, var.dtype, feature, static_path))
    return plans


def stack_plans(config: BuildConfig, variables: list[VariablePlan]) -> list[StackPlan]:
    by_name = {v.name: v for v in variables}
    stacks = []
    for stack in config.layout.stack:
        missing = [name for name in stack.variables if name not in by_name]
        if missing:
            raise UserError(
                f"layout.stack {stack.name!r}: {missing[0]!r} is not among the selected variables; "
                "add it to `variables:` or remove it from the stack"
            )
        members = [by_name[name].feature for name in stack.variables]
        first = members[0]
        for other in members[1:]:
            if (other.shape, other.dims, other.dtype) != (first.shape, first.dims, first.dtype):
                raise UserError(
                    f"layout.stack {stack.name!r}: {first.name!r} is {first.dtype} {first.dims} {first.shape} but "
                    f"{other.name!r} is {other.dtype} {other.dims} {other.shape}; stacked variables need one shape"
                )
        channels = len(members)
        if stack.axis == 0:
            shape, dims = (channels, *first.shape), ("channel", *first.dims)
        else:
            shape, dims = (*first.shape, channels), (*first.dims, "channel")
        source = {"channels": list(stack.variables), "variables": {f.name: f.source for f in members}}
        feature = Feature(stack.name, first.dtype, shape, dims, "variable", source)
        stacks.append(StackPlan(feature, tuple(stack.variables), stack.axis))
    return stacks


def mask_name(feature: str) -> str:
    """The feature saying where ``feature`` was NaN and filled (config nan_mask)."""
    return f"mask/{feature}"


def mask_features(config: BuildConfig, features: Sequence[Feature], stacks: Sequence[StackPlan]) -> list[Feature]:
    """Config ``nan_mask``: a 0/1 int64 feature per float variable or stack, of its shape and dims.

    int64 because a record holds nothing smaller: a varint of 0 or 1 is one byte on disk, a
    quarter of the float32 it marks, and every record keeps the same size.
    """
    wanted = config.nan_mask
    if not wanted:
        return []
    floats = {f.name: f for f in features if f.role == "variable" and f.dtype == "float32"}
    if wanted is True:
        names = list(floats)
    else:
        names = list(dict.fromkeys(wanted))
        stacked = {name: stack.feature.name for stack in stacks for name in stack.variables}
        for name in names:
            if name in floats:
                continue
            if name in stacked:
                fix = f"it is stacked in {stacked[name]!r}: list {stacked[name]!r} instead"
            elif any(f.name == name and f.role == "variable" for f in features):
                fix = "it holds integers, which are never NaN: remove it"
            else:
                fix = f"the float variables and stacks are: {', '.join(floats) or 'none'}"
            raise UserError(f"nan_mask: {name!r} is not a float variable or stack of the records; {fix}")
    return [
        Feature(
            mask_name(name),
            "int64",
            floats[name].shape,
            floats[name].dims,
            "mask",
            {"of": name, "fill_value": config.fill_value, "values": "1 where the value was NaN and filled, else 0"},
        )
        for name in names
    ]


def record_features(
    grid: SampleGrid,
    variables: list[VariablePlan],
    stacks: list[StackPlan],
    coords: dict[str, tuple[np.ndarray, dict]],
    coordinates: Sequence[Feature] = (),
    config: BuildConfig | None = None,
) -> list[Feature]:
    """Every feature of a record: variables (stacks in place of their first member), index/*, coord/*.

    ``coordinates``: the features of the config's ``coords`` (planning.aux_coords), after
    those; then the masks of ``config.nan_mask``, last.
    """
    stack_of = {name: stack for stack in stacks for name in stack.variables}
    features: list[Feature] = []
    if config is not None and config.sample.roles:
        roles = role_features(config.sample.roles, grid, variables, config.input.concat_dim)
        features.extend(stack_roles(roles, stacks))
        variables = []  # each variable only in its roles' features
    for var in variables:
        stack = stack_of.get(var.name)
        if stack is None:
            features.append(var.feature)
        elif stack.variables[0] == var.name:
            features.append(stack.feature)
    for axis in grid.grid_axes:
        features.append(Feature(f"index/{axis.dim}", "int64", (), (), "index", {"dim": axis.dim}))
    for axis in grid.grid_axes:
        if axis.dim not in coords:
            continue
        values, info = coords[axis.dim]
        dtype = "int64" if values.dtype == np.int64 else "float32"
        shape, dims = ((), ()) if axis.role == "iterate" else ((len(axis.steps),), (axis.dim,))
        features.append(Feature(f"coord/{axis.dim}", dtype, shape, dims, "coord", {"dim": axis.dim, **info}))
    features.extend(coordinates)
    if config is not None:
        features.extend(mask_features(config, features, stacks))
    names = [f.name for f in features]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise UserError(
            f"feature name {clash[0]!r} is used twice (by variables, stacks, positions or coords); rename one"
        )
    return features


#: The provenance keys of a role's feature (Feature.source): what role_values needs to cut it.
ROLE_KEY, VARIABLE_KEY, STEPS_KEY, CROP_KEY = "sample_role", "variable", "steps", "crop"


def role_features(
    roles: Mapping[str, RoleConfig], grid: SampleGrid, variables: Sequence[VariablePlan], concat_dim: str
) -> list[Feature]:
    """Each role's features, role by role, each in the order the role lists its variables."""
    by_name = {v.name: v for v in variables}
    concat = grid.axis(concat_dim) if concat_dim in {a.dim for a in grid.axes} else None
    taken = [s - concat.anchor for s in concat.steps] if concat is not None and concat.role == "offsets" else None
    features = []
    for role_name, role in roles.items():
        for name in role.variables:
            variable = by_name.get(name)
            if variable is None:
                raise UserError(f"sample.roles.{role_name}.variables: {name!r} is not a variable of the sample")
            feature = variable.feature
            source = {**feature.source, ROLE_KEY: role_name, VARIABLE_KEY: name}
            shape = list(feature.shape)
            if taken is not None and concat_dim in feature.dims:
                steps = [taken.index(o) for o in role.offsets.get(concat_dim, [0])]
                shape[feature.dims.index(concat_dim)] = len(steps)
                source[STEPS_KEY] = {concat_dim: steps}
            crop = {}
            for dim, size in role.crop.items():
                if dim in feature.dims:
                    start = (shape[feature.dims.index(dim)] - size) // 2
                    crop[dim] = [start, start + size]
                    shape[feature.dims.index(dim)] = size
            if crop:
                source[CROP_KEY] = crop
            features.append(dataclasses.replace(feature, name=f"{role_name}/{name}", shape=tuple(shape), source=source))
    return features


#: A role's stacked feature's source: its channels' variables (layout.stack within a role), and their axis.
CHANNELS_KEY, CHANNEL_AXIS_KEY = "channels", "channel_axis"


def stack_roles(features: list[Feature], stacks: Sequence[StackPlan]) -> list[Feature]:
    """layout.stack within each role: a role holding every variable of a stack writes them as one feature,
    ``<role>/<stack name>``, in place of its first; a role holding some of them keeps those apart."""
    out = list(features)
    for stack in stacks:
        for role in dict.fromkeys(f.source[ROLE_KEY] for f in features):
            members = [next((f for f in out if f.name == f"{role}/{name}"), None) for name in stack.variables]
            if None in members:
                continue
            first = members[0]
            if stack.axis == 0:
                shape, dims = (len(members), *first.shape), ("channel", *first.dims)
            else:
                shape, dims = (*first.shape, len(members)), (*first.dims, "channel")
            source = {key: value for key, value in first.source.items() if key in (ROLE_KEY, STEPS_KEY, CROP_KEY)}
            source.update({CHANNELS_KEY: list(stack.variables), CHANNEL_AXIS_KEY: stack.axis})
            source["variables"] = {f.name: f.source for f in members}
            stacked = Feature(f"{role}/{stack.feature.name}", first.dtype, shape, dims, "variable", source)
            at = out.index(first)
            out = [f for f in out if f not in members]
            out.insert(at, stacked)
    return out


def is_role_stack(feature: Feature) -> bool:
    """Whether ``feature`` is a role's stacked feature (stack_roles)."""
    return ROLE_KEY in feature.source and CHANNELS_KEY in feature.source


def channel_dims(feature: Feature) -> tuple[str, ...]:
    """A stacked feature's dims without its channel axis: each channel's."""
    return tuple(d for d in feature.dims if d != "channel")


def channel_feature(feature: Feature) -> Feature:
    """One channel of a role's stacked feature: its dims and shape without the channel axis."""
    shape = tuple(n for n, d in zip(feature.shape, feature.dims) if d != "channel")
    return dataclasses.replace(feature, dims=channel_dims(feature), shape=shape)


def role_values(feature: Feature, values: np.ndarray) -> np.ndarray:
    """A role's feature from its variable's values over the whole sample (samples first, then feature.dims);
    a stacked one's from each channel's (``values``: a mapping of variable to values)."""
    source = feature.source
    if is_role_stack(feature):
        cut = {key: value for key, value in source.items() if key in (STEPS_KEY, CROP_KEY)}
        channel = dataclasses.replace(channel_feature(feature), source=cut)
        axis = 1 if source[CHANNEL_AXIS_KEY] == 0 else -1
        return np.stack([role_values(channel, values[name]) for name in source[CHANNELS_KEY]], axis=axis)
    index = (slice(None), *role_index(feature))
    return values[index] if len(index) > 1 else values


def role_index(feature: Feature) -> tuple:
    """Where a role's (unstacked) feature lies in one sample of its variable: per dim, its steps or crop."""
    source, index = feature.source, []
    for dim in feature.dims:
        if dim in source.get(STEPS_KEY, {}):
            index.append(np.asarray(source[STEPS_KEY][dim]))
        elif dim in source.get(CROP_KEY, {}):
            index.append(slice(*source[CROP_KEY][dim]))
        else:
            index.append(slice(None))
    return tuple(index)


def stored_cells(features: Sequence[Feature], variable: str, shape: Sequence[int]) -> np.ndarray | None:
    """Which cells of one sample of ``variable`` (``shape``: its whole sample's) some record feature stores: the
    union of its role features' steps and crops; None where every cell is stored (no roles)."""
    stored = np.zeros(tuple(shape), dtype=bool)
    found = False
    for feature in features:
        if ROLE_KEY not in feature.source:
            continue
        if is_role_stack(feature):
            if variable not in feature.source[CHANNELS_KEY]:
                continue
            cut = {key: value for key, value in feature.source.items() if key in (STEPS_KEY, CROP_KEY)}
            feature = dataclasses.replace(channel_feature(feature), source=cut)
        elif variable_of(feature) != variable:
            continue
        stored[role_index(feature)] = True
        found = True
    return stored if found and not stored.all() else None


def variable_of(feature: Feature) -> str:
    """The variable a feature holds values of: its own name, or for a role's feature, its variable's."""
    return feature.source.get(VARIABLE_KEY, feature.name) if ROLE_KEY in feature.source else feature.name
