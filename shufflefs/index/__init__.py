"""Where records are: a file's offset table (`table`: record bounds, the source version it was
built from, the on-disk cache), a compressed file's (`decoded`: bounds in the decoded bytes and
their restart points) and one offset table over several files (`joined_index`: a pool's members,
a mixture's segments).  The bottom of the package's layers: its modules import nothing of the
package but each other, so that every layer above, `formats` first, builds and reads these
tables; the scans that build them run in worker processes from `formats.build`."""
