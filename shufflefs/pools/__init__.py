"""Sets of files read as one: which files form a pool (`shards`: shard names and declared
globs), which pool a mounted file belongs to (`lookup`: the table read from the source tree),
who may read a shard (`access`: its members' modes and owners combined), and mixtures: which
files each ``[[mix]]`` draws from (`mixes`) and one epoch of a mixture as an offset table over
segments of them (`mix_index`).  A pool's offset table is `index.joined_index`; reading a pool is
`sources.pool`.  Imports `index`, `formats`, `strategies` and `sources.base`."""
