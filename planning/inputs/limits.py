"""Sizes past which planning refuses a dataset: metadata declaring them is wrong or the plan could not be held."""

from __future__ import annotations

from collections.abc import Mapping

from schemas.errors import UserError

#: Positions along one dim: planning holds arrays of this length (a dim's coordinate, its positions),
#: and a store's metadata may declare any size it likes for a dim without a coordinate.
MAX_POSITIONS = 2**31

#: Work units of one build (planning holds per-dim spans, not one object per unit; runners get ranges of them).
MAX_UNITS = 2**31


def check_dim_sizes(where: str, sizes: Mapping[str, int]) -> None:
    """Refuse a dim longer than MAX_POSITIONS, before anything of its length is allocated."""
    for dim, size in sizes.items():
        if size > MAX_POSITIONS:
            raise UserError(
                f"{where}: dim {dim!r} has {size:,} elements, over the {MAX_POSITIONS:,} a build can plan; "
                "its metadata is likely wrong: fix it, or copy the part you need to a smaller input"
            )
