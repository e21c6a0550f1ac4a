"""How many ranges of unit numbers the job graph starts from: on Dask, its partitions."""

from __future__ import annotations

import apache_beam.runners.dask.dask_runner  # noqa: F401  (registers the Dask runner's flags)
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import runners
from transforms.units import DEFAULT_RANGES

DASK = ["--runner=DaskRunner", "--dask_client_address=tcp://scheduler:8786"]


def _options(*flags: str) -> PipelineOptions:
    return PipelineOptions(runners.with_runner_defaults(list(flags)))


def test_dask_partitions_come_from_the_units_and_the_cluster_threads(monkeypatch):
    monkeypatch.setattr(runners, "dask_threads", lambda options: 3)
    assert runners.unit_ranges(_options(*DASK), 2_000) == 2 * 3  # not one per unit
    assert runners.unit_ranges(_options(*DASK), 5) == 5  # never more than the units
    assert runners.unit_ranges(_options(*DASK, "--dask_npartitions=40"), 2_000) == 40
    assert runners.unit_ranges(_options(*DASK, "--dask_npartitions=40"), 7) == 7
    # Beam's DaskRunner keeps each range a partition of its own.
    assert "--dask_partition_size=1" in runners.with_runner_defaults(DASK)


def test_other_runners_get_a_few_hundred_ranges_whatever_the_units():
    assert runners.unit_ranges(_options(), 30_000_000) == DEFAULT_RANGES
    assert runners.unit_ranges(_options("--runner=DataflowRunner"), 30_000_000) == DEFAULT_RANGES


def test_the_preflight_checks_threads_save_a_connection_once(monkeypatch):
    """The threads the preflight check saw serve the next count (one connection fewer); a later build asks again,
    and a cluster without workers yet is not remembered."""
    import distributed

    connections = []

    class Scheduler:
        def __init__(self, **kwargs):
            connections.append(kwargs["address"])

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def nthreads(self):
            return {"a": 2, "b": 2}

    monkeypatch.setattr(distributed, "Client", Scheduler)
    options = _options(*DASK)
    runners.remember_dask_threads("tcp://scheduler:8786", None, 6)
    assert runners.dask_threads(options) == 6 and connections == []
    assert runners.dask_threads(options) == 4 and connections == ["tcp://scheduler:8786"]
    runners.remember_dask_threads("tcp://scheduler:8786", None, 0)
    assert runners.dask_threads(options) == 4 and len(connections) == 2
