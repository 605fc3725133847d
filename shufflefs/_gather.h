/* What the two C files of shufflefs._gather share (_gather.c, _mapped.c; the record checks are
   in _framing.c). */
#ifndef SHUFFLEFS_GATHER_H
#define SHUFFLEFS_GATHER_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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
#endif
