"""Bytes of input files: NetCDF-3 headers, HDF5, Zarr, remote byte ranges, CF decoding, calendars; no plan."""
