"""Where records are: a file's offset table (`table`: record bounds, the source version it was
built from, the on-disk cache) and its building in worker processes (`build`), so that a bad file
costs a worker, never the mount.  `table` imports only `errors`; `build` runs the scans of
`formats` (which build tables)."""
