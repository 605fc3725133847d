"""How a window is built and kept: a plan's windows as byte ranges of the view (`layout`), one
window built from the source by the compiled gather (`view`; Fortran-order arrays in
`transposed`), and the windows in memory, loaded ahead of sequential readers under one limit
(`cache`; its slots and buffers in `slots`), and how the allocator keeps and hands back their
memory (`heap`).  Blocking code for worker threads, no FUSE; imports `formats`, `index`, `sources`,
`strategies` and the compiled `shufflefs._gather`."""
