"""Where records are: a file's offset table (`table`: record bounds, the source version it was
built from, the on-disk cache), one offset table over several files (`joined_index`: a pool's
members, a mixture's segments), and its building in worker processes (`build`), so that a bad file
costs a worker, never the mount.  `table` imports only `errors`, `joined_index` only `table`;
`build` runs the scans of `formats` (which build tables)."""
