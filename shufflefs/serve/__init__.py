"""The catalog of a mount, without FUSE: nodes and the source tree (`tree`), epochs (`epochs`),
indexes and plans (`planner`), open views and their windows (`views`), reads (`reads`),
extended attributes and state (`xattrs`), all tied together by `catalog.Catalog`."""
