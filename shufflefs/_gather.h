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

/* _edges.c: tar samples against their neighbours in their files */
typedef struct sf_fd_reader sf_fd_reader;  /* preads of a file's headers, 4 KiB at a time */
sf_fd_reader *sf_fd_reader_new(void);
void sf_fd_reader_free(sf_fd_reader *r);
/* a run's first sample ``first`` (at ``start``) against the sample before it in the file open as
   ``fd`` (at ``pred``; -1: none), its last ``last`` against what follows at ``end`` (``recend``:
   where the file's samples end): 0, a reason (*side 0: the first's, 1: the last's) or -errno */
int sf_tar_run_edges(sf_fd_reader *r, int fd, int64_t pred, int64_t start, const tar_sample *first, int64_t end,
                     int64_t recend, const tar_sample *last, int *side);
PyObject *sf_check_pieces(PyObject *self, PyObject *args);
#endif
