"""Predictions back on the grid: keyed samples reassembled into an xarray Dataset on the output's source grid.

    import schemas
    ds = schemas.reassemble("out/patches", schemas.Reader("out/patches", "valid"), split="valid")

Every record carries ``index/<dim>``, its start on the selected grid along each sample dim; with
schema.json's ``grid`` (every cell's coordinate) that is all it takes to put a sample back. Overlapping
samples are blended with weights per window dim, normalised per cell; ``coverage`` counts the samples
that touched each cell (0: none, and the values there are NaN). xarray is imported here only: the base
install reads outputs without it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from schemas.errors import UserError
from schemas.grid import coordinate_attrs, coordinate_values
from schemas.schema import Feature, Schema

if TYPE_CHECKING:
    import xarray as xr

BLENDS = ("mean", "cosine", "gaussian")
#: MONAI's sliding-window gaussian: sigma as a fraction of the window.
GAUSSIAN_SIGMA = 0.125
#: A dim a prediction adds (more channels than the records had), unless ``dims`` names it.
EXTRA_DIM = "channel"
COVERAGE = "coverage"
#: Layouts: samples on the source grid, or (for pairs and sequences along the concat dim) as forecasts.
LAYOUTS = ("grid", "forecast")
#: The forecast layout's dims, as WeatherBench-X's PredictionsFromXarray opens them.
INIT_TIME, LEAD_TIME, VALID_TIME = "init_time", "lead_time", "valid_time"
AREA_WEIGHT = "area_weight"
#: Samples placed together (their index arrays: some 30 bytes per value of the batch).
BATCH = 128
#: Roles whose dim every sample holds whole (no position along it).
_WHOLE = ("keep", "lead")
#: (time features: functions of the sample's coordinates, which the grid holds; their names, time_features/<name>,
#: would be folders in a Zarr store)
_SKIPPED_ROLES = ("index", "coord", "count", "time_feature")
#: A role's feature's source (sample.roles): its role, its variable, its steps along the concat dim (places among
#: the sample's offsets) and its crop of the window ([start, stop) of the window's cells).
_ROLE_KEY, _VARIABLE_KEY, _STEPS_KEY, _CROP_KEY = "sample_role", "variable", "steps", "crop"


def import_xarray():
    try:
        import xarray
    except ImportError:
        raise UserError(
            "reassembly needs xarray, which the base install leaves out: pip install 'xarray-tfrecords[reassemble]'"
        ) from None
    return xarray


def window_weights(size: int, blend: str) -> np.ndarray:
    """Weights along one window dim: ones (mean), a Hann window (cosine) or a gaussian, none of them zero."""
    if blend == "mean":
        return np.ones(size)
    centre = (np.arange(size) + 0.5) / size  # cell centres in (0, 1): the edge cells keep a weight above 0
    if blend == "cosine":
        return np.sin(np.pi * centre) ** 2
    if blend == "gaussian":
        return np.exp(-0.5 * ((centre - 0.5) / GAUSSIAN_SIGMA) ** 2)
    raise UserError(f"blend: {blend!r} is not one of {', '.join(BLENDS)}; choose one of those")


@dataclasses.dataclass(frozen=True)
class GridAxis:
    """One sample dim of the output grid: its role, and the cells reassembly covers ([first, first + length))."""

    dim: str
    role: str
    length: int
    first: int = 0
    size: int = 1
    stride: int = 1
    positions: int = 0
    offsets: tuple[int, ...] = ()
    #: the dim whose index/<dim> places samples along this one (the forecast layout's init_time: the concat dim)
    key: str = ""
    #: the cell index/<dim> 0 is (above 0 after an append added steps before the output's first)
    origin: int = 0

    @property
    def index_name(self) -> str:
        return f"index/{self.key or self.dim}"

    @property
    def whole(self) -> bool:
        return self.role in _WHOLE

    @classmethod
    def of(cls, entry: dict) -> GridAxis:
        return cls(
            entry["dim"],
            entry["role"],
            entry["length"],
            size=entry.get("size", 1),
            stride=entry.get("stride", 1),
            positions=entry.get("positions", entry["length"]),
            offsets=tuple(entry.get("offsets", ())),
            origin=entry.get("index_origin", 0),
        )

    def reach(self) -> tuple[int, int]:
        """Cells a sample starting at 0 covers along this dim: [low, high)."""
        if self.role == "window":
            return 0, self.size
        if self.role in ("offsets", "init"):
            return min(self.offsets), max(self.offsets) + 1
        return 0, 1

    def holds(self, starts: np.ndarray) -> np.ndarray:
        """Which of ``starts`` are sample positions of the output along this dim."""
        low, high = self.reach()
        held = (self.first - low <= starts) & (starts + high <= self.first + self.length)
        if self.role == "window":
            held &= (starts % self.stride == 0) & (starts // self.stride < self.positions)
        return held

    def check(self, start: int, where: str) -> None:
        """UserError unless ``start`` is a sample position of the output along this dim."""
        low, high = self.reach()
        held = self.first - low <= start and start + high <= self.first + self.length
        if self.role == "window":
            held = held and start % self.stride == 0 and start // self.stride < self.positions
        if not held:
            raise UserError(
                f"{where}: {self.index_name} = {start - self.origin} is not a sample of the output (along "
                f"{(self.key or self.dim)!r} it holds {self._described()}); reassemble samples of this output only"
            )

    def _described(self) -> str:
        if self.role == "window":
            return f"windows of {self.size} every {self.stride} from {-self.origin}, {self.positions} of them"
        low, high = self.reach()
        return f"starts {self.first - low - self.origin} to {self.first + self.length - high - self.origin}"

    def local_cells(self) -> np.ndarray:
        """Cells a sample covers along this dim, from its start."""
        if self.role == "window":
            return np.arange(self.size)
        if self.role == "offsets":
            return np.asarray(self.offsets)
        return np.zeros(1, dtype=np.int64)

    def span(self) -> int:
        """Positions along this dim within which two samples may overlap (1: never)."""
        if self.role == "window":
            return -(-self.size // self.stride)
        if self.role == "offsets":
            return max(self.offsets) - min(self.offsets) + 1
        return 1


@dataclasses.dataclass
class Target:
    """One variable being reassembled: the weighted sum and the weights of the samples that touched each cell."""

    name: str
    dims: tuple[str, ...]  # on the grid, in the files' order; a prediction's added dims last
    sample_dims: tuple[str, ...]  # as the samples hold it
    attrs: dict
    dtype: str
    is_coordinate: bool = False
    source_dtype: str | None = None
    total: np.ndarray | None = None
    weight: np.ndarray | None = None


class Reassembly:
    """Samples added one by one (any order, from any reader) -> an xr.Dataset on the output's grid."""

    def __init__(
        self,
        schema: Schema,
        split: str | None = None,
        blend: str = "mean",
        dims: Mapping[str, Sequence[str]] | None = None,
        where: str = "output",
        layout: str = "grid",
        region: tuple[str | None, int, int] | None = None,
        records: bool = False,
    ):
        """``region``: (dim, start, stop): reassemble only those cells of a grid dim (one output chunk); samples
        reaching beyond them add only their part inside. ``records``: the samples are the output's own records
        (whose roles agree wherever they share a cell), not a model's predictions."""
        if blend not in BLENDS:
            raise UserError(f"blend: {blend!r} is not one of {', '.join(BLENDS)}; choose one of those")
        if layout not in LAYOUTS:
            raise UserError(f"layout: {layout!r} is not one of {', '.join(LAYOUTS)}; choose one of those")
        if not schema.grid:
            raise UserError(
                f"{where}: schema.json has no grid (the output was built before reassembly existed); build it again"
            )
        self.records = records
        # With sample.roles each feature <role>/<variable> holds its variable at its role's steps and crop: it is
        # placed as that variable, at those cells only.
        self._roles = bool(schema.sample.get("roles"))
        self._roles_seen: dict[str, dict[str, tuple[int, ...]]] = {}  # variable -> {feature: its cells in time}
        self.schema, self.split, self.blend, self.where = schema, split, blend, where
        self.dims = {name: tuple(d) for name, d in (dims or {}).items()}
        self.axes = self._axes(schema, split)
        self.renamed: dict[str, str] = {}  # a sample dim -> its dim here (the forecast layout's lead_time)
        if layout == "forecast":
            self._as_forecasts(where)
        self.layout = layout
        self.checked = [a for a in self.axes.values() if not a.whole]  # keys are checked on the whole grid
        self.whole_grid = dict(self.axes)
        if region is not None:
            dim, start, stop = region
            dim = dim or (self.checked[0].dim if self.checked else None)  # None: the first placed dim
            axis = self.axes[dim]
            self.axes[dim] = dataclasses.replace(axis, first=axis.first + start, length=stop - start)
        self.grid_axes = [a for a in self.axes.values() if not a.whole]
        self.keys: dict[tuple[int, ...], str] = {}  # each sample's key -> where it came from (errors name both)
        self.targets: dict[str, Target] = {}
        self.taken: set[str] = set()  # variables finished and given out (take_finished)
        self.extra_sizes: dict[str, int] = {}
        self.coverage = np.zeros([a.length for a in self.grid_axes], dtype=np.int32)
        self._weights: dict[tuple, np.ndarray] = {}
        self._features = {f.name: f for f in schema.features}
        self._placed_dims = {a.dim for a in self.grid_axes}
        self._masks = {f.name: f.source.get("of") for f in schema.features if f.role == "mask"}
        # No two samples share a cell of a variable over every placed dim: windows no longer than their stride, one
        # offset. Each such cell is then set once, to its sample's value.
        self._disjoint = all(a.span() == 1 for a in self.checked)

    def _axes(self, schema: Schema, split: str | None) -> dict[str, GridAxis]:
        axes = {e["dim"]: GridAxis.of(e) for e in schema.sample["axes"]}
        if split is None:
            return axes
        if split not in schema.splits:
            have = ", ".join(schema.splits) or "none"
            raise UserError(f"{self.where}: no split {split!r}; it has: {have}; choose one of those")
        info = schema.sample.get("splits", {}).get(split)
        dim = schema.sample.get("split_dim", schema.sample["concat_dim"])
        if info is None or dim not in axes:
            return axes
        axis = axes[dim]
        start, stop = (i + axis.origin for i in info["index_range"])
        low, high = axis.reach()
        first, last = max(0, start + low), min(axis.length, stop - 1 + high)
        axes[dim] = dataclasses.replace(axis, first=first, length=max(0, last - first))
        return axes

    def _as_forecasts(self, where: str) -> None:
        """The concat dim's offsets as lead_time, each sample's index along it as its init_time."""
        concat_dim = self.schema.sample["concat_dim"]
        axis = self.axes.get(concat_dim)
        if axis is None or axis.role != "offsets":
            raise UserError(
                f"{where}: layout 'forecast' needs samples with offsets along {concat_dim!r} (sample.offsets), "
                "which this output's samples do not have; use layout 'grid'"
            )
        axes = {}
        for dim, each in self.axes.items():
            if dim == concat_dim:
                axes[INIT_TIME] = dataclasses.replace(axis, dim=INIT_TIME, role="init", key=concat_dim)
                axes[LEAD_TIME] = dataclasses.replace(axis, dim=LEAD_TIME, role="lead", key=concat_dim)
            else:
                axes[dim] = each
        self.axes = axes
        self.renamed = {concat_dim: LEAD_TIME}

    # ---- samples in -------------------------------------------------------------------------------------------

    def add_all(self, samples: Iterable[Mapping[str, Any]]) -> Reassembly:
        """Add samples: dicts of one sample, or batches of them (every array with a leading sample axis)."""
        first = self.checked[0].index_name if self.checked else None
        for sample in samples:
            index = sample.get(first) if first else None
            if index is None or np.ndim(index) == 0:
                self.add(sample)
                continue
            for begin in range(0, len(index), BATCH):
                self.add_batch({name: values[begin : begin + BATCH] for name, values in sample.items()})
        return self

    def checked_axis(self, dim: str) -> GridAxis:
        """A placed dim of the whole grid (before any region)."""
        return next(a for a in self.checked if a.dim == dim)

    def check_keys(self, batch: Mapping[str, Any]) -> np.ndarray:
        """(samples, placed dims): each sample's starts; UserError unless the output holds every such sample."""
        columns = []
        for axis in self.checked:
            name = axis.index_name
            if name not in batch:
                raise UserError(
                    f"{self.where}: a sample lacks {name} (it has: {', '.join(batch) or 'nothing'}); "
                    "keep the records' index features beside each prediction"
                )
            starts = np.asarray(batch[name]).reshape(-1).astype(np.int64) + axis.origin
            if not axis.holds(starts).all():
                bad = int(np.flatnonzero(~axis.holds(starts))[0])
                axis.check(int(starts[bad]), f"{self.where}: sample {self._key_text(batch, bad)}")
            columns.append(starts)
        return np.stack(columns, axis=1) if columns else np.zeros((1, 0), dtype=np.int64)

    def check_key(self, sample: Mapping[str, Any]) -> tuple[int, ...]:
        """One sample's starts along every placed dim (check_keys of one)."""
        return tuple(
            self.check_keys({k: np.asarray(v).reshape(1) for k, v in sample.items() if k.startswith("index/")})[0]
        )

    def add(self, sample: Mapping[str, Any]) -> None:
        """One sample: its index/<dim> for every sample dim, and arrays shaped like the output's features."""
        self.add_batch({name: np.asarray(values)[None] for name, values in sample.items()})

    def add_batch(self, batch: Mapping[str, Any]) -> None:
        """Samples with a leading axis: their keys counted, then their arrays placed (``count`` and ``place``)."""
        batch = {name: np.asarray(values) for name, values in batch.items()}
        self.place(batch, self.count(batch))

    def count(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Samples' keys (index/<dim>, with a leading axis): checked, each taken once, counted in ``coverage``;
        returns their starts (``check_keys``). Their arrays are placed by ``place``, in as many passes as wanted."""
        starts = self.check_keys(batch)
        for i, key in enumerate(map(tuple, starts.tolist())):
            first = self.keys.get(key)
            if first is not None:
                also = "" if first == self.where else f" (also in {first})"
                raise UserError(
                    f"{self.where}: sample {self._key_text(batch, i)} was given twice{also}; give each sample once "
                    "(duplicate keys: two readers over one split, or a prediction written twice)"
                )
            self.keys[key] = self.where
        if len(starts) > 1 and len(set(map(tuple, starts.tolist()))) < len(starts):
            raise UserError(f"{self.where}: a batch holds one sample twice; give each sample once")
        grid = [a.dim for a in self.grid_axes]
        for rows in self._rounds(starts):
            windows = self._windows(grid, starts[rows], self.coverage.shape)
            if windows is not None:  # every sample whole inside: all counted at once
                sizes, index = windows
                sliding_window_view(self.coverage, sizes, writeable=True)[index] += 1  # (a round: no cell twice)
                continue
            for box in self._boxes(grid, starts[rows]):
                if box is not None:
                    self.coverage[box[0]] += 1  # (no two samples of a round share a cell)
        return starts

    def place(self, batch: Mapping[str, Any], starts: np.ndarray | None = None) -> None:
        """Samples whose keys were counted: their arrays (any of them) blended into their variables, in rounds of
        samples that cannot overlap. ``starts``: as ``count`` returned them (else found again)."""
        batch = {name: np.asarray(values) for name, values in batch.items()}
        starts = self.check_keys(batch) if starts is None else starts
        masks = {of: batch[name] for name, of in self._masks.items() if name in batch}
        for rows in self._rounds(starts):
            whole = len(rows) == len(starts)  # (one round: the batch as it is, no copy)
            at = starts[rows]
            boxes: dict[tuple[str, ...], list] = {}
            for name, values in batch.items():
                feature = self._features.get(name)
                if not self._placed(name, feature):
                    continue
                values = values if whole else values[rows]
                if name in masks:
                    mask = masks[name] if whole else masks[name][rows]
                    values = np.where(mask != 0, np.nan, values.astype(np.float64))
                for target, part, cells in self._parts(name, feature, values):
                    self._place(target, part, at, boxes, cells)

    def check_shapes(self, batch: Mapping[str, Any]) -> None:
        """UserError unless every array of the samples would be placed (``place``) without one: names, shapes and
        dims checked as placing them would, without placing them."""
        for name, values in batch.items():
            feature = self._features.get(name)
            if not self._placed(name, feature):
                continue
            values = np.asarray(values)
            for target, part, cells in self._parts(name, feature, values):
                self._check_sample_shape(target, part, cells)

    def _check_sample_shape(self, target: Target, values: np.ndarray, cells: tuple = ()) -> None:
        cut = dict(cells)
        want = tuple(
            len(cut[d]) if d in cut else self._dim_size(d) or self.extra_sizes.get(d) for d in target.sample_dims
        )
        if values.shape[1:] != want:
            raise UserError(
                f"{self.where}: {target.name!r} has shape {values.shape[1:]}, unlike its first sample's {want}; "
                "give every sample one shape"
            )

    def _rounds(self, starts: np.ndarray) -> Iterator[np.ndarray]:
        """Rows of ``starts`` in rounds: samples whose positions agree modulo the overlap span along every dim
        never overlap, so each round's samples touch disjoint cells."""
        spans = [a.span() for a in self.checked]
        positions = [
            starts[:, j] // (a.stride if a.role == "window" else 1) % span
            for j, (a, span) in enumerate(zip(self.checked, spans))
        ]
        rounds = np.ravel_multi_index(positions, spans) if positions else np.zeros(len(starts), dtype=np.int64)
        for value in np.unique(rounds):
            yield np.flatnonzero(rounds == value)

    def _placed(self, name: str, feature: Feature | None) -> bool:
        """Whether an array of the samples is placed (not a key, coordinate, count or mask of another)."""
        if feature is not None and feature.role in (*_SKIPPED_ROLES, "mask"):
            return False
        # An aux_coord the grid holds is a static coordinate: schema.json's grid holds it exactly.
        return not (feature is not None and feature.role == "aux_coord" and name in self.schema.grid)

    def placed_groups(self, names: Iterable[str]) -> list[tuple[str, ...]]:
        """The arrays among ``names`` placed together, one group per variable (with its mask, if it has one):
        each group can be placed, finished and let go before the next (``place``, then ``take_finished``)."""
        names = list(names)
        groups: list[tuple[str, ...]] = []
        variables: list[set[str]] = []  # the variables each group places into
        for name in names:
            feature = self._features.get(name)
            if self._placed(name, feature):
                masks = [m for m, of in self._masks.items() if of == name and m in names]
                into = self._variables_of(name, feature)
                # Features placing into one variable (roles' features of it) are one group: finished once.
                joined = [i for i, held in enumerate(variables) if held & into]
                group = (*[n for i in joined for n in groups[i]], name, *masks)
                into = into.union(*(variables[i] for i in joined))
                groups = [g for i, g in enumerate(groups) if i not in joined] + [group]
                variables = [v for i, v in enumerate(variables) if i not in joined] + [into]
        return groups

    @staticmethod
    def _variables_of(name: str, feature: Feature | None) -> set[str]:
        """The variables an array is placed as: a stack's channels, a role's feature's variable, else its name."""
        if feature is None:
            return {name}
        channels = feature.source.get("channels")
        return set(channels) if channels else {feature.source.get(_VARIABLE_KEY, name)}

    def _boxes(self, dims: Sequence[str], at: np.ndarray, cells: tuple = ()) -> list[tuple[tuple, tuple] | None]:
        """Per sample (starts ``at``): the cells it covers inside the grid (or region) as an index into an array
        over ``dims``, and the same cells' index into the sample's own block (its dims as ``dims``, one cell along an
        iterated dim); None where it covers none. Slices wherever the cells are evenly spaced (windows always).
        ``cells``: (dim, cells) of a role's feature, which holds only those of the sample's cells along them."""
        placed = [a.dim for a in self.checked]
        cut = dict(cells)
        per_dim = []
        for dim in dims:
            axis = self.axes.get(dim)
            if axis is None or axis.whole:
                # (a role's steps along a dim every sample holds whole: those cells of it, the same in each sample)
                per_dim.append(None if dim not in cut else [(np.asarray(cut[dim]), slice(None))] * len(at))
                continue
            starts = at[:, placed.index(dim)] - axis.first
            local = np.asarray(cut[dim]) if dim in cut else axis.local_cells()
            per_dim.append(_cells_inside(starts, local, axis.length))
        everything = (slice(None), slice(None))
        columns = [itertools.repeat(everything, len(at)) if each is None else each for each in per_dim]
        # Per sample: its (array cells, sample cells) along each dim, transposed to (array index, sample index).
        return [None if None in cells else tuple(zip(*cells)) for cells in zip(*columns)]

    def _windows(self, dims: Sequence[str], at: np.ndarray, shape: Sequence[int]) -> tuple[tuple, tuple] | None:
        """Where every sample (starts ``at``) lies whole inside an array over ``dims`` (the grid or region), on
        cells one apart: the sample's extent along each dim, and each one's first cells as an index into the
        array's sliding windows of that extent (numpy's sliding_window_view); else None. ``shape``: the array's."""
        if self._roles:  # (a role's feature holds some of the sample's cells: placed by boxes)
            return None
        placed = [a.dim for a in self.checked]
        sizes, index = [], []
        for dim in dims:
            axis = self.axes.get(dim)
            if axis is None or axis.whole:  # (whole in every sample: the array's own length along it)
                sizes.append(shape[len(sizes)])
                index.append(0)
                continue
            cells = axis.local_cells()
            if len(cells) > 1 and not (np.diff(cells) == 1).all():
                return None
            first = at[:, placed.index(dim)] - axis.first + int(cells[0])
            if not len(first) or first.min() < 0 or first.max() + len(cells) > axis.length:
                return None
            sizes.append(len(cells))
            index.append(first)
        return tuple(sizes), tuple(index)

    def _key_text(self, sample: Mapping[str, Any], row: int = 0) -> str:
        return (
            "("
            + ", ".join(
                f"{n}={int(np.asarray(v).reshape(-1)[row])}" for n, v in sample.items() if n.startswith("index/")
            )
            + ")"
        )

    def _parts(self, name: str, feature: Feature | None, values: np.ndarray):
        """(target, values in the target's sample dims, cells) for a sample's array: a stack gives one per channel;
        ``cells``: a role's feature's cells of the sample, (dim, local cells) along the dims it holds part of."""
        channels = feature.source.get("channels") if feature is not None else None
        cells = self._role_cells(name, feature) if feature is not None else ()
        if channels and name not in self.dims:
            self._check_shape(name, values, feature.shape)
            axis = 1 + feature.dims.index("channel")
            role = feature.source.get(_ROLE_KEY)
            for i, member in enumerate(channels):
                variables = feature.source["variables"]
                info = variables[member] if member in variables else variables[f"{role}/{member}"]
                dims = tuple(d for d in feature.dims if d != "channel")
                target = self._target(member, dims, info, feature.dtype)
                yield target, np.take(values, i, axis=axis), cells
            return
        if feature is not None and name not in self.dims:
            self._check_shape(name, values, feature.shape)
            is_coordinate = feature.role == "aux_coord"
            named = feature.source.get("coordinate", name) if is_coordinate else feature.source.get(_VARIABLE_KEY, name)
            yield self._target(named, feature.dims, feature.source, feature.dtype, is_coordinate), values, cells
            return
        dims = self.dims.get(name) or self._guess_dims(name, values.shape[1:])
        if len(dims) != values.ndim - 1:
            raise UserError(
                f"{self.where}: {name!r} has shape {values.shape[1:]} but dims {dims} were given for it; "
                "name one dim per axis"
            )
        for dim, size in zip(dims, values.shape[1:]):
            want = self._dim_size(dim)
            if want is None:
                want = self.extra_sizes.setdefault(dim, size)
            if want != size:
                raise UserError(
                    f"{self.where}: {name!r} has {size} along {dim!r} where the output's samples have {want}; "
                    "predict on the output's sample shape"
                )
        template = self.schema.variable_features[0]
        source = {"dims": [*template.source.get("dims", template.dims)], "attrs": {}}
        yield self._target(name, dims, source, "float32"), values, ()

    def _role_cells(self, name: str, feature: Feature) -> tuple:
        """A role's feature's cells of the sample: its role's steps along the concat dim (the forecast layout's
        lead_time: their places among the sample's offsets) and its crop of the window; () for any other feature.
        Two features of one variable that would share a cell are refused, unless they are the output's records."""
        source = feature.source
        if _ROLE_KEY not in source:
            return ()
        cells = []
        for dim, steps in source.get(_STEPS_KEY, {}).items():
            axis = self.whole_grid.get(self.renamed.get(dim, dim))
            if axis is None:
                continue
            if axis.role == "lead":
                cells.append((axis.dim, tuple(int(i) for i in steps)))
            else:
                cells.append((dim, tuple(int(axis.offsets[i]) for i in steps)))
        for dim, (start, stop) in source.get(_CROP_KEY, {}).items():
            cells.append((dim, tuple(range(int(start), int(stop)))))
        cells = tuple(cells)
        for variable in self._variables_of(name, feature):  # (a role's stack: each of its channels' variables)
            self._check_roles_apart(name, variable, cells)
        return cells

    def _check_roles_apart(self, name: str, variable: str, cells: tuple) -> None:
        """UserError where two roles' features of one variable would share its cells (a prediction blended with
        the values the model was given): on the grid any two do; in the forecast layout those with a lead in common."""
        if self.records:  # (the records' roles hold the same values wherever they meet)
            return
        seen = self._roles_seen.setdefault(variable, {})
        steps = next((c for d, c in cells if d in (LEAD_TIME, self.schema.sample["concat_dim"])), ())
        if name in seen:
            return
        for other, its_steps in seen.items():
            if self.layout == "grid" or set(steps) & set(its_steps):
                where = "on the grid" if self.layout == "grid" else "at a lead time"
                raise UserError(
                    f"{self.where}: {other!r} and {name!r} both hold {variable!r} {where}, where their values would "
                    "be blended (a prediction with the values the model was given); reassemble one of them, or "
                    "use layout 'forecast', where each role holds its own lead times"
                )
        seen[name] = steps

    def _dim_size(self, dim: str) -> int | None:
        """Cells a sample holds along ``dim`` (the grid's cells along an iterated one); None: not a dim of the grid."""
        axis = self.axes.get(self.renamed.get(dim, dim))
        if axis is None:
            return None
        if axis.role in ("offsets", "lead"):
            return len(axis.offsets)
        return axis.size if axis.role == "window" else axis.length

    def _check_shape(self, name: str, values: np.ndarray, shape: tuple[int, ...]) -> None:
        if values.shape[1:] != tuple(shape):
            raise UserError(
                f"{self.where}: {name!r} has shape {values.shape[1:]} where the output's feature has {tuple(shape)}; "
                "predict on the output's sample shape, or say its dims (dims=...)"
            )

    def _guess_dims(self, name: str, shape: tuple[int, ...]) -> tuple[str, ...]:
        """A prediction under another name: the first variable's dims, without the kept ones, or with a channel."""
        template = self.schema.variable_features[0]
        unkept = tuple(d for d in template.dims if d not in self.axes or self.axes[d].role != "keep")
        candidates = [
            template.dims,
            unkept,
            (*template.dims, EXTRA_DIM),
            (*unkept, EXTRA_DIM),
        ]
        for dims in candidates:
            sizes = [self._dim_size(d) for d in dims]
            if len(dims) == len(shape) and all(s is None or s == n for s, n in zip(sizes, shape)):
                return dims
        raise UserError(
            f"{self.where}: {name!r} has shape {shape}, which fits no sample shape of the output "
            f"({template.name!r} is {template.shape} over {template.dims}); pass dims={{{name!r}: (...)}} to say which"
        )

    def _target(self, name: str, sample_dims, source: dict, dtype: str, is_coordinate: bool = False) -> Target:
        target = self.targets.get(name)
        if target is not None:
            return target
        if name in self.taken:
            raise RuntimeError(f"{name}: placed again after it was finished; this is a bug, please report it")
        sample_dims = tuple(self.renamed.get(d, d) for d in sample_dims)
        files = source.get("dims") or [*[a.key or a.dim for a in self.grid_axes if a.role == "iterate"], *sample_dims]
        files = [n for d in files for n in ((INIT_TIME, LEAD_TIME) if d in self.renamed else (d,))]
        placed = ("iterate", "init")
        on_grid = [d for d in files if d in sample_dims or (d in self.axes and self.axes[d].role in placed)]
        dims = (*on_grid, *[d for d in sample_dims if d not in on_grid])
        attrs = dict(source.get("attrs", {}))
        target = Target(name, dims, tuple(sample_dims), attrs, dtype, is_coordinate, source.get("dtype"))
        sizes = [self._dim_size(d) if d not in self.axes or self.axes[d].whole else self.axes[d].length for d in dims]
        sizes = [self.extra_sizes[d] if s is None else s for d, s in zip(dims, sizes)]
        target.total = np.zeros(sizes, dtype=np.float32 if dtype == "float32" else np.float64)
        target.weight = np.zeros([s if self._weighed_along(d) else 1 for d, s in zip(dims, sizes)])
        self.targets[name] = target
        return target

    def _window_weight(self, target: Target, cells: tuple = ()) -> np.ndarray:
        """The weight of one sample's cells (of a role's crop: those of the window), shaped to broadcast against
        the block it adds to ``target``."""
        found = self._weights.get((target.dims, cells))
        if found is None:
            cut = dict(cells)
            found = np.ones([1] * len(target.dims))
            for i, dim in enumerate(target.dims):
                axis = self.axes.get(dim)
                if axis is not None and axis.role == "window":
                    weights = window_weights(axis.size, self.blend)
                    weights = weights[list(cut[dim])] if dim in cut else weights
                    shape = [1] * len(target.dims)
                    shape[i] = len(weights)
                    found = found * weights.reshape(shape)
            self._weights[(target.dims, cells)] = found
        return found

    def _place(self, target: Target, values: np.ndarray, at: np.ndarray, boxes: dict, cells: tuple = ()) -> None:
        """Blend samples (values: samples, *its sample dims; starts ``at``) into ``target``, in order: one box each
        (``_boxes``, kept in ``boxes`` by dims for the batch's other arrays)."""
        self._check_sample_shape(target, values, cells)
        order = [0] + [1 + target.sample_dims.index(d) for d in target.dims if d in target.sample_dims]
        block = np.transpose(values, order)
        for i, dim in enumerate(target.dims):
            if dim not in target.sample_dims:  # an iterated dim: each sample is one step of it
                block = np.expand_dims(block, i + 1)
        window = self._window_weight(target, cells)
        # The weights' cells: one along the dims every sample holds whole (kept dims share a weight).
        shared = [not self._weighed_along(d) for d in target.dims]
        unweighted = [n == 1 for n in window.shape]
        total, weights = target.total, target.weight
        if self._set_once(target):  # each cell its sample's value, as it is (the weights: coverage says where)
            windows = self._windows(target.dims, at, total.shape)
            if windows is not None:  # every sample whole inside: all set at once
                sizes, index = windows
                sliding_window_view(total, sizes, writeable=True)[index] = block
                return
            if target.dims not in boxes:
                boxes[target.dims] = self._boxes(target.dims, at)
            for sample, box in zip(block, boxes[target.dims]):
                if box is not None:
                    total[box[0]] = sample[box[1]]
            return
        if (target.dims, cells) not in boxes:
            boxes[(target.dims, cells)] = self._boxes(target.dims, at, cells)
        for sample, box in zip(block, boxes[(target.dims, cells)]):
            if box is None:
                continue
            at, crop = box
            wat = tuple(slice(None) if s else c for s, c in zip(shared, at))
            weight = window[tuple(slice(None) if u else c for u, c in zip(unweighted, crop))]
            # A running weighted mean, in the values' own dtype: m += w / W * (x - m), W the weights so far with
            # this one. Samples that agree leave it exactly their value (x - m = 0), whatever their number.
            so_far = weights[wat] + weight
            weights[wat] = so_far
            mean = total[at]  # (a view, unless an offsets dim is indexed by its cells)
            mean += (weight / so_far).astype(mean.dtype) * (sample[crop] - mean)
            if not np.may_share_memory(mean, total):
                total[at] = mean

    # ---- the dataset out --------------------------------------------------------------------------------------

    def coordinates(self, whole: bool = False) -> dict[str, Any]:
        """The grid's coordinates as xarray Variables: of the region, or of the ``whole`` grid."""
        xr = import_xarray()
        axes = self.whole_grid if whole else self.axes
        coords: dict[str, Any] = {}
        for name, entry in self.schema.grid.items():
            if "dims" in entry:  # a static coordinate of config ``coords`` (a curvilinear grid's 2-D lat, lon)
                coords[self.schema.feature(name).source.get("coordinate", name)] = self._static(xr, entry, axes)
        for dim, axis in axes.items():
            entry = self.schema.grid.get(axis.key or dim)
            if entry is None:
                continue
            if axis.role == "lead":
                coords[dim] = xr.Variable(
                    dim, _lead_times(entry, axis.offsets, self.schema.location), {"long_name": "forecast lead time"}
                )
                continue
            values = coordinate_values(entry, self.schema.location)[axis.first : axis.first + axis.length]
            attrs, encoding = coordinate_attrs(entry)
            variable = xr.Variable(dim, values, attrs)
            variable.encoding.update(encoding)
            coords[dim] = variable
        for scalar in self.schema.scalar_coords:
            coords[scalar["name"]] = xr.Variable(
                (), np.asarray(scalar["value"], dtype=scalar["dtype"]), scalar["attrs"]
            )
        return coords

    def dataset(self) -> xr.Dataset:
        """The samples added so far on the grid (or the region): blended values, coverage, coordinates."""
        xr = import_xarray()
        coords = self.coordinates()
        data = {}
        for target in self.targets.values():
            variable = xr.Variable(target.dims, self._finished(target), target.attrs)
            if target.is_coordinate:
                coords[target.name] = variable
            else:
                data[target.name] = variable
        data[COVERAGE] = xr.Variable(
            [a.dim for a in self.grid_axes],
            self.coverage,
            {"long_name": "samples that touched the cell", "comment": "0: no sample, the values there are NaN"},
        )
        attrs = {"reassembled_from": self.where, "blend": self.blend}
        if self.split is not None:
            attrs["split"] = self.split
        return finished(xr.Dataset(data, coords, attrs))

    def take_finished(self) -> Iterator[tuple[str, tuple[str, ...], np.ndarray]]:
        """(name, dims, values) of each data variable placed so far, as ``dataset`` holds them, one at a time, each
        taken out (coordinates too, which are not given): samples placed afterwards may not add to them again."""
        for target in list(self.targets.values()):
            del self.targets[target.name]
            self.taken.add(target.name)
            if not target.is_coordinate:
                yield target.name, target.dims, self._finished(target)

    def _weighed_along(self, dim: str) -> bool:
        """Whether a variable's weights vary along ``dim``: a placed dim's, and the forecast layout's lead_time with
        roles (each role's features hold some of its lead times); elsewhere every sample holds the dim whole."""
        axis = self.axes.get(dim)
        return axis is not None and (not axis.whole or (self._roles and axis.role == "lead"))

    def _set_once(self, target: Target) -> bool:
        """Whether no two samples share a cell of ``target``: over every placed dim, with disjoint samples (not with
        roles: a role's feature holds part of the sample's cells, which coverage does not say)."""
        return self._disjoint and not self._roles and self._placed_dims <= set(target.dims)

    def _uncovered(self, target: Target) -> np.ndarray:
        """Where no sample touched ``target``, shaped to broadcast against it."""
        if not self._set_once(target):
            return target.weight == 0
        grid = [a.dim for a in self.grid_axes]  # coverage's dims: all of them among the target's
        placed = [d for d in target.dims if d in grid]
        shape = [self.coverage.shape[grid.index(d)] if d in grid else 1 for d in target.dims]
        return np.transpose(self.coverage, [grid.index(d) for d in placed]).reshape(shape) == 0

    def _finished(self, target: Target) -> np.ndarray:
        """A target's blended values, NaN where no sample was (in place: no copy); integers as the files held
        them where every cell was covered (else float64, for the NaN)."""
        values = target.total
        np.copyto(values, np.nan, where=np.broadcast_to(self._uncovered(target), values.shape))
        stored = target.source_dtype
        if stored and np.dtype(stored).kind in "iub" and not np.isnan(values).any():
            return values.astype(np.dtype(stored))
        return values

    def _static(self, xr, entry: dict, axes: dict[str, GridAxis]):
        values = coordinate_values(entry, self.schema.location).reshape(entry["shape"])
        crop = tuple(
            slice(axes[d].first, axes[d].first + axes[d].length) if d in axes else slice(None) for d in entry["dims"]
        )
        attrs, encoding = coordinate_attrs(entry)
        variable = xr.Variable(entry["dims"], values[crop], attrs)
        variable.encoding.update(encoding)
        return variable


def finished(dataset):
    """The derived coordinates: valid_time (init_time + lead_time) in the forecast layout, area weights."""
    if INIT_TIME in dataset.coords and LEAD_TIME in dataset.coords:
        dataset = dataset.assign_coords({VALID_TIME: dataset[INIT_TIME] + dataset[LEAD_TIME]})
    return _with_area_weights(dataset)


def _cells_inside(starts: np.ndarray, local: np.ndarray, length: int) -> list[tuple | None]:
    """Per start: (cells of the array, cells of the sample) along one dim where start + ``local`` lies in
    [0, length), as slices when ``local`` is evenly spaced, else as index arrays; None where none does."""
    steps = np.diff(local)
    if len(local) == 1 or (steps[0] > 0 and (steps == steps[0]).all()):
        step = int(steps[0]) if len(local) > 1 else 1
        first = starts + int(local[0])
        low = np.maximum(0, -(first // step))  # the sample's first and last cells inside
        high = np.minimum(len(local) - 1, (length - 1 - first) // step)
        return [
            (slice(f + lo * step, f + hi * step + 1, step if step > 1 else None), slice(lo, hi + 1))
            if lo <= hi
            else None
            for f, lo, hi in zip(first.tolist(), low.tolist(), high.tolist())
        ]
    cells = starts[:, None] + local[None, :]
    inside = (cells >= 0) & (cells < length)
    return [(c[k], np.flatnonzero(k)) if k.any() else None for c, k in zip(cells, inside)]


def _lead_times(entry: dict, offsets: Sequence[int], folder: str) -> np.ndarray:
    """Offsets along the concat dim as lead times: offset x the dim's typical (median) step."""
    values = coordinate_values(entry, folder)
    if len(values) < 2:
        raise UserError("layout 'forecast': the concat dim has one step, so lead times have no step; use layout 'grid'")
    steps = np.diff(values)
    if steps.dtype == object:  # cftime dates: their differences are datetime.timedelta
        steps = steps.astype("timedelta64[ns]")
    step = np.sort(steps)[len(steps) // 2]
    return np.asarray(offsets) * step


def _latitude(dataset) -> Any:
    """The grid's latitude coordinate (1-D, or 2-D on a curvilinear grid), if it has one."""
    for name, coord in dataset.coords.items():
        units = str(coord.attrs.get("units", "")).lower()
        if coord.attrs.get("standard_name") == "latitude" or units in ("degrees_north", "degree_north", "degrees_n"):
            return coord
        if name in ("lat", "latitude") and coord.dtype.kind == "f":
            return coord
    return None


def _with_area_weights(dataset):
    """The dataset with cos-latitude cell-area weights (mean 1 over the grid's latitudes), where it has latitudes."""
    latitude = _latitude(dataset)
    if latitude is None:
        return dataset
    weights = np.cos(np.deg2rad(latitude.values.astype(np.float64))).clip(min=0)
    if not weights.sum() > 0:
        return dataset
    weights = weights / weights.mean()
    attrs = {"long_name": "cell area weight", "comment": "cos(latitude), normalised to mean 1 over the grid"}
    return dataset.assign_coords({AREA_WEIGHT: (latitude.dims, weights, attrs)})


def reassemble(
    output: str,
    samples: Iterable[Mapping[str, Any]] | None = None,
    split: str | None = None,
    blend: str = "mean",
    *,
    dims: Mapping[str, Sequence[str]] | None = None,
    layout: str = "grid",
    schema: Schema | None = None,
) -> xr.Dataset:
    """Samples of ``output`` (its records, or predictions keyed by their index/<dim>) on its source grid.

    Where the grid has latitudes, ``area_weight`` holds cos-latitude weights. With sample.roles, a feature
    ``<role>/<variable>`` comes back as its variable at its role's steps and crop (as forecasts: at its role's
    lead times).

    Args:
        output: the output's folder (a local path or an fsspec URL); needs no access to the source files.
        samples: dicts of one sample or a batch each, in any order, holding the ``index/<dim>`` features of the
            records they were made from (``schemas.Reader`` yields such dicts); None: the split's own records.
        split: the split the samples belong to (default: train if there is one, else the first).
        blend: how overlapping samples combine: "mean", "cosine" (Hann weights) or "gaussian".
        dims: a prediction's dims by name, where its name is not a feature of the output and its shape does
            not say them (a prediction may drop the kept dims or add a ``channel``).
        layout: "grid" (the source's grid, overlaps blended), or "forecast" for pairs and sequences along the
            concat dim: dims init_time (each sample's index) and lead_time (its offsets x the step), as
            WeatherBench-X opens predictions.
        schema: the output's schema, if already loaded.

    Returns:
        An ``xr.Dataset`` on the source grid, with ``coverage`` (samples per cell; NaN values where 0).

    Raises:
        UserError: a key the output does not hold, a sample given twice, a shape that fits no feature, a split
            that does not exist, or an output built before reassembly existed.
    """
    import_xarray()
    from schemas.metadata import load_schema
    from schemas.reader import Reader
    from schemas.schema import default_split

    path = str(output).rstrip("/") or "/"
    schema = schema if schema is not None else load_schema(path)
    if not schema.location:  # (one the caller loaded otherwise: the grid's sidecar is in ``output``)
        schema = dataclasses.replace(schema, location=path)
    assembly = Reassembly(schema, split, blend, dims, where=path, layout=layout, records=samples is None)
    if samples is None:
        samples = Reader(path, split or default_split(list(schema.splits)), schema=schema).iter_chunks()
    return assembly.add_all(samples).dataset()
