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


def expected_length(feature: Feature, dim: str, axes: dict) -> tuple[int | None, str] | None:
    """(the length ``feature`` must have along ``dim``, what says so); None where nothing states one."""
    if dim == CHANNEL_DIM and "channels" in feature.source:
        return len(feature.source["channels"]), "its channels"
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
            expected = expected_length(feature, dim, axes)
            if expected is not None and expected[0] is not None and size != expected[0]:
                raise UserError(
                    f"{where}: feature {feature.name!r} is {size} long along {dim!r} (shape {list(feature.shape)}), "
                    f"but {expected[1]} says {expected[0]}; build the output again"
                )
