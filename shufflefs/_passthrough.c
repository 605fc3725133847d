/*
 * FUSE passthrough for opens whose bytes are a file on local disk.
 *
 * Since Linux 6.9 a FUSE server may answer an open with a backing file: the kernel then reads
 * that file itself for the handle (read, splice, mmap), as fast as a file of the local disk, and
 * never asks the server.  libfuse learned to ask for it in 3.16; with an older one (3.14 here) the
 * protocol is done here, around libfuse:
 *
 * - INIT: when the kernel offers FUSE_PASSTHROUGH and Python enabled it before mounting, the
 *   session's writes go through `hook_writev` (libfuse's fuse_session_custom_io, set before
 *   libfuse answers INIT), which adds FUSE_PASSTHROUGH and a stacking depth of 1 to the reply.
 * - a backing file is registered with the FUSE device (FUSE_DEV_IOC_BACKING_OPEN, which needs
 *   CAP_SYS_ADMIN), and the open's file handle is noted with its id (`passthrough_open`) just
 *   before Python returns from the open; the open's reply (16 bytes, that file handle) then gets
 *   FOPEN_PASSTHROUGH and the id.  The kernel looks the id up after the reply is written, so it
 *   stays registered until Python closes it (at the handle's release).
 *
 * Everything else goes out unchanged.
 */
#include "_passthrough.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#define FUSE_INIT_OPCODE 26
#define FUSE_INIT_EXT (1u << 30)
#define FUSE_PASSTHROUGH_HI (1u << 5) /* bit 37 of the 64 flags: in flags2 */
#define FOPEN_PASSTHROUGH (1u << 7)
#define FOPEN_NOFLUSH (1u << 5)

struct init_in {
    uint32_t major, minor, max_readahead, flags, flags2;
};
struct init_out {
    uint32_t major, minor, max_readahead, flags;
    uint16_t max_background, congestion_threshold;
    uint32_t max_write, time_gran;
    uint16_t max_pages, map_alignment;
    uint32_t flags2, max_stack_depth;
};
struct open_out {
    uint64_t fh;
    uint32_t open_flags;
    int32_t backing_id;
};
struct backing_map {
    int32_t fd;
    uint32_t flags;
    uint64_t padding;
};
#define FUSE_DEV_IOC_BACKING_OPEN _IOW(229, 1, struct backing_map)
#define FUSE_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

struct out_hdr {
    uint32_t len;
    int32_t error;
    uint64_t unique;
};

/* libfuse 3.12+'s custom io (fuse_lowlevel.h), declared here: building needs no libfuse headers */
struct custom_io {
    ssize_t (*writev)(int fd, struct iovec *iov, int count, void *userdata);
    ssize_t (*read)(int fd, void *buf, size_t buf_len, void *userdata);
    ssize_t (*splice_receive)(int fdin, off_t *offin, int fdout, off_t *offout, size_t len, unsigned int flags,
                              void *userdata);
    ssize_t (*splice_send)(int fdin, off_t *offin, int fdout, off_t *offout, size_t len, unsigned int flags,
                           void *userdata);
};
typedef int (*custom_io_fn)(struct fuse_session *, const struct custom_io *, int);

#define PENDING 64
static struct {
    uint64_t fh;
    int32_t id;
} pending[PENDING];
static int n_pending;
static pthread_mutex_t plock = PTHREAD_MUTEX_INITIALIZER;

static int wanted, negotiated, dev_fd = -1;
static uint64_t init_unique;
static const char *why_not = "not asked for";
static uint64_t n_passthrough_opens;

static ssize_t plain_read(int fd, void *buf, size_t len, void *ud)
{
    (void)ud;
    return read(fd, buf, len);
}

static ssize_t plain_splice(int fdin, off_t *offin, int fdout, off_t *offout, size_t len, unsigned int flags,
                            void *ud)
{
    (void)ud;
    return splice(fdin, offin, fdout, offout, len, flags);
}

static ssize_t hook_writev(int fd, struct iovec *iov, int count, void *ud)
{
    (void)ud;
    if (count >= 2 && iov[0].iov_len == sizeof(struct out_hdr)) {
        struct out_hdr *out = iov[0].iov_base;
        if (init_unique && out->unique == init_unique) {
            init_unique = 0;
            if (out->error == 0 && iov[1].iov_len >= sizeof(struct init_out)) {
                struct init_out *o = iov[1].iov_base;
                o->flags |= FUSE_INIT_EXT;
                o->flags2 |= FUSE_PASSTHROUGH_HI;
                o->max_stack_depth = 1;
                negotiated = 1;
                why_not = "";
            }
        } else if (n_pending && out->error == 0 && iov[1].iov_len == sizeof(struct open_out)) {
            struct open_out *o = iov[1].iov_base;
            int32_t id = 0;
            pthread_mutex_lock(&plock);
            for (int i = 0; i < n_pending; i++) {
                if (pending[i].fh == o->fh) {
                    id = pending[i].id;
                    pending[i] = pending[--n_pending];
                    break;
                }
            }
            pthread_mutex_unlock(&plock);
            if (id > 0) {
                /* the kernel refuses a passthrough open with any flag but these (keep_cache is
                   pyfuse3's default): reads and mmap go to the backing file */
                o->open_flags = (o->open_flags & FOPEN_NOFLUSH) | FOPEN_PASSTHROUGH;
                o->backing_id = id;
                ssize_t res = writev(fd, iov, count); /* the id stays registered until the release */
                if (res >= 0)
                    __atomic_add_fetch(&n_passthrough_opens, 1, __ATOMIC_RELAXED);
                return res;
            }
        }
    }
    return writev(fd, iov, count);
}

void passthrough_on_init(struct fuse_session *se, const void *request, size_t size, int fd)
{
    const uint32_t *words = request; /* the in_header: len, opcode, ... (40 bytes) */
    if (!wanted || size < 40 + sizeof(struct init_in) || words[1] != FUSE_INIT_OPCODE)
        return;
    const struct init_in *in = (const struct init_in *)((const char *)request + 40);
    if (!(in->flags & FUSE_INIT_EXT) || !(in->flags2 & FUSE_PASSTHROUGH_HI)) {
        why_not = "the kernel does not offer it (Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH)";
        return;
    }
    void *lib = dlopen("libfuse3.so.3", RTLD_NOW | RTLD_NOLOAD);
    custom_io_fn set_io = lib ? (custom_io_fn)dlsym(lib, "fuse_session_custom_io") : NULL;
    if (!set_io) {
        why_not = "libfuse has no custom io (3.12+)";
        return;
    }
    static const struct custom_io io = {hook_writev, plain_read, plain_splice, plain_splice};
    if (set_io(se, &io, fd) != 0) {
        why_not = "libfuse refused custom io";
        return;
    }
    dev_fd = fd;
    init_unique = *(const uint64_t *)((const char *)request + 8);
}

static PyObject *py_enable(PyObject *self, PyObject *unused)
{
    wanted = 1;
    why_not = "not negotiated yet";
    Py_RETURN_NONE;
}

static PyObject *py_state(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("{s:O,s:s,s:K}", "on", negotiated ? Py_True : Py_False, "why_not", why_not,
                         "opens", (unsigned long long)n_passthrough_opens);
}

static PyObject *py_backing_open(PyObject *self, PyObject *arg)
{
    int fd = (int)PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (!negotiated) {
        errno = EOPNOTSUPP;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    struct backing_map map = {fd, 0, 0};
    int id = ioctl(dev_fd, FUSE_DEV_IOC_BACKING_OPEN, &map);
    if (id < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(id);
}

static PyObject *py_backing_close(PyObject *self, PyObject *arg)
{
    int32_t id = (int32_t)PyLong_AsLong(arg);
    if (id == -1 && PyErr_Occurred())
        return NULL;
    if (ioctl(dev_fd, FUSE_DEV_IOC_BACKING_CLOSE, &id) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *py_passthrough_open(PyObject *self, PyObject *args)
{
    unsigned long long fh;
    int id;
    if (!PyArg_ParseTuple(args, "Ki", &fh, &id))
        return NULL;
    pthread_mutex_lock(&plock);
    int ok = n_pending < PENDING;
    if (ok) {
        pending[n_pending].fh = fh;
        pending[n_pending].id = id;
        n_pending++;
    }
    pthread_mutex_unlock(&plock);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "too many passthrough opens waiting for their replies");
        return NULL;
    }
    Py_RETURN_NONE;
}

PyMethodDef passthrough_methods[] = {
    {"passthrough_enable", py_enable, METH_NOARGS, "ask for FUSE passthrough at the next INIT"},
    {"passthrough_state", py_state, METH_NOARGS, "{'on': negotiated, 'why_not': ..., 'opens': n}"},
    {"backing_open", py_backing_open, METH_O, "backing_open(fd) -> id of fd registered as a backing file"},
    {"backing_close", py_backing_close, METH_O, "backing_close(id)"},
    {"passthrough_open", py_passthrough_open, METH_VARARGS,
     "passthrough_open(fh, id): the open replied next with file handle fh reads backing file id"},
    {NULL, NULL, 0, NULL},
};

/* Whether bytes [p, p + n) of a file mapping are all in the page cache, read (mincore).  The only
   reads of a passthrough handle that reach the daemon are the kernel's readahead into the view's
   own page cache, which none of its handles reads (a reader's POSIX_FADV_WILLNEED, which pyarrow
   gives for every column chunk): the compiled replies refuse those of bytes not in the page cache
   (EIO: the kernel drops the readahead and leaves its pages not up to date) rather than read them
   from disk while the reader's hint waits; a kept 1.06 GiB stage read cold got its first batch
   0.63-0.72 s after its open, 0.10-0.23 s refusing. */
int passthrough_resident(const char *p, size_t n)
{
    static long page;
    if (!page)
        page = sysconf(_SC_PAGESIZE);
    unsigned char vec[512];
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1), b = (uintptr_t)p + n;
    while (a < b) {
        size_t pages = (b - a + (uintptr_t)page - 1) / (uintptr_t)page;
        if (pages > sizeof vec)
            pages = sizeof vec;
        if (mincore((void *)a, pages * (size_t)page, vec) != 0)
            return 0;
        for (size_t i = 0; i < pages; i++)
            if (!(vec[i] & 1))
                return 0;
        a += pages * (uintptr_t)page;
    }
    return 1;
}
