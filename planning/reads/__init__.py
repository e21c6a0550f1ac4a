"""A unit's box read on a worker: one Reader protocol (readers.py), and the readers that wrap one another.

``Reader.read(variables, box) -> Slabs``: each variable's values over a box of index ranges.
A unit's reader is chosen once, by unit_reader: a selection (config ``select``) wraps the
members of input.new_dim, which wrap the files along the concat dim, each file read through
the reader of its format; or a Zarr store, read whole chunks at a time.

Glossary: what "a file" is called on its way from the listing to the worker's bytes.

- input path (str): what input.paths lists, a glob or a URL; a store's URL is one source.
- ListedFile (formats.sources): a file the listing found: path, size and version (times, inode).
- FileProbe (inputs.probe): what probing its head and tail learnt: format, dims, the concat
  coordinate, a structure fingerprint, where plainly stored variables lie.
- FileInfo (inputs.metadata): the planner's view of one file: dims, coordinates, variables.
- SourceFile (formats.sources): a file as workers know it: its range along the concat dim of
  the virtual dataset, its size and version when planned, its member; the one name from the plan
  to the worker.
- SourceIndex (reads.source_index): every SourceFile as columns, saved once per run for workers.
- RemoteFile (formats.remote_files): byte ranges of a remote file, fetched concurrently.
"""
