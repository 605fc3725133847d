"""The catalog of a mount, async (trio) but without FUSE: nodes and the source tree (`tree`,
the node types in `nodes`, the ``.mix`` directory in `mix_tree`), epochs (`epochs`, the next
epoch's views prepared by `epoch_prep`), indexes and plans (`planner`, their memory in
`plan_memory`, warnings and checks in `plan_notes`), open views and their windows (`views`;
whether a shard's files are still the versions it shows in `versions`),
reads (`reads`), extended attributes and state (`xattrs`, counters in `stats`, who may set and
see what in `access`, a view's effective block size, buffer and label mix in `order_info`),
worker threads
with deadlines (`workers`), all tied together by `catalog.Catalog`.  Imports every package below
it (sources to windows, stages), never `mount` or `cli`; within it, `nodes` imports none of its
siblings."""
