# The recommended worker image for Dataflow (or any portable Beam runner): the Beam SDK image of the
# version constraints.txt pins (the tested set), with this package and what workers run (setup.py's
# "worker" extra: no dask, matplotlib or build) installed with those exact versions. Workers start
# without installing anything.
#   docker build -t REGION-docker.pkg.dev/PROJECT/REPO/xarray-tfrecords:0.1.0 .
#   python -m pipelines.build ... --runner=DataflowRunner --sdk_container_image=<that tag>
FROM apache/beam_python3.11_sdk:2.77.0

WORKDIR /opt/xarray-tfrecords
COPY setup.py pyproject.toml README.md constraints.txt ./
COPY pipelines/ pipelines/
COPY transforms/ transforms/
COPY planning/ planning/
COPY schemas/ schemas/
# A Dask cluster's workers run dask and distributed too: docker build --build-arg EXTRAS=dask ...
ARG EXTRAS=worker
# Import from / (not this folder) so a package missing from setup.py fails the build, not a job.
RUN pip install --no-cache-dir -c constraints.txt ".[${EXTRAS}]" && cd / && python -c "import pipelines.build, transforms.cut, planning.plan, schemas.reader"
