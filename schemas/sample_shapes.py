"""Each feature's length along the sample's axes, as schema.json's ``sample.axes`` states it."""

from __future__ import annotations

from schemas.errors import UserError
from schemas.schema import Feature, Schema

#: The dim of a stacked feature's channels (planning.layout), the one dim not among the sample's axes.
CHANNEL_DIM = "channel"


def axis_extent(axis: dict) -> int | None:
    """How long a feature is along this sample axis (schema.json's sample.axes); None: no feature holds it."""
    role = axis.get("role")
    if role == "window":
        return axis.get("size")
    if role == "offsets":
        return len(axis.get("offsets", ()))
    if role == "keep":
        return axis.get("length")
    return None  # iterate: one sample per index


def sample_axes(schema: Schema) -> dict:
    """{dim: axis} of schema.json's sample.axes; empty where not recorded (an output written by hand)."""
    return {axis.get("dim"): axis for axis in schema.sample.get("axes", ()) if isinstance(axis, dict)}


def shaped_as(feature: Feature, schema: Schema) -> Feature:
    """The feature whose shape ``feature`` has: a mask's, the feature it masks (its steps, crop, channels)."""
    of = feature.source.get("of") if feature.role == "mask" else None
    return next((f for f in schema.features if f.name == of and f is not feature), feature)


def expected_length(feature: Feature, dim: str, axes: dict) -> tuple[int | None, str] | None:
    """(the length ``feature`` (as ``shaped_as`` gives it) must have along ``dim``, what says so); None where
    nothing states one."""
    source = feature.source
    if dim == CHANNEL_DIM and "channels" in source:
        return len(source["channels"]), "its channels"
    steps = source.get("steps")
    if isinstance(steps, dict) and isinstance(steps.get(dim), list):  # a role's own steps of the sample (roles)
        return len(steps[dim]), f"its steps along {dim!r}"
    crop = source.get("crop")
    if isinstance(crop, dict) and _is_range(crop.get(dim)):  # a role's crop of the window
        return crop[dim][1] - crop[dim][0], f"its crop along {dim!r}"
    if dim in axes:
        return axis_extent(axes[dim]), f"sample.axes ({axes[dim].get('role')})"
    return None


def check_axis_lengths(schema: Schema, where: str) -> None:
    """UserError where a feature's length along a dim differs from what sample.axes says of that dim.

    Records hold each feature's values flat: a shape permuted in schema.json with the same number of values
    decodes without error, into the wrong places. Every reader checks this (cheap: schema.json alone);
    dims that sample.axes does not state are left to verify.
    """
    axes = sample_axes(schema)
    if not axes:
        return
    for feature in schema.features:
        for dim, size in zip(feature.dims, feature.shape):
            expected = expected_length(shaped_as(feature, schema), dim, axes)
            if expected is not None and expected[0] is not None and size != expected[0]:
                raise UserError(
                    f"{where}: feature {feature.name!r} is {size} long along {dim!r} (shape {list(feature.shape)}), "
                    f"but {expected[1]} says {expected[0]}; build the output again"
                )


def _is_range(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value)
