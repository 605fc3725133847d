/* Parquet pages from a copy's row streams in one pass (`formats.parquet.streams.encode_pages`).

   gather_rows(out, src, rows, offsets, sizes, width, bounds, dst, ends[, out2, src2])
       For each page p, the runs of rows ``rows[bounds[p]:bounds[p + 1]]`` one after the other
       from ``dst[p]`` of ``out`` (``dst`` empty: each page from where the one before ended, the
       first from 0), and ``ends[p]`` = where page p's runs end.  Row x's run is
       ``src[offsets[x]:+sizes[x]]``; ``sizes`` are unsigned of 1, 2, 4 or 8 bytes (``width``).
       With ``out2`` and ``src2`` (as long as ``out`` and ``src``), the same runs are also copied
       from ``src2`` into ``out2``: a leaf's two level streams, whose runs are the same.

   numpy took a pass over the rows for each of: the sizes of the rows, their prefix sums, where
   each run goes, the offsets of the rows, the run lengths again; and the gather one more.  Each
   pass reads arrays of the file's rows at random, so on a 1 GiB file of 2 M rows a list column
   cost most of a text column.  Every row, offset and run is checked before its bytes are
   copied: bad input raises IndexError with ``out`` partly written, which the caller discards. */
#include "_gather.h"

#include <string.h>

static inline uint64_t size_of(const char *sizes, int width, int64_t x) {
    switch (width) {
    case 1: return ((const uint8_t *)sizes)[x];
    case 2: return ((const uint16_t *)sizes)[x];
    case 4: return ((const uint32_t *)sizes)[x];
    default: return ((const uint64_t *)sizes)[x];
    }
}

/* How far ahead the rows' offsets (ROWS_AHEAD) and bytes (half as far, up to PREFETCH_MAX of each
   row) are asked for.  Rows come from anywhere in the copy, so each run's first bytes are a cache
   miss: asking for a whole run 16 rows ahead (not only its first line 4 ahead) took a stage of a
   270 MB shard of letters from 0.080-0.083 to 0.068-0.070 CPU-s in one process, of a 1.07 GiB
   words file from 0.71-0.72 to 0.65-0.69. */
#define ROWS_AHEAD 32
#define PREFETCH_MAX 2048

/* A run of a few bytes (level entries, a list's items) without a call to memcpy. */
static inline void copy_run(char *d, const char *s, uint64_t k) {
    if (k > 16) {
        memcpy(d, s, k);
    } else if (k >= 8) {
        uint64_t a, b;
        memcpy(&a, s, 8); memcpy(&b, s + k - 8, 8);
        memcpy(d, &a, 8); memcpy(d + k - 8, &b, 8);
    } else if (k >= 4) {
        uint32_t a, b;
        memcpy(&a, s, 4); memcpy(&b, s + k - 4, 4);
        memcpy(d, &a, 4); memcpy(d + k - 4, &b, 4);
    } else {
        for (uint64_t j = 0; j < k; j++) d[j] = s[j];
    }
}

PyObject *sf_gather_rows(PyObject *self, PyObject *args) {
    Py_buffer out, src, rows, offsets, sizes, bounds, dst, ends, out2 = {0}, src2 = {0};
    int width;
    if (!PyArg_ParseTuple(args, "w*y*y*y*y*iy*y*w*|w*y*", &out, &src, &rows, &offsets, &sizes, &width, &bounds,
                          &dst, &ends, &out2, &src2))
        return NULL;
    PyObject *ret = NULL;
    if (!out2.obj != !src2.obj || (out2.obj && (out2.len != out.len || src2.len != src.len))) {
        PyErr_SetString(PyExc_ValueError, "out2 and src2 go together, as long as out and src");
        goto done;
    }
    Py_ssize_t n_rows = offsets.len / 8, n_pages = ends.len / 8;
    if (width != 1 && width != 2 && width != 4 && width != 8) {
        PyErr_SetString(PyExc_ValueError, "sizes must be 1, 2, 4 or 8 bytes wide");
        goto done;
    }
    if (sf_check_i64(&rows, -1, "rows") || sf_check_i64(&offsets, -1, "offsets") ||
        sf_check_i64(&bounds, n_pages + 1, "bounds") || sf_check_i64(&ends, -1, "ends") ||
        (dst.len && sf_check_i64(&dst, n_pages, "dst")))
        goto done;
    if (sizes.len != n_rows * width) {
        PyErr_SetString(PyExc_ValueError, "sizes and offsets must be of the same rows");
        goto done;
    }
    const int64_t *r = rows.buf, *off = offsets.buf, *b = bounds.buf, *d = dst.len ? dst.buf : NULL;
    int64_t *e = ends.buf;
    Py_ssize_t n = rows.len / 8;
    for (Py_ssize_t p = 0; p < n_pages; p++) {
        if (b[p] < 0 || b[p] > b[p + 1] || b[p + 1] > n) {
            PyErr_Format(PyExc_IndexError, "page %zd: rows [%lld, %lld) of %zd", p, (long long)b[p],
                         (long long)b[p + 1], n);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (r[i] < 0 || r[i] >= n_rows) {
            PyErr_Format(PyExc_IndexError, "row %lld of %zd", (long long)r[i], n_rows);
            goto done;
        }
    }
    int64_t bad = -1, bad_what = 0;
    Py_BEGIN_ALLOW_THREADS
    char *ob = out.buf, *ob2 = out2.buf;
    const char *sb = src.buf, *sb2 = src2.buf, *sz = sizes.buf;
    int64_t pos = 0;
    for (Py_ssize_t p = 0; p < n_pages && bad < 0; p++) {
        if (d) pos = d[p];
        if (pos < 0 || pos > out.len) {
            bad = p, bad_what = 1;
            break;
        }
        for (int64_t i = b[p]; i < b[p + 1]; i++) {
            if (i + ROWS_AHEAD < n) {  /* rows at random: ask early for the next ones' offset and bytes */
                int64_t y = r[i + ROWS_AHEAD];
                __builtin_prefetch(off + y);
                __builtin_prefetch(sz + y * width);
                if (i + ROWS_AHEAD / 2 < n) {  /* a hint only: a bad offset is caught below, before any copy */
                    int64_t z = r[i + ROWS_AHEAD / 2];
                    uintptr_t q = (uintptr_t)sb + (uintptr_t)off[z];
                    uint64_t kz = size_of(sz, width, z);
                    if (kz > PREFETCH_MAX) kz = PREFETCH_MAX;
                    for (uint64_t j = 0; j < kz; j += 64) __builtin_prefetch((const void *)(q + j));
                }
            }
            int64_t x = r[i], o = off[x];
            uint64_t k = size_of(sz, width, x);
            if (o < 0 || k > (uint64_t)src.len || o > src.len - (int64_t)k || k > (uint64_t)(out.len - pos)) {
                bad = i, bad_what = 2;
                break;
            }
            copy_run(ob + pos, sb + o, k);
            if (ob2) copy_run(ob2 + pos, sb2 + o, k);
            pos += (int64_t)k;
        }
        e[p] = pos;
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        if (bad_what == 1)
            PyErr_Format(PyExc_IndexError, "page %lld starts outside the output", (long long)bad);
        else
            PyErr_Format(PyExc_IndexError, "the run of row %lld lies outside its buffers", (long long)r[bad]);
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&out); PyBuffer_Release(&src); PyBuffer_Release(&rows); PyBuffer_Release(&offsets);
    PyBuffer_Release(&sizes); PyBuffer_Release(&bounds); PyBuffer_Release(&dst); PyBuffer_Release(&ends);
    if (out2.obj) PyBuffer_Release(&out2);
    if (src2.obj) PyBuffer_Release(&src2);
    return ret;
}
