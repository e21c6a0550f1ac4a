"""ComputeStats: per-variable count, mean, variance, min, max and NaN count over the written samples.

Each block is summarised in float64 (count, mean, M2), and summaries merge pairwise with Chan
et al.'s update, which stays accurate where a float32 sum of squares loses (mean/std)^2 in
relative precision (DESIGN.md, decision 4). The values summarised are those stored (after the
cast to the record dtype), so the statistics describe exactly what a reader will see.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import apache_beam as beam
import numpy as np
import xarray as xr


@dataclasses.dataclass(frozen=True)
class Moments:
    """Summary of a set of values that merges exactly with another."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    minimum: float = math.inf
    maximum: float = -math.inf
    nan_count: int = 0
    #: infinite values (float64 beyond float32's range, with output.allow_float32_overflow)
    inf_count: int = 0

    @classmethod
    def of(cls, values: np.ndarray) -> Moments:
        """Moments of the finite values; NaN and inf are counted apart."""
        x = np.asarray(values, dtype=np.float64).reshape(-1)
        finite = np.isfinite(x)
        nan_count = inf_count = 0
        if not finite.all():
            nan_count = int(np.isnan(x).sum())
            inf_count = len(x) - int(finite.sum()) - nan_count
            x = x[finite]
        if not len(x):
            return cls(nan_count=nan_count, inf_count=inf_count)
        mean = float(x.mean())
        centred = x - mean
        m2 = float(np.dot(centred, centred))
        return cls(len(x), mean, m2, float(x.min()), float(x.max()), nan_count, inf_count)

    def merge(self, other: Moments) -> Moments:
        nan_count = self.nan_count + other.nan_count
        inf_count = self.inf_count + other.inf_count
        if not other.count:
            return dataclasses.replace(self, nan_count=nan_count, inf_count=inf_count)
        if not self.count:
            return dataclasses.replace(other, nan_count=nan_count, inf_count=inf_count)
        count = self.count + other.count
        delta = other.mean - self.mean
        return Moments(
            count=count,
            mean=self.mean + delta * other.count / count,
            m2=self.m2 + other.m2 + delta * delta * self.count * other.count / count,
            minimum=min(self.minimum, other.minimum),
            maximum=max(self.maximum, other.maximum),
            nan_count=nan_count,
            inf_count=inf_count,
        )

    def to_json(self) -> dict:
        variance = self.m2 / self.count if self.count else None
        return {
            "count": self.count,
            "mean": self.mean if self.count else None,
            "variance": variance,
            "std": math.sqrt(variance) if variance is not None else None,
            "min": self.minimum if self.count else None,
            "max": self.maximum if self.count else None,
            "nan_count": self.nan_count,
            "inf_count": self.inf_count,
        }


def block_moments(block: xr.Dataset, variables: list[str]) -> dict[str, Moments]:
    return {name: Moments.of(block[name].values) for name in variables}


def merge_moments(parts: list[Mapping[str, Moments]]) -> dict[str, Moments]:
    merged: dict[str, Moments] = {}
    for part in parts:
        for name, moments in part.items():
            merged[name] = merged[name].merge(moments) if name in merged else moments
    return merged


def stats_document(moments: Mapping[str, Moments], variables: list[str]) -> dict:
    """The content of stats.json."""
    return {
        "description": (
            "population statistics (ddof=0) of the finite stored values over all written samples, "
            "accumulated in float64; a value in overlapping samples counts once per sample; "
            "NaN and inf values are counted apart"
        ),
        "variables": {name: moments.get(name, Moments()).to_json() for name in variables},
    }


class _MergeMomentsFn(beam.CombineFn):
    def create_accumulator(self):
        return {}

    def add_input(self, accumulator, element):
        return merge_moments([accumulator, element])

    def merge_accumulators(self, accumulators):
        return merge_moments(list(accumulators))

    def extract_output(self, accumulator):
        return accumulator


class ComputeStats(beam.PTransform):
    """Blocks -> one {variable: Moments} dict over every sample."""

    def __init__(self, variables: list[str]):
        super().__init__()
        self._variables = list(variables)

    def expand(self, blocks):
        variables = self._variables
        return (
            blocks
            | "BlockMoments" >> beam.Map(block_moments, variables)
            | "MergeMoments" >> beam.CombineGlobally(_MergeMomentsFn())
        )
