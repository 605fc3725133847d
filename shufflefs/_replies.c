/*
 * Compiled replies to reads of loaded windows.
 *
 * pyfuse3 hands every request the kernel sends to libfuse's fuse_session_process_buf, which calls
 * back into Python; a read inside the window its handle already holds then costs a trip through
 * pyfuse3, trio and the catalog only to slice a buffer.  This module defines
 * fuse_session_process_buf itself.  Loaded with RTLD_GLOBAL before pyfuse3 (shufflefs/fs does),
 * it is the definition pyfuse3's calls bind to: a READ whose byte range lies inside the window
 * registered for its handle is answered here, with one writev from the window's buffer, after
 * the same per-read check of the source the catalog makes (fstat: still linked, same size,
 * mtime, ctime and inode).  Every other request, and every read that misses, goes to libfuse's
 * own function unchanged, so Python keeps control: it registers a handle's window when a read of
 * its own enters it, and unregisters it before the window's buffer can be reused or dropped.
 *
 * Python registers and unregisters on the trio thread, and pyfuse3 calls in from that thread
 * too, holding the GIL: the table changes only under the GIL.  A reply's writev (the copy of its
 * bytes into the kernel) runs on the calling thread with the GIL let go, or, after `start(n)`, on
 * one of n reply threads, so that replies use more cores than the trio thread's.  A reply in
 * flight pins its entry: unregistering waits for it, so a buffer is never recycled under a copy.
 */
#include "_passthrough.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* libfuse 3's public buffer (fuse_common.h, unchanged since 3.0) and the kernel protocol's
   headers (linux/fuse.h); declared here so that building needs no libfuse headers. */
struct fuse_session;
struct fuse_buf {
    size_t size;
    int flags;
    void *mem;
    int fd;
    off_t pos;
};
#define FUSE_BUF_IS_FD (1 << 1)
#define FUSE_READ_OPCODE 15
#define FUSE_INIT_OPCODE 26

struct in_header {
    uint32_t len, opcode;
    uint64_t unique, nodeid;
    uint32_t uid, gid, pid;
    uint16_t total_extlen, padding;
};
struct read_in {
    uint64_t fh, offset;
    uint32_t size, read_flags;
    uint64_t lock_owner;
    uint32_t flags, padding;
};
struct out_header {
    uint32_t len;
    int32_t error;
    uint64_t unique;
};

#define MAX_CHECKS 16
#define TABLE 4096 /* open handles with a registered window; a collision just leaves one to Python */

typedef struct {
    int fd;
    uint64_t ino, size;
    int64_t mtime_ns, ctime_ns;
} check_t;

typedef struct {
    int used;
    uint64_t fh;
    int64_t lo, hi;    /* view bytes [lo, hi) */
    const char *base;  /* view byte lo */
    Py_buffer view;    /* keeps the buffer alive while registered */
    int nchecks;
    check_t checks[MAX_CHECKS];
    uint64_t reads;    /* replies since the last `take` */
    int64_t last_end;  /* where the last reply ended */
    uint64_t last_ns;  /* CLOCK_MONOTONIC of the last reply */
    int inflight;      /* replies queued or being written (under `qlock`) */
    int64_t plain;     /* -1; else [lo, hi) are bytes of the plain view (of ``plain`` bytes) that a
                          zstd view of raw blocks frames (windows/container.py: ZstdRawFrame) */
    int stray;         /* a passthrough handle's (`passthrough_resident`) */
} entry_t;

/* A zstd view (windows/container.py, ZstdRawFrame): a 14-byte frame header, then raw blocks of
   ZSTD_UNIT plain bytes, each after a 3-byte header, the last one flagged. */
#define ZSTD_PREFIX 14
#define ZSTD_HEAD 3
#define ZSTD_UNIT (128 << 10)
#define MAX_PIECES 32 /* of a reply: 1 MiB over 128 KiB blocks takes at most 18 */

static entry_t table[TABLE];
static uint64_t n_replies, n_bytes, n_passed, n_missed, n_stale, n_write_errors, n_dropped;
static int last_write_errno;

/* Reply threads: a ring of queued replies, guarded by `qlock`, which also guards every entry's
   `inflight` and the reply counters once threads run. */
typedef struct {
    entry_t *e;
    int fd;
    uint64_t unique;
    int n;                             /* pieces */
    uint32_t size;                     /* their bytes */
    struct iovec iov[MAX_PIECES + 1];  /* [0]: the reply's header, filled when written */
    uint8_t heads[MAX_PIECES][ZSTD_HEAD];
} job_t;
#define QUEUE 1024
static job_t queue[QUEUE];
static int q_head, q_len, n_threads, stopping;
static pthread_t threads[64];
static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_work = PTHREAD_COND_INITIALIZER, q_done = PTHREAD_COND_INITIALIZER;

static void write_reply(job_t *j)
{
    int fd = j->fd;
    uint32_t size = j->size;
    struct out_header out = {(uint32_t)(sizeof out + size), 0, j->unique};
    struct iovec *iov = j->iov;
    iov[0] = (struct iovec){&out, sizeof out};
    for (int i = 1; i <= j->n; i++) /* a header piece points into the job's heads: moved with it */
        if (iov[i].iov_len <= ZSTD_HEAD && iov[i].iov_base == NULL)
            iov[i].iov_base = (void *)j->heads[i - 1];
    pthread_mutex_lock(&qlock); /* counted first: a reader that has the bytes sees them counted */
    n_replies++;
    n_bytes += size;
    pthread_mutex_unlock(&qlock);
    if (writev(fd, iov, j->n + 1) < 0) {
        int err = errno;
        pthread_mutex_lock(&qlock);
        n_replies--;
        n_bytes -= size;
        n_write_errors++; /* ENOENT: the request was interrupted; libfuse ignores that too */
        last_write_errno = err;
        pthread_mutex_unlock(&qlock);
    }
}

static void *reply_thread(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&qlock);
    for (;;) {
        while (!q_len && !stopping)
            pthread_cond_wait(&q_work, &qlock);
        if (!q_len)
            break;
        job_t j = queue[q_head];
        q_head = (q_head + 1) % QUEUE;
        q_len--;
        pthread_mutex_unlock(&qlock);
        write_reply(&j);
        pthread_mutex_lock(&qlock);
        if (--j.e->inflight == 0)
            pthread_cond_broadcast(&q_done);
    }
    pthread_mutex_unlock(&qlock);
    return NULL;
}

/* Wait (GIL let go) until no reply of ``e`` is queued or being written. */
static void settle(entry_t *e)
{
    pthread_mutex_lock(&qlock);
    if (e->inflight) {
        Py_BEGIN_ALLOW_THREADS
        while (e->inflight)
            pthread_cond_wait(&q_done, &qlock);
        Py_END_ALLOW_THREADS
    }
    pthread_mutex_unlock(&qlock);
}

typedef void (*process_fn)(struct fuse_session *, const struct fuse_buf *);
typedef int (*fd_fn)(struct fuse_session *);
static process_fn real_process;
static fd_fn real_fd;

static int resolve_libfuse(void)
{
    if (real_process && real_fd)
        return 0;
    void *h = dlopen("libfuse3.so.3", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libfuse3.so.3", RTLD_NOW);
    if (!h)
        return -1;
    real_process = (process_fn)dlvsym(h, "fuse_session_process_buf", "FUSE_3.0");
    real_fd = (fd_fn)dlvsym(h, "fuse_session_fd", "FUSE_3.0");
    if (!real_process)
        real_process = (process_fn)dlsym(h, "fuse_session_process_buf");
    if (!real_fd)
        real_fd = (fd_fn)dlsym(h, "fuse_session_fd");
    return real_process && real_fd ? 0 : -1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int source_unchanged(const entry_t *e)
{
    for (int i = 0; i < e->nchecks; i++) {
        const check_t *c = &e->checks[i];
        struct stat st;
        if (fstat(c->fd, &st) != 0 || st.st_nlink == 0 || (uint64_t)st.st_ino != c->ino
            || (uint64_t)st.st_size != c->size
            || (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec != c->mtime_ns
            || (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec != c->ctime_ns)
            return 0;
    }
    return 1;
}

/* The pieces of a read [off, *end) of a zstd view whose plain bytes [lo, hi) ``e`` holds: block
   headers (in j->heads, marked by a NULL base) and slices of the window; *end is clipped to the
   view's size.  0, or -1 if the read needs bytes the window lacks (the frame header, another
   window's) or too many pieces: Python answers it. */
static int zstd_pieces(const entry_t *e, int64_t off, int64_t *end, job_t *j)
{
    int64_t plain = e->plain, units = (plain + ZSTD_UNIT - 1) / ZSTD_UNIT, step = ZSTD_UNIT + ZSTD_HEAD;
    int64_t size = ZSTD_PREFIX + plain + units * ZSTD_HEAD;
    if (*end > size)
        *end = size;
    if (off < ZSTD_PREFIX || off >= *end)
        return -1;
    int n = 0;
    for (int64_t x = off; x < *end;) {
        int64_t u = (x - ZSTD_PREFIX) / step, p = (x - ZSTD_PREFIX) % step;
        int64_t length = plain - u * ZSTD_UNIT < ZSTD_UNIT ? plain - u * ZSTD_UNIT : ZSTD_UNIT;
        if (n == MAX_PIECES)
            return -1;
        n++;
        if (p < ZSTD_HEAD) { /* (part of) the block's header */
            uint32_t h = (uint32_t)(length << 3) | (u == units - 1);
            int64_t k = *end - x < ZSTD_HEAD - p ? *end - x : ZSTD_HEAD - p;
            for (int64_t i = 0; i < k; i++)
                j->heads[n - 1][i] = (uint8_t)(h >> (8 * (p + i)));
            j->iov[n] = (struct iovec){NULL, (size_t)k};
            x += k;
        } else {
            int64_t q = u * ZSTD_UNIT + p - ZSTD_HEAD, k = length - (p - ZSTD_HEAD);
            if (k > *end - x)
                k = *end - x;
            if (q < e->lo || q + k > e->hi)
                return -1;
            j->iov[n] = (struct iovec){(void *)(e->base + (q - e->lo)), (size_t)k};
            x += k;
        }
    }
    j->n = n;
    j->size = (uint32_t)(*end - off);
    return 0;
}

/* Answer ``in`` from its handle's window: 1 if answered (or the reply failed to go out, as
   libfuse would), 0 to leave it to libfuse and Python; a passthrough handle's (``stray``) read
   of bytes not in the page cache is refused (see `passthrough_resident`). */
static int reply_from_window(struct fuse_session *se, const struct in_header *in, const struct read_in *rd)
{
    entry_t *e = &table[rd->fh & (TABLE - 1)];
    int64_t off = (int64_t)rd->offset, end = off + (int64_t)rd->size;
    if (!e->used || e->fh != rd->fh || rd->size == 0 || (e->plain < 0 && (off < e->lo || end > e->hi))) {
        n_missed += e->used && e->fh == rd->fh;
        return 0;
    }
    if (!source_unchanged(e)) { /* the catalog's own check then fails the read, and logs why */
        n_stale++;
        return 0;
    }
    if (e->stray && !passthrough_resident(e->base + (off - e->lo), rd->size)) {
        struct out_header out = {(uint32_t)sizeof out, -EIO, in->unique};
        Py_BEGIN_ALLOW_THREADS
        (void)!write(real_fd(se), &out, sizeof out);
        Py_END_ALLOW_THREADS
        n_dropped++;
        return 1;
    }
    job_t j;
    j.e = e;
    j.fd = real_fd(se);
    j.unique = in->unique;
    if (e->plain < 0) {
        j.n = 1;
        j.size = rd->size;
        j.iov[1] = (struct iovec){(void *)(e->base + (off - e->lo)), rd->size};
    } else if (zstd_pieces(e, off, &end, &j) != 0) {
        n_missed++;
        return 0;
    }
    int queued = 0;
    if (n_threads) {
        pthread_mutex_lock(&qlock);
        if (q_len < QUEUE) {
            queue[(q_head + q_len) % QUEUE] = j;
            q_len++;
            e->inflight++;
            queued = 1;
            pthread_cond_signal(&q_work);
        }
        pthread_mutex_unlock(&qlock);
    }
    if (!queued) {
        Py_BEGIN_ALLOW_THREADS
        write_reply(&j);
        Py_END_ALLOW_THREADS
    }
    e->reads++;
    e->last_end = end;
    e->last_ns = now_ns();
    return 1;
}

/* The definition pyfuse3 binds to (see the top of this file). */
__attribute__((visibility("default"))) void fuse_session_process_buf(struct fuse_session *se,
                                                                     const struct fuse_buf *buf)
{
    if (resolve_libfuse() != 0)
        abort(); /* cannot happen: pyfuse3 itself needs libfuse3 loaded */
    if (!(buf->flags & FUSE_BUF_IS_FD) && buf->size >= sizeof(struct in_header) + sizeof(struct read_in)) {
        const struct in_header *in = buf->mem;
        if (in->opcode == FUSE_READ_OPCODE && in->len >= sizeof *in + sizeof(struct read_in)
            && reply_from_window(se, in, (const struct read_in *)(in + 1)))
            return;
    }
    if (!(buf->flags & FUSE_BUF_IS_FD) && buf->size >= sizeof(struct in_header)
        && ((const struct in_header *)buf->mem)->opcode == FUSE_INIT_OPCODE)
        passthrough_on_init(se, buf->mem, buf->size, real_fd(se));
    n_passed++;
    real_process(se, buf);
}

static void clear(entry_t *e)
{
    settle(e);
    if (e->used)
        PyBuffer_Release(&e->view);
    memset(e, 0, sizeof *e);
}

static PyObject *py_register(PyObject *self, PyObject *args)
{
    unsigned long long fh;
    long long lo, hi, at, plain = -1;
    int stray = 0;
    PyObject *buffer, *checks;
    if (!PyArg_ParseTuple(args, "KLLOLO|Lp", &fh, &lo, &hi, &buffer, &at, &checks, &plain, &stray))
        return NULL;
    PyObject *seq = PySequence_Fast(checks, "checks must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    check_t cs[MAX_CHECKS];
    if (n > MAX_CHECKS) {
        Py_DECREF(seq);
        Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int fd;
        unsigned long long ino, size;
        long long m, c;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iKKLL", &fd, &ino, &size, &m, &c)) {
            Py_DECREF(seq);
            return NULL;
        }
        cs[i] = (check_t){fd, ino, size, m, c};
    }
    Py_DECREF(seq);
    if (lo < 0 || hi < lo || at < 0 || plain < -1 || (plain >= 0 && hi > plain)) {
        PyErr_SetString(PyExc_ValueError, "bad window range");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (at + (hi - lo) > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "window range past the end of its buffer");
        return NULL;
    }
    entry_t *e = &table[fh & (TABLE - 1)];
    if (e->used && e->fh != fh) { /* another open handle has the place: Python serves this one */
        PyBuffer_Release(&view);
        Py_RETURN_FALSE;
    }
    clear(e);
    e->used = 1;
    e->fh = fh;
    e->lo = lo;
    e->hi = hi;
    e->view = view;
    e->base = (const char *)view.buf + at;
    e->nchecks = (int)n;
    memcpy(e->checks, cs, sizeof(check_t) * (size_t)n);
    e->last_end = -1;
    e->plain = plain;
    e->stray = stray && plain < 0;
    Py_RETURN_TRUE;
}

/* (replies since the last call, where the last one ended, its CLOCK_MONOTONIC ns) of ``fh``'s
   window, or None if none is registered; ``drop``: unregister it too. */
static PyObject *take(unsigned long long fh, int drop)
{
    entry_t *e = &table[fh & (TABLE - 1)];
    if (!e->used || e->fh != fh) {
        Py_RETURN_NONE;
    }
    unsigned long long reads = e->reads, ns = e->last_ns;
    long long last_end = e->last_end;
    e->reads = 0;
    if (drop)
        clear(e);
    return Py_BuildValue("KLK", reads, last_end, ns);
}

static PyObject *py_take(PyObject *self, PyObject *arg)
{
    unsigned long long fh = PyLong_AsUnsignedLongLong(arg);
    return PyErr_Occurred() ? NULL : take(fh, 0);
}

static PyObject *py_unregister(PyObject *self, PyObject *arg)
{
    unsigned long long fh = PyLong_AsUnsignedLongLong(arg);
    return PyErr_Occurred() ? NULL : take(fh, 1);
}

static PyObject *py_start(PyObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0 || n > 64 || n_threads) {
        PyErr_SetString(PyExc_ValueError, "0 to 64 reply threads, started once");
        return NULL;
    }
    for (long i = 0; i < n; i++) {
        int err = pthread_create(&threads[i], NULL, reply_thread, NULL);
        if (err) {
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        n_threads++;
    }
    Py_RETURN_NONE;
}

static PyObject *py_stop(PyObject *self, PyObject *unused)
{
    pthread_mutex_lock(&qlock);
    stopping = 1;
    pthread_cond_broadcast(&q_work);
    pthread_mutex_unlock(&qlock);
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < n_threads; i++)
        pthread_join(threads[i], NULL);
    Py_END_ALLOW_THREADS
    n_threads = 0;
    stopping = 0;
    Py_RETURN_NONE;
}

static PyObject *py_stats(PyObject *self, PyObject *unused)
{
    int registered = 0;
    for (int i = 0; i < TABLE; i++)
        registered += table[i].used;
    pthread_mutex_lock(&qlock);
    PyObject *d = Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:i,s:i,s:i}", "replies", (unsigned long long)n_replies,
                                "bytes", (unsigned long long)n_bytes, "passed",
                                (unsigned long long)n_passed, "missed",
                                (unsigned long long)n_missed, "stale", (unsigned long long)n_stale,
                                "readahead_refused", (unsigned long long)n_dropped,
                                "write_errors", (unsigned long long)n_write_errors, "last_write_errno",
                                last_write_errno, "registered", registered, "threads", n_threads);
    pthread_mutex_unlock(&qlock);
    return d;
}

static PyMethodDef methods[] = {
    {"register", py_register, METH_VARARGS,
     "register(fh, lo, hi, buffer, at, checks[, plain[, stray]]) -> bool: reads of view bytes [lo, hi) through fh "
     "are answered from buffer[at:], after checking every (fd, ino, size, mtime_ns, ctime_ns) in checks with fstat; "
     "with plain, [lo, hi) are bytes of a plain view of that size that a zstd view of raw blocks frames; stray "
     "(a passthrough handle's, whose reads are only the kernel's readahead, buffer a file mapping): bytes not in "
     "the page cache are refused with EIO"},
    {"unregister", py_unregister, METH_O, "unregister(fh) -> (replies, last_end, last_ns) or None"},
    {"take", py_take, METH_O, "take(fh) -> (replies since the last take, last_end, last_ns) or None"},
    {"start", py_start, METH_O, "start(n): replies are written by n threads of their own (0: by the caller)"},
    {"stop", py_stop, METH_NOARGS, "stop(): write the queued replies and end the reply threads"},
    {"stats", py_stats, METH_NOARGS, "counters of every reply made here and request passed on"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_replies", NULL, -1, methods};

PyMODINIT_FUNC PyInit__replies(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddFunctions(m, passthrough_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
