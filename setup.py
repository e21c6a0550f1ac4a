"""Installs xarray-tfrecords: the pipelines, transforms, planning and schemas packages (shipped to Beam workers too)."""

from setuptools import setup

BEAM_VERSION = "2.77.0"  # the Dockerfile's worker image must use the same version (a test checks)
TENSORFLOW = "tensorflow-cpu==2.21.0"
DASK_VERSION = "2026.8.0"  # dask and distributed release together: pin both to one version

setup(
    name="xarray-tfrecords",
    version="0.1.0",
    description="NetCDF archives -> fully shuffled, sharded TFRecords with schema, parser and stats (Apache Beam)",
    python_requires=">=3.11,<3.12",
    packages=["pipelines", "transforms", "planning", "schemas"],
    package_data={"schemas": ["parser_template.py"]},
    install_requires=[
        f"apache-beam[gcp]=={BEAM_VERSION}",
        "protobuf==6.33.6",
        "xarray==2026.9.0",
        "netCDF4==1.7.5.1.post1",
        "h5netcdf==1.8.2",
        "h5py>=3.10",  # imported directly: probing and reading NetCDF-4 through HDF5's low-level API
        "cftime>=1.6",  # model calendars (noleap, 360_day, ...) in splits, selection and coord/time
        "gcsfs==2026.10.1",
        "fsspec==2026.9.0",
        "zarr>=3.1",  # Zarr stores as input (planning.zarr_store)
        "numpy>=2.0,<2.5",
        "pandas>=2.2",
        "pydantic>=2.10,<3",
        "PyYAML>=6.0",
        "regex>=2024.4",  # input.new_dim.from is searched with a time bound (re cannot be interrupted)
        "google-crc32c>=1.6",
        "build>=1.2",  # Beam builds the --setup_file package for Dataflow workers with it
        "matplotlib>=3.9,<4",  # python -m pipelines.inspect --plot
        # --runner=DaskRunner (Beam's runner on a dask.distributed cluster: HPC or cloud)
        f"dask=={DASK_VERSION}",
        f"distributed=={DASK_VERSION}",
    ],
    extras_require={
        "tf": [TENSORFLOW],
        # The PyTorch reader (schemas.torch_dataset); on Linux, install a CPU build of torch first
        # (pip install torch --index-url https://download.pytorch.org/whl/cpu) to avoid the CUDA wheels.
        "torch": ["torch>=2.4"],
        "test": [
            TENSORFLOW,
            "pytest>=8",
            "hypothesis>=6.100",
            "scipy>=1.13",
            "gcp-storage-emulator==2026.7.19",
            "psutil>=5.9",  # the benchmark measures the memory of process trees
            "xbatcher==0.4.0",  # the benchmark's naive peer
            "ruff==0.17.6",
        ],
    },
)
