"""A unit's box read on a worker: slabs, direct reads, Zarr reads, the source index, the selection."""
