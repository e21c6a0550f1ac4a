"""Installs xarray-tfrecords: the pipelines, transforms, planning and schemas packages (shipped to Beam workers too)."""

from pathlib import Path

from setuptools import setup

# Ranges: what the tool works with, so it fits into an existing Pangeo, PyTorch or JAX environment.
# The exact set it is tested with is constraints.txt (CI and the Dockerfile install with it).
#
# Who installs what:
#   pip install .             the readers (schemas: Reader, load_dataset, verify): no Beam, no xarray
#   pip install ".[build]"    building outputs on this machine, or on a Dask cluster, from and to local paths
#   ".[build,gcp]"            ... and gs:// inputs and outputs, and launching a build on Dataflow
#   ".[worker]"               what a Beam worker runs: the Dockerfile's image, and worker-requirements.txt
#   ".[dask]"                 what a Dask cluster's worker runs (the worker set, dask and distributed)
# Dataflow's workers install the --setup_file package without extras (Beam builds an sdist and
# pip-installs it as is), so the build sends them worker-requirements.txt (--requirements_file) with
# it; tests/test_packaging.py keeps that file equal to WORKER.
TENSORFLOW = "tensorflow-cpu>=2.18,<3"
GCSFS = "gcsfs>=2024.6"

READERS = [
    "numpy>=2.0,<3",
    "fsspec>=2024.6",
    "google-crc32c>=1.6",  # the records' checksums, in C
]
# A local build's Beam: without its GCP extras, which make importing Beam import BigQuery's and Cloud Storage's clients
# too (a third of Beam's import time, measured), and with gcsfs are 79 packages more to install.
BEAM = "apache-beam>=2.77,<3"
# What a build runs besides Beam, wherever it runs.
BUILD = [
    "xarray>=2025.1",
    "netCDF4>=1.7",
    "h5netcdf>=1.3",
    "h5py>=3.10",  # imported directly: probing and reading NetCDF-4 through HDF5's low-level API
    "cftime>=1.6",  # model calendars (noleap, 360_day, ...) in splits, selection and coord/time
    "zarr>=3.1,<4",  # Zarr stores as input (planning.formats.zarr_store)
    "pandas>=2.2",
    "pydantic>=2.10,<3",
    "PyYAML>=6.0",
    "regex>=2024.4",  # input.new_dim.from is searched with a time bound (re cannot be interrupted)
    # The writers' record checksums: it takes a row of a block's records as it is and computes outside the GIL
    # (google-crc32c takes bytes only, and holds the GIL below 1 MB). LGPL-2.1-or-later, used as installed.
    "crc32c>=2.5",
]
# gs:// inputs (gcsfs) and outputs (Beam's GCS filesystem), and the Dataflow runner (Beam's GCP extras).
GCP = ["apache-beam[gcp]>=2.77,<3", GCSFS]
# Workers may read and write gs:// (Dataflow's always do).
WORKER = [*GCP, *BUILD]
# What only the machine that starts a build runs; workers never import these.
LAUNCHER = [
    # Beam builds the --setup_file sdist for Dataflow's workers with `python -m build --no-isolation`,
    # which takes setuptools from this environment (Python 3.12+ venvs come without it)
    "build>=1.2",
    "setuptools>=68",
    "matplotlib>=3.9,<4",  # python -m pipelines.inspect --plot
]
# --runner=DaskRunner (Beam's runner on a dask.distributed cluster: HPC or cloud): the launcher and
# the cluster's workers run them. They release together (constraints.txt pins both to one version).
DASK = ["dask>=2025.1", "distributed>=2025.1"]
# The documentation site (mkdocs build --strict in CI; the API reference from the docstrings).
DOCS = ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=0.27"]
# GRIB files as input (planning.formats.grib): cfgrib, and ecCodes as a wheel (no system library needed).
GRIB = ["cfgrib>=0.9.14", "eccodes>=2.40", "eccodeslib>=2.40; platform_system != 'Windows'"]
# Virtual references as input (planning.formats.store_sources): kerchunk's JSON and Parquet reference files.
VIRTUAL = ["kerchunk>=0.2.7", "fastparquet>=2024.11"]  # (fsspec reads Parquet references with fastparquet)
# Icechunk repositories as input (planning.formats.store_sources).
ICECHUNK = ["icechunk>=1.0,<2"]

setup(
    name="xarray-tfrecords",
    version="0.1.0",
    description="NetCDF archives -> fully shuffled, sharded TFRecords with schema, parser and stats (Apache Beam)",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Science/Research",
        "License :: OSI Approved :: Apache Software License",
        "Operating System :: POSIX :: Linux",
        "Operating System :: MacOS",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering :: Atmospheric Science",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    keywords=["xarray", "netcdf", "zarr", "tfrecord", "apache-beam", "climate", "weather", "machine-learning"],
    python_requires=">=3.11,<3.14",
    entry_points={"console_scripts": ["xarray-tfrecords = pipelines.console:main"]},
    packages=[
        "pipelines",
        "transforms",
        "transforms.buckets",
        "transforms.compat",
        "transforms.merging",
        "planning",
        "planning.run",
        "planning.formats",
        "planning.inputs",
        "planning.config",
        "planning.reads",
        "schemas",
    ],
    package_data={"schemas": ["parser_template.py"]},
    install_requires=READERS,
    extras_require={
        "gcs": [GCSFS],  # the readers on gs:// outputs
        "worker": WORKER,
        "dask": WORKER + DASK,  # a Dask cluster's workers
        "build": [BEAM, *BUILD, *DASK, *LAUNCHER],
        "gcp": GCP,  # added to [build] for gs:// and Dataflow: pip install ".[build,gcp]"
        "tf": [TENSORFLOW],
        "grib": GRIB,  # added to [build] for GRIB input: pip install ".[build,grib]"
        "virtual": VIRTUAL,  # added to [build] for kerchunk references as input
        "icechunk": ICECHUNK,  # added to [build] for Icechunk repositories as input
        # Predictions back on the grid (schemas.reassemble): datasets, model calendars, Zarr and NetCDF to write.
        "reassemble": ["xarray>=2025.1", "cftime>=1.6", "zarr>=3.1,<4", "netCDF4>=1.7"],
        # The PyTorch reader (schemas.torch_dataset); on Linux, install a CPU build of torch first
        # (pip install torch --index-url https://download.pytorch.org/whl/cpu) to avoid the CUDA wheels.
        "torch": ["torch>=2.4"],
        "docs": DOCS,
        "test": [
            *DOCS,
            *WORKER,
            *DASK,
            *LAUNCHER,
            *GRIB,
            *VIRTUAL,
            *ICECHUNK,
            TENSORFLOW,
            "pytest>=8",
            "pytest-xdist>=3.5",  # pyproject's addopts run the suite in parallel (-n)
            "pytest-timeout>=2.1,<3",  # pyproject's timeout: a hung test fails, the suite goes on
            "packaging>=23",  # the packaging test reads requirements and versions
            "hypothesis>=6.100",
            "scipy>=1.13",
            "gcp-storage-emulator>=2026.7.19",
            "psutil>=5.9",  # the benchmark measures the memory of process trees
            "xbatcher>=0.4,<0.5",  # the benchmark's naive peer
            "grain>=0.2.18",  # open_source is a Grain random-access source: tested with Grain itself
            "tfrecord>=1.14",  # the tfrecord package reads our shards by our .tfindex (tested)
            "ruff>=0.17,<0.18",  # the style test checks formatting: another minor release formats differently
        ],
    },
)
