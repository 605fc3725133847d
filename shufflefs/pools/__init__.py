"""Sets of shard files shuffled as one: which files form a pool (`shards`: shard names and
declared globs), which pool a mounted file belongs to (`lookup`: the table read from the source
tree), and one offset table over a pool's members (`joined_index`).  Imports `index`, `formats`
and `sources.base`; reading a pool is `sources.pool`."""
