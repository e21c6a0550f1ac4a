"""sample.roles: inputs, targets and forcings of one sample, each its variables at its own steps and crop.

The sample is cut once, over every step any role takes (the config joins the roles' offsets into
``sample.offsets``) and the whole window; each role's feature ``<role>/<variable>`` is then that
variable's values at the role's steps and, with ``crop``, the centred part of the window. A sample
exists where all its steps exist, so where every role's do. Statistics stay per variable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from planning.config.model import RoleConfig
from planning.run.variables import VariablePlan
from planning.sampling import SampleGrid
from schemas.errors import UserError
from schemas.schema import Feature

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


def role_values(feature: Feature, values: np.ndarray) -> np.ndarray:
    """A role's feature from its variable's values over the whole sample (samples first, then feature.dims)."""
    source = feature.source
    index: list = [slice(None)]
    for dim in feature.dims:
        if dim in source.get(STEPS_KEY, {}):
            index.append(np.asarray(source[STEPS_KEY][dim]))
        elif dim in source.get(CROP_KEY, {}):
            index.append(slice(*source[CROP_KEY][dim]))
        else:
            index.append(slice(None))
    return values[tuple(index)] if len(index) > 1 else values


def variable_of(feature: Feature) -> str:
    """The variable a feature holds values of: its own name, or for a role's feature, its variable's."""
    return feature.source.get(VARIABLE_KEY, feature.name) if ROLE_KEY in feature.source else feature.name
