/* Copies of records from read-only mappings of their files, for shufflefs._gather (see the
   functions' descriptions in _gather.c): gather_mapped with its SIGBUS guard (a file that shrinks
   under its mapping ends the copy, not the process; the guard also covers the reads of a tar
   sample's neighbours in the mapping), cached_pages, and the Mapping type. */
#include "_gather.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "_framing.h"

/* SIGBUS from a mapping whose file shrank: jump out of the copy that faulted (on its own thread) */
static __thread sigjmp_buf *volatile bus_guard;  /* volatile: the stores around the copy must stay */
static struct sigaction bus_previous;

static void on_bus(int sig, siginfo_t *info, void *ctx) {
    sigjmp_buf *g = bus_guard;
    if (g) siglongjmp(*g, 1);
    /* not a guarded copy: put the previous handler back and raise the signal again, so that it
       meets that handler (a faulting access would repeat; a SIGBUS sent by kill(2) would not) */
    sigaction(SIGBUS, &bus_previous, NULL);
    raise(SIGBUS);
    (void)sig; (void)info; (void)ctx;
}

#define PREFETCH_RUNS 8

/* a tar sample (record x of member m, copied and walked: ``t``) against its neighbours in its
   file, read from the file's mapping: 0, or a reason (*bad_id: x) */
static int edges_in_map(Py_buffer *mb, const int64_t *b, Py_ssize_t nrec, const int64_t *mf, const int64_t *mm,
                        const int64_t *ms, Py_ssize_t NM, const int64_t *mpred, const int64_t *mrecend,
                        const sf_seen *seen, Py_ssize_t m, int64_t x, const tar_sample *t) {
    tar_src s = {mb[mm[m]].buf, mb[mm[m]].len, NULL, 0, 0, 0, 0};
    tar_sample near;  /* a neighbour in the member walked before is not read again */
    int64_t pred = x > mf[m] ? b[x - 1] + ms[m] : mpred[m], end = b[x + 1] + ms[m];
    int why = x > mf[m] && sf_seen_get(seen, x - 1, &near) ? tar_pair(&near, t) : tar_left(&s, pred, b[x] + ms[m], t);
    if (!why) {
        int64_t after = m + 1 < NM ? mf[m + 1] : nrec;
        if (end != mrecend[m] && x + 1 < after && sf_seen_get(seen, x + 1, &near)) why = tar_pair(t, &near);
        else why = tar_right(&s, end, mrecend[m], t);
    }
    return why == FRAME_UNREAD ? frame_eof() : why;
}

/* the records of gather_mapped; 0, -1 when a mapping faulted (*fault = i), 1 for bad input
   (*fault = i), or 2 when record ids[i] failed its framing check (*why, the reason, and *fault
   = i; *bad_id the record where the index is wrong) */
static int copy_view_order(char *ob, Py_ssize_t olen, Py_buffer *mb, Py_ssize_t M, const int64_t *b, Py_ssize_t nrec,
                           const int64_t *ids, Py_ssize_t n, const int64_t *mf, const int64_t *mm, const int64_t *ms,
                           Py_ssize_t NM, const int64_t *nl, Py_ssize_t NL, int64_t *written, Py_ssize_t *fault,
                           int kind, const int64_t *ut, Py_ssize_t NUT, const int64_t *mpred, const int64_t *mrecend,
                           const sf_seen *seen, int *why, int64_t *bad_id) {
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
        Py_ssize_t m = NM == 1 ? 0 : sf_last_le(mf, NM, x);
        if (m < 0 || mm[m] < 0 || mm[m] >= M) break;
        int64_t off = b[x] + ms[m], len = b[x + 1] - b[x];
        if (i + PREFETCH_RUNS < n) {
            int64_t y = ids[i + PREFETCH_RUNS];
            if (y >= 0 && y < nrec) {
                Py_ssize_t q = NM == 1 ? 0 : sf_last_le(mf, NM, y);
                if (q >= 0 && mm[q] >= 0 && mm[q] < M && b[y] + ms[q] >= 0 && b[y] + ms[q] < mb[mm[q]].len)
                    __builtin_prefetch((const char *)mb[mm[q]].buf + b[y] + ms[q], 0, 0);
            }
        }
        if (len < 0 || off < 0 || off > mb[mm[m]].len - len || pos > olen - len) break;
        memcpy(ob + pos, (const char *)mb[mm[m]].buf + off, (size_t)len);
        int gains = sf_gains_nl(nl, NL, x);
        if (kind) {
            uint64_t key = 0;
            *bad_id = x;
            if (kind == FRAME_TAR) {
                tar_sample t;
                *why = frame_tar((const unsigned char *)ob + pos, len, &t);
                if (!*why) {
                    sf_seen_put(seen, x, &t);
                    *why = edges_in_map(mb, b, nrec, mf, mm, ms, NM, mpred, mrecend, seen, m, x, &t);
                }
            } else {
                *why = frame_record(kind, (const unsigned char *)ob + pos, len, sf_gains_nl(ut, NUT, x), &key);
            }
            if (*why) {
                bus_guard = NULL;
                *written = pos;
                *fault = i;
                return 2;
            }
        }
        pos += len;
        if (gains) {
            if (pos >= olen) break;
            ob[pos++] = '\n';
        }
    }
    bus_guard = NULL;
    *written = pos;
    *fault = i;
    return i < n ? 1 : 0;
}

PyObject *sf_gather_mapped(PyObject *self, PyObject *args) {
    Py_buffer out, bounds, idsb, mfirst, mmap_, mshift, nlb, rep = {0}, utb = {0}, mpred = {0}, mrecend = {0},
              seenk = {0}, seenf = {0};
    PyObject *maps;
    int kind = 0;
    if (!PyArg_ParseTuple(args, "w*O!y*y*y*y*y*y*|iw*y*y*y*w*w*", &out, &PyTuple_Type, &maps, &bounds, &idsb, &mfirst,
                          &mmap_, &mshift, &nlb, &kind, &rep, &utb, &mpred, &mrecend, &seenk, &seenf))
        return NULL;
    sf_seen seen = {NULL, NULL};
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
    if (sf_check_i64(&bounds, -1, "bounds") || sf_check_i64(&idsb, -1, "ids") || sf_check_i64(&mfirst, -1, "member_first")
        || sf_check_i64(&mmap_, NM, "member_map") || sf_check_i64(&mshift, NM, "member_shift")
        || sf_check_i64(&nlb, -1, "newline_ids") || sf_check_i64(&utb, -1, "unterminated") || sf_framing_args(kind, &rep)
        || (kind == FRAME_TAR && (sf_check_i64(&mpred, NM, "member_pred") || sf_check_i64(&mrecend, NM, "member_recend")
                                  || sf_seen_of(&seenk, &seenf, nrec, &seen) < 0)))
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
    int64_t written = 0, bad_id = -1;
    Py_ssize_t at = 0;
    int rc, why = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = copy_view_order(out.buf, out.len, mb, M, bounds.buf, nrec, idsb.buf, n, mf, mmap_.buf, mshift.buf, NM, nl, NL,
                         &written, &at, kind, utb.buf, utb.len / 8, mpred.buf, mrecend.buf, &seen, &why, &bad_id);
    Py_END_ALLOW_THREADS
    if (rc == 2) {
        ((int64_t *)rep.buf)[0] = bad_id;
        ((int64_t *)rep.buf)[1] = why;
        ret = PyLong_FromLongLong(written);
        goto done;
    }
    if (rc > 0) {
        PyErr_Format(PyExc_IndexError, "record %zd (id %lld) is outside its bounds, mapping or the output", at,
                     (long long)((const int64_t *)idsb.buf)[at]);
        goto done;
    }
    if (rc < 0) {
        const int64_t *ids = idsb.buf, *b = bounds.buf, *ms = mshift.buf;
        int64_t x = ids[at];
        Py_ssize_t m = NM == 1 ? 0 : sf_last_le(mf, NM, x);
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
    PyBuffer_Release(&mmap_); PyBuffer_Release(&mshift); PyBuffer_Release(&nlb); PyBuffer_Release(&rep);
    PyBuffer_Release(&utb); PyBuffer_Release(&mpred); PyBuffer_Release(&mrecend); PyBuffer_Release(&seenk);
    PyBuffer_Release(&seenf);
    return ret;
}


/* cachestat(2) (Linux 6.5): how many pages of a file range are in the page cache, without
   touching them; older kernels fall back to mincore(2) over a mapping of the file */
struct sf_cachestat_range { uint64_t off, len; };
struct sf_cachestat { uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; };
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif

PyObject *sf_cached_pages(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer map;
    long long offset = 0;  /* of the mapping's first byte in the file (page-aligned) */
    if (!PyArg_ParseTuple(args, "iy*|L", &fd, &map, &offset)) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    long long cached = -1;
    int err = 0;
    if (offset < 0 || offset % page) {
        PyBuffer_Release(&map);
        PyErr_SetString(PyExc_ValueError, "offset: not a multiple of the page size");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    struct sf_cachestat_range range = {(uint64_t)offset, (uint64_t)map.len};
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

/* the SIGBUS handler (once per process) and the Mapping type, added to ``module`` */
int sf_mapped_init(PyObject *module) {
    static int installed;
    if (!installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_bus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &bus_previous)) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        installed = 1;
    }
    if (PyType_Ready(&MappingType) < 0) return -1;
    Py_INCREF(&MappingType);
    if (PyModule_AddObject(module, "Mapping", (PyObject *)&MappingType) < 0) {
        Py_DECREF(&MappingType);
        return -1;
    }
    return 0;
}
