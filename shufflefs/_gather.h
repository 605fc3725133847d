/* What the C files of shufflefs._gather share (_gather.c, _mapped.c, _edges.c; the record checks
   are in _framing.c). */
#ifndef SHUFFLEFS_GATHER_H
#define SHUFFLEFS_GATHER_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_framing.h"

/* 0 if ``b`` is an int64 array (of ``n`` elements, if n >= 0), else -1 with ValueError */
int sf_check_i64(Py_buffer *b, Py_ssize_t n, const char *name);
/* index of the last element of sorted a[0..n) that is <= x, or -1 */
Py_ssize_t sf_last_le(const int64_t *a, Py_ssize_t n, int64_t x);
/* whether x is in the sorted nl[0..NL) */
int sf_gains_nl(const int64_t *nl, Py_ssize_t NL, int64_t x);
/* 0 if ``kind`` is a framing kind and ``report`` can take its result (then set to (-1, 0)) */
int sf_framing_args(int kind, Py_buffer *report);

/* _mapped.c: gather_mapped, cached_pages, Mapping, and the SIGBUS guard they need */
PyObject *sf_gather_mapped(PyObject *self, PyObject *args);
PyObject *sf_cached_pages(PyObject *self, PyObject *args);
int sf_mapped_init(PyObject *module);

/* What walks found of an index's tar samples, by record id (`windows.edges.seen_of`), so that a
   neighbour walked once is not read again: flags bit 0 walked, 1 its first member keyed, 2 its
   last.  The flags are written after the key and read before it: loads of other windows of the
   same index run at once.  ``key`` NULL: nothing is remembered. */
typedef struct {
    uint64_t *key;
    uint8_t *flags;
} sf_seen;

static inline void sf_seen_put(const sf_seen *m, int64_t x, const tar_sample *t) {
    if (!m->key) return;
    m->key[x] = t->key;
    __atomic_store_n(&m->flags[x], (uint8_t)(1 | t->first_keyed << 1 | t->last_keyed << 2), __ATOMIC_RELEASE);
}

static inline int sf_seen_get(const sf_seen *m, int64_t x, tar_sample *t) {
    if (!m->key || x < 0) return 0;
    uint8_t f = __atomic_load_n(&m->flags[x], __ATOMIC_ACQUIRE);
    if (!(f & 1)) return 0;
    t->key = m->key[x];
    t->first_keyed = f >> 1 & 1;
    t->last_keyed = f >> 2 & 1;
    return 1;
}

/* ``key`` (uint64) and ``flags`` (uint8) buffers of ``nrec`` records as an sf_seen (empty
   buffers: none); -1 with ValueError if their sizes are wrong */
int sf_seen_of(Py_buffer *key, Py_buffer *flags, Py_ssize_t nrec, sf_seen *m);

/* _edges.c: tar samples against their neighbours in their files */
typedef struct sf_fd_reader sf_fd_reader;  /* preads of a file's headers, 4 KiB at a time */
sf_fd_reader *sf_fd_reader_new(void);
void sf_fd_reader_free(sf_fd_reader *r);
/* a run's first sample ``first`` (at ``start``) against the sample before it in the file open as
   ``fd`` (at ``pred``; -1: none), its last ``last`` against what follows at ``end`` (``recend``:
   where the file's samples end): 0, a reason (*side 0: the first's, 1: the last's) or -errno */
int sf_tar_run_edges(sf_fd_reader *r, int fd, int64_t pred, int64_t start, const tar_sample *first, int64_t end,
                     int64_t recend, const tar_sample *last, int *side);
/* the same, the neighbours taken from ``seen`` where walked before (``pred_id``, ``next_id``: the
   records before and after the run in its member, -1 for none) */
int sf_tar_run_edges_seen(sf_fd_reader *r, const sf_seen *seen, int64_t pred_id, int64_t next_id, int fd,
                          int64_t pred, int64_t start, const tar_sample *first, int64_t end, int64_t recend,
                          const tar_sample *last, int *side);
PyObject *sf_check_pieces(PyObject *self, PyObject *args);

/* _rows.c: a Parquet page's runs of rows from a copy's streams */
PyObject *sf_gather_rows(PyObject *self, PyObject *args);
#endif
