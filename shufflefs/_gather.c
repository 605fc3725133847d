/* The one compiled piece of shufflefs: building windows of shuffled records with the GIL
   released.  numpy has no variable-length gather; the fallbacks in layout.py and view.py compute
   the same bytes, several times slower.

   gather(out, src, out_pos, src_pos, lengths)
       out[out_pos[i]:+lengths[i]] = src[src_pos[i]:+lengths[i]] for all i.

   build_window(out, scratch, bounds, ids, run_first, run_count, run_fd, run_shift, newline_ids)
       Builds the window of records ``ids`` (in view order; record i is bytes
       [bounds[i], bounds[i+1]) of its file) in ``out`` by reading the files once, in ascending
       order.  ``run_first``/``run_count`` give the same records as ascending runs of consecutive
       ids; run r lies in the file ``run_fd[r]`` at offsets shifted by ``run_shift[r]`` (one file:
       every fd the same, every shift 0; a pool of files: a run never crosses a file).  Each run
       is read in chunks of at most len(scratch) bytes (ending at record boundaries) into
       ``scratch``, and the chunk's records are copied to their view positions while the chunk
       is still in the CPU cache; a record larger than the scratch is read straight into place.
       The records ``newline_ids`` (sorted) get a newline after them in the view.  Returns the
       window size, or ``(run, file offset)`` if the file of that run ended early at that offset
       (it shrank: the caller reports it).

   gather_mapped(out, maps, bounds, ids, member_first, member_map, member_shift, newline_ids)
       Copies records ``ids`` in view order from mappings of their files to the front of
       ``out``, one after the other: record x lies in the member m whose ``member_first[m]`` is
       the last <= x (sorted, starting at 0), at offset ``bounds[x] + member_shift[m]`` of the
       buffer ``maps[member_map[m]]``.  No sort, no runs, writes in order; for record-level
       orders, whose records are scattered anyway.  A record in ``newline_ids`` gets a newline
       after it.  Returns the bytes written, or ``(i, file offset)`` when the mapping of ids[i]
       faulted (SIGBUS: its file shrank).  Each record is checked (inside the bounds, the
       mapping and ``out``) just before it is copied; bad input raises with ``out`` partly
       written, which the caller discards.

   Mapping(fd, length)
       A read-only mapping of a file (MADV_RANDOM), a buffer, unmapped when last referenced;
       unlike mmap.mmap it holds no duplicate descriptor.

   cached_pages(fd, mapping)
       How many pages of the file open as ``fd`` (mapped whole as ``mapping``) are in the page
       cache: cachestat(2), or mincore(2) over the mapping on kernels without it.

   Except in gather_mapped, every id, run and position is checked before any byte is read or
   copied; bad input raises ValueError or IndexError. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <setjmp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static int check_i64(Py_buffer *b, Py_ssize_t n, const char *name) {
    if (b->len % 8 || (n >= 0 && b->len / 8 != n)) {
        PyErr_Format(PyExc_ValueError, "%s must be an int64 array of the right size", name);
        return -1;
    }
    return 0;
}

static PyObject *gather(PyObject *self, PyObject *args) {
    Py_buffer out, src, opos, spos, lens;
    if (!PyArg_ParseTuple(args, "w*y*y*y*y*", &out, &src, &opos, &spos, &lens)) return NULL;
    PyObject *ret = NULL;
    Py_ssize_t n = lens.len / 8;
    if (check_i64(&lens, -1, "lengths") || check_i64(&opos, n, "out_pos") || check_i64(&spos, n, "src_pos"))
        goto done;
    const int64_t *o = opos.buf, *s = spos.buf, *l = lens.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (l[i] < 0 || o[i] < 0 || s[i] < 0 || o[i] > out.len - l[i] || s[i] > src.len - l[i]) {
            PyErr_Format(PyExc_IndexError, "range %zd out of bounds", i);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    char *ob = out.buf; const char *sb = src.buf;
    for (Py_ssize_t i = 0; i < n; i++) memcpy(ob + o[i], sb + s[i], (size_t)l[i]);
    Py_END_ALLOW_THREADS
    ret = Py_None; Py_INCREF(ret);
done:
    PyBuffer_Release(&out); PyBuffer_Release(&src); PyBuffer_Release(&opos); PyBuffer_Release(&spos); PyBuffer_Release(&lens);
    return ret;
}

/* pread exactly n bytes; returns 0, an errno, or -1 for an early end of file (*at = where). */
static int pread_full(int fd, char *buf, int64_t n, int64_t off, int64_t *at) {
    int64_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, buf + got, (size_t)(n - got), (off_t)(off + got));
        if (k < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (k == 0) {
            *at = off + got;
            return -1;
        }
        got += k;
    }
    return 0;
}

/* SIGBUS from a mapping whose file shrank: jump out of the copy that faulted (on its own thread) */
static __thread sigjmp_buf *volatile bus_guard;  /* volatile: the stores around the copy must stay */
static struct sigaction bus_previous;

static void on_bus(int sig, siginfo_t *info, void *ctx) {
    sigjmp_buf *g = bus_guard;
    if (g) siglongjmp(*g, 1);
    /* not a guarded copy: put the previous handler back; the faulting access repeats and meets it */
    sigaction(SIGBUS, &bus_previous, NULL);
    (void)sig; (void)info; (void)ctx;
}

#define PREFETCH_RUNS 8

/* index of the last element of sorted a[0..n) that is <= x, or -1 */
static Py_ssize_t last_le(const int64_t *a, Py_ssize_t n, int64_t x) {
    Py_ssize_t lo = -1, hi = n;
    while (hi - lo > 1) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (a[mid] <= x) lo = mid; else hi = mid;
    }
    return lo;
}

static PyObject *build_window(PyObject *self, PyObject *args) {
    Py_buffer out, scratch, bounds, idsb, rfirst, rcount, rfd, rshift, nlb;
    if (!PyArg_ParseTuple(args, "w*w*y*y*y*y*y*y*y*", &out, &scratch, &bounds, &idsb, &rfirst, &rcount, &rfd,
                          &rshift, &nlb))
        return NULL;
    PyObject *ret = NULL;
    int64_t *dst = NULL, *rrank = NULL;
    Py_ssize_t n = idsb.len / 8, R = rfirst.len / 8, nrec = bounds.len / 8 - 1, NL = nlb.len / 8;
    if (check_i64(&bounds, -1, "bounds") || check_i64(&idsb, -1, "ids") || check_i64(&rfirst, -1, "run_first")
        || check_i64(&rcount, R, "run_count") || check_i64(&rfd, R, "run_fd") || check_i64(&rshift, R, "run_shift")
        || check_i64(&nlb, -1, "newline_ids"))
        goto done;
    if (nrec < 0 || scratch.len < 1) {
        PyErr_SetString(PyExc_ValueError, "need bounds of at least one element and a scratch buffer");
        goto done;
    }
    const int64_t *b = bounds.buf, *ids = idsb.buf, *rf = rfirst.buf, *rc = rcount.buf, *fds = rfd.buf,
                  *shift = rshift.buf, *nl = nlb.buf;
    for (Py_ssize_t i = 1; i < NL; i++) {
        if (nl[i] <= nl[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "newline_ids must be sorted and distinct");
            goto done;
        }
    }
    rrank = malloc((size_t)(R ? R : 1) * 8);
    dst = malloc((size_t)(n ? n : 1) * 8);
    if (!rrank || !dst) {
        PyErr_NoMemory();
        goto done;
    }
    /* runs: ascending, disjoint, inside the bounds, readable offsets; rrank[r] = where run r
       starts in source order */
    int64_t acc = 0, prev_end = 0;
    for (Py_ssize_t r = 0; r < R; r++) {
        if (rc[r] < 1 || rf[r] < prev_end || rf[r] > nrec - rc[r] || fds[r] < 0 || fds[r] > INT32_MAX
            || b[rf[r]] + shift[r] < 0) {
            PyErr_Format(PyExc_IndexError, "run %zd out of order or out of bounds", r);
            goto done;
        }
        rrank[r] = acc;
        acc += rc[r];
        prev_end = rf[r] + rc[r];
    }
    if (acc != n) {
        PyErr_SetString(PyExc_ValueError, "runs and ids hold different numbers of records");
        goto done;
    }
    /* view position of every record, stored by its rank in source order; each rank exactly once,
       so the ids are exactly the records of the runs */
    for (Py_ssize_t i = 0; i < n; i++) dst[i] = -1;
    int64_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t x = ids[i];
        Py_ssize_t lo = last_le(rf, R, x);
        if (lo < 0 || x >= rf[lo] + rc[lo] || dst[rrank[lo] + x - rf[lo]] != -1) {
            PyErr_Format(PyExc_IndexError, "id %lld at %zd is not a record of the runs, or repeated", (long long)x, i);
            goto done;
        }
        int64_t len = b[x + 1] - b[x];
        if (len < 0 || b[x] < 0) {
            PyErr_Format(PyExc_ValueError, "record %lld has bounds out of order", (long long)x);
            goto done;
        }
        dst[rrank[lo] + x - rf[lo]] = pos;
        pos += len;
        if (NL) {
            Py_ssize_t j = last_le(nl, NL, x);
            pos += j >= 0 && nl[j] == x;
        }
    }
    if (pos > out.len) {
        PyErr_Format(PyExc_IndexError, "window of %lld bytes does not fit the output buffer", (long long)pos);
        goto done;
    }
    int err = 0;
    int64_t short_at = -1;
    Py_ssize_t short_run = -1;
    Py_BEGIN_ALLOW_THREADS
    char *ob = out.buf, *sb = scratch.buf;
    const int64_t cap = scratch.len;
    for (Py_ssize_t r = 0; r < R && !err; r++) {
        int64_t x = rf[r], end = rf[r] + rc[r], sh = shift[r];
        int fd = (int)fds[r];
        const int64_t *d = dst + rrank[r] - rf[r];  /* d[y] = view position of record y */
        short_run = r;
        while (x < end && !err) {
            int64_t a = x, size = 0;
            while (x < end && size + (b[x + 1] - b[x]) <= cap) {
                size += b[x + 1] - b[x];
                x++;
            }
            if (x == a) {  /* one record larger than the scratch: read it in place */
                err = pread_full(fd, ob + d[a], b[a + 1] - b[a], b[a] + sh, &short_at);
                x++;
                continue;
            }
            err = pread_full(fd, sb, size, b[a] + sh, &short_at);
            if (err) break;
            for (int64_t y = a, p = 0; y < x; y++) {
                memcpy(ob + d[y], sb + p, (size_t)(b[y + 1] - b[y]));
                p += b[y + 1] - b[y];
            }
        }
    }
    for (Py_ssize_t j = 0; j < NL && !err; j++) {
        Py_ssize_t r = last_le(rf, R, nl[j]);
        if (r >= 0 && nl[j] < rf[r] + rc[r])
            ob[dst[rrank[r] + nl[j] - rf[r]] + b[nl[j] + 1] - b[nl[j]]] = '\n';
    }
    Py_END_ALLOW_THREADS
    if (err > 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    ret = err < 0 ? Py_BuildValue("nL", short_run, (long long)short_at) : PyLong_FromLongLong(pos);
done:
    free(dst);
    free(rrank);
    PyBuffer_Release(&out); PyBuffer_Release(&scratch); PyBuffer_Release(&bounds); PyBuffer_Release(&idsb);
    PyBuffer_Release(&rfirst); PyBuffer_Release(&rcount); PyBuffer_Release(&rfd); PyBuffer_Release(&rshift);
    PyBuffer_Release(&nlb);
    return ret;
}


/* the records of gather_mapped; 0, -1 when a mapping faulted (*fault = i), or 1 for bad input
   (*fault = i) */
static int copy_view_order(char *ob, Py_ssize_t olen, Py_buffer *mb, Py_ssize_t M, const int64_t *b, Py_ssize_t nrec,
                           const int64_t *ids, Py_ssize_t n, const int64_t *mf, const int64_t *mm, const int64_t *ms,
                           Py_ssize_t NM, const int64_t *nl, Py_ssize_t NL, int64_t *written, Py_ssize_t *fault) {
    sigjmp_buf jb;
    volatile Py_ssize_t i = 0;
    volatile int64_t pos = 0;
    if (sigsetjmp(jb, 0)) {
        sigset_t bus;
        bus_guard = NULL;
        sigemptyset(&bus);
        sigaddset(&bus, SIGBUS);
        pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
        *fault = i;
        return -1;
    }
    bus_guard = &jb;
    for (; i < n; i++) {
        int64_t x = ids[i];
        if (i + 2 * PREFETCH_RUNS < n && ids[i + 2 * PREFETCH_RUNS] >= 0 && ids[i + 2 * PREFETCH_RUNS] < nrec)
            __builtin_prefetch(b + ids[i + 2 * PREFETCH_RUNS], 0, 0);
        if (x < 0 || x >= nrec) break;
        Py_ssize_t m = NM == 1 ? 0 : last_le(mf, NM, x);
        if (m < 0 || mm[m] < 0 || mm[m] >= M) break;
        int64_t off = b[x] + ms[m], len = b[x + 1] - b[x];
        if (i + PREFETCH_RUNS < n) {
            int64_t y = ids[i + PREFETCH_RUNS];
            if (y >= 0 && y < nrec) {
                Py_ssize_t q = NM == 1 ? 0 : last_le(mf, NM, y);
                if (q >= 0 && mm[q] >= 0 && mm[q] < M && b[y] + ms[q] >= 0 && b[y] + ms[q] < mb[mm[q]].len)
                    __builtin_prefetch((const char *)mb[mm[q]].buf + b[y] + ms[q], 0, 0);
            }
        }
        if (len < 0 || off < 0 || off > mb[mm[m]].len - len || pos > olen - len) break;
        memcpy(ob + pos, (const char *)mb[mm[m]].buf + off, (size_t)len);
        pos += len;
        if (NL) {
            Py_ssize_t j = last_le(nl, NL, x);
            if (j >= 0 && nl[j] == x) {
                if (pos >= olen) break;
                ob[pos++] = '\n';
            }
        }
    }
    bus_guard = NULL;
    *written = pos;
    *fault = i;
    return i < n ? 1 : 0;
}

static PyObject *gather_mapped(PyObject *self, PyObject *args) {
    Py_buffer out, bounds, idsb, mfirst, mmap_, mshift, nlb;
    PyObject *maps;
    if (!PyArg_ParseTuple(args, "w*O!y*y*y*y*y*y*", &out, &PyTuple_Type, &maps, &bounds, &idsb, &mfirst, &mmap_,
                          &mshift, &nlb))
        return NULL;
    PyObject *ret = NULL;
    Py_ssize_t M = PyTuple_GET_SIZE(maps), got_maps = 0;
    Py_buffer *mb = calloc((size_t)(M ? M : 1), sizeof(Py_buffer));
    if (!mb) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got_maps < M; got_maps++)
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(maps, got_maps), &mb[got_maps], PyBUF_SIMPLE) < 0) goto done;
    Py_ssize_t n = idsb.len / 8, NM = mfirst.len / 8, nrec = bounds.len / 8 - 1, NL = nlb.len / 8;
    if (check_i64(&bounds, -1, "bounds") || check_i64(&idsb, -1, "ids") || check_i64(&mfirst, -1, "member_first")
        || check_i64(&mmap_, NM, "member_map") || check_i64(&mshift, NM, "member_shift")
        || check_i64(&nlb, -1, "newline_ids"))
        goto done;
    const int64_t *mf = mfirst.buf, *nl = nlb.buf;
    if (nrec < 0 || NM < 1 || mf[0] != 0) {
        PyErr_SetString(PyExc_ValueError, "need bounds and members starting at record 0");
        goto done;
    }
    for (Py_ssize_t m = 1; m < NM; m++)
        if (mf[m] < mf[m - 1]) {
            PyErr_SetString(PyExc_ValueError, "member_first must be sorted");
            goto done;
        }
    for (Py_ssize_t j = 1; j < NL; j++)
        if (nl[j] <= nl[j - 1]) {
            PyErr_SetString(PyExc_ValueError, "newline_ids must be sorted and distinct");
            goto done;
        }
    int64_t written = 0;
    Py_ssize_t at = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = copy_view_order(out.buf, out.len, mb, M, bounds.buf, nrec, idsb.buf, n, mf, mmap_.buf, mshift.buf, NM, nl, NL,
                         &written, &at);
    Py_END_ALLOW_THREADS
    if (rc > 0) {
        PyErr_Format(PyExc_IndexError, "record %zd (id %lld) is outside its bounds, mapping or the output", at,
                     (long long)((const int64_t *)idsb.buf)[at]);
        goto done;
    }
    if (rc < 0) {
        const int64_t *ids = idsb.buf, *b = bounds.buf, *ms = mshift.buf;
        int64_t x = ids[at];
        Py_ssize_t m = NM == 1 ? 0 : last_le(mf, NM, x);
        ret = Py_BuildValue("nL", at, (long long)(b[x] + ms[m]));
        goto done;
    }
    ret = PyLong_FromLongLong(written);
done:
    if (mb) {
        for (Py_ssize_t i = 0; i < got_maps; i++) PyBuffer_Release(&mb[i]);
        free(mb);
    }
    PyBuffer_Release(&out); PyBuffer_Release(&bounds); PyBuffer_Release(&idsb); PyBuffer_Release(&mfirst);
    PyBuffer_Release(&mmap_); PyBuffer_Release(&mshift); PyBuffer_Release(&nlb);
    return ret;
}


/* cachestat(2) (Linux 6.5): how many pages of a file range are in the page cache, without
   touching them; older kernels fall back to mincore(2) over a mapping of the file */
struct sf_cachestat_range { uint64_t off, len; };
struct sf_cachestat { uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; };
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif

static PyObject *cached_pages(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer map;
    if (!PyArg_ParseTuple(args, "iy*", &fd, &map)) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    long long cached = -1;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    struct sf_cachestat_range range = {0, (uint64_t)map.len};
    struct sf_cachestat cs;
    if (syscall(__NR_cachestat, fd, &range, &cs, 0) == 0) {
        cached = (long long)cs.nr_cache;
    } else if (errno == ENOSYS || errno == EPERM) {
        size_t pages = ((size_t)map.len + (size_t)page - 1) / (size_t)page;
        unsigned char *vec = malloc(pages ? pages : 1);
        if (!vec) {
            err = ENOMEM;
        } else if (mincore(map.buf, (size_t)map.len, vec) == 0) {
            cached = 0;
            for (size_t i = 0; i < pages; i++) cached += vec[i] & 1;
        } else {
            err = errno;
        }
        free(vec);
    } else {
        err = errno;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&map);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLongLong(cached);
}


/* Mapping(fd, length): a read-only shared mapping of a file, read with MADV_RANDOM (a fault
   reads its own page, not megabytes around it), exposed as a read-only buffer and unmapped when
   the last reference goes (a buffer export holds one).  Unlike Python's mmap it keeps no
   duplicate of the descriptor: a pool of thousands of members would otherwise hold two each. */
typedef struct {
    PyObject_HEAD
    char *addr;
    Py_ssize_t len;
} MappingObject;

static PyObject *mapping_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    int fd;
    Py_ssize_t len;
    if (kwds && PyDict_Size(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Mapping(fd, length) takes no keywords");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "in", &fd, &len)) return NULL;
    if (len <= 0) {
        PyErr_SetString(PyExc_ValueError, "cannot map an empty file");
        return NULL;
    }
    void *addr = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
    (void)madvise(addr, (size_t)len, MADV_RANDOM);
    MappingObject *m = (MappingObject *)type->tp_alloc(type, 0);
    if (!m) {
        munmap(addr, (size_t)len);
        return NULL;
    }
    m->addr = addr;
    m->len = len;
    return (PyObject *)m;
}

static void mapping_dealloc(MappingObject *m) {
    if (m->addr) munmap(m->addr, (size_t)m->len);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static int mapping_getbuffer(MappingObject *m, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)m, m->addr, m->len, 1, flags);
}

static Py_ssize_t mapping_length(MappingObject *m) { return m->len; }

static PyBufferProcs mapping_as_buffer = {(getbufferproc)mapping_getbuffer, NULL};
static PyMappingMethods mapping_as_mapping = {(lenfunc)mapping_length, NULL, NULL};

static PyTypeObject MappingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shufflefs._gather.Mapping",
    .tp_basicsize = sizeof(MappingObject),
    .tp_dealloc = (destructor)mapping_dealloc,
    .tp_as_mapping = &mapping_as_mapping,
    .tp_as_buffer = &mapping_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Mapping(fd, length): a read-only mapping of a file (buffer protocol, len()).",
    .tp_new = mapping_new,
};

static PyMethodDef methods[] = {
    {"gather", gather, METH_VARARGS, "Copy byte ranges between buffers."},
    {"build_window", build_window, METH_VARARGS, "Read a window's records from a file into their view positions."},
    {"gather_mapped", gather_mapped, METH_VARARGS, "Copy records in view order from mappings of their files."},
    {"cached_pages", cached_pages, METH_VARARGS, "Pages of a mapped file in the page cache (cachestat or mincore)."},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_gather", NULL, -1, methods};
PyMODINIT_FUNC PyInit__gather(void) {
    static int installed;
    if (!installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_bus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &bus_previous)) return PyErr_SetFromErrno(PyExc_OSError);
        installed = 1;
    }
    if (PyType_Ready(&MappingType) < 0) return NULL;
    PyObject *m = PyModule_Create(&mod);
    if (!m) return NULL;
    Py_INCREF(&MappingType);
    if (PyModule_AddObject(m, "Mapping", (PyObject *)&MappingType) < 0) {
        Py_DECREF(&MappingType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
