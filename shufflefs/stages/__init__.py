"""``--stage-dir``: a rank's pls partition on node-local disk.  `stage_file` writes and reads one
epoch's stage file (a source in front of the shared one); `store` keeps which stage files exist
and who reads them, and builds the next epoch's in the background.  Parquet files are served from
decoded copies on node-local disk (`parquet_rows`), from which `parquet_view` encodes each view's
row groups.  Imports `formats`, `index`, `sources`, `strategies`, `windows`, `scratch` and
`shared_tasks`."""
