/* The one compiled piece of shufflefs: building windows of shuffled records with the GIL
   released.  numpy has no variable-length gather; the fallbacks in layout.py and view.py compute
   the same bytes, several times slower.  This file has the module and the window builds from
   descriptors; _mapped.c the copies from mappings; _framing.c the checks of every record.

   gather(out, src, out_pos, src_pos, lengths)
       out[out_pos[i]:+lengths[i]] = src[src_pos[i]:+lengths[i]] for all i.

   build_window(out, scratch, bounds, ids, run_first, run_count, run_fd, run_shift, newline_ids
                [, kind, member_first, edges, report, unterminated, seen_key, seen_flags])
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
       (it shrank: the caller reports it).  With a framing ``kind`` (_framing.h) every record is
       checked whole while it is in the scratch (`frame_record`), and a tar sample against the
       one before it in its member (``member_first``: the first record of every member, sorted);
       ``seen`` (seen_key, seen_flags after ``unterminated``: `sf_seen`) remembers every sample
       walked and spares reading a neighbour walked before.
       ``edges`` (None, or six int64 arrays: first, count, fd, shift, pred, recend) are the
       window's runs of consecutive samples, each in one file, with the descriptor and shift of
       that file (a stage's runs are in their source file there) and where the sample before
       each run starts in it (-1: none) and where its samples end: each run's first and last
       sample are checked against their neighbours in the file (_edges.c; fd -1: the caller
       does).  The first record found wrong stops the build with ``report`` (int64[2]) =
       (record id, reason), else (-1, 0).  ``unterminated`` (sorted): the records that are lines
       without their newline.

   gather_mapped(out, maps, bounds, ids, member_first, member_map, member_shift, newline_ids
                 [, kind, report, unterminated, member_pred, member_recend, seen_key, seen_flags])
       Copies records ``ids`` in view order from mappings of their files to the front of
       ``out``, one after the other: record x lies in the member m whose ``member_first[m]`` is
       the last <= x (sorted, starting at 0), at offset ``bounds[x] + member_shift[m]`` of the
       buffer ``maps[member_map[m]]``.  No sort, no runs, writes in order; for record-level
       orders, whose records are scattered anyway.  A record in ``newline_ids`` gets a newline
       after it.  Returns the bytes written, or ``(i, file offset)`` when the mapping of ids[i]
       faulted (SIGBUS: its file shrank).  Each record is checked (inside the bounds, the
       mapping and ``out``) just before it is copied; bad input raises with ``out`` partly
       written, which the caller discards.  ``kind`` and ``report`` as for build_window: each
       record is checked as it is copied, a tar sample against its neighbours in its file, read
       from the mapping (``member_pred``, ``member_recend``: where the sample before each
       member's first starts in its file, -1 for none, and where the file's samples end; ``seen``
       as for build_window).

   check_window(window, kind, bounds, ids, newline_ids, report, unterminated[, keys])
       The same checks over a window built elsewhere (records ``ids`` one after the other, a
       newline after those in ``newline_ids``); ``keys`` (uint64, one per id): each tar
       sample's key.  A tar window's edges need its source: check_pieces (_edges.c).

   Mapping(fd, length)
       A read-only mapping of a file (MADV_RANDOM), a buffer, unmapped when last referenced;
       unlike mmap.mmap it holds no duplicate descriptor.

   cached_pages(fd, mapping)
       How many pages of the file open as ``fd`` (mapped whole as ``mapping``) are in the page
       cache: cachestat(2), or mincore(2) over the mapping on kernels without it.

   Except in gather_mapped, every id, run and position is checked before any byte is read or
   copied; bad input raises ValueError or IndexError. */
#include "_gather.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "_framing.h"

int sf_check_i64(Py_buffer *b, Py_ssize_t n, const char *name) {
    if (b->len % 8 || (n >= 0 && b->len / 8 != n)) {
        PyErr_Format(PyExc_ValueError, "%s must be an int64 array of the right size", name);
        return -1;
    }
    return 0;
}

#define GATHER_AHEAD 8

static PyObject *gather(PyObject *self, PyObject *args) {
    Py_buffer out, src, opos, spos, lens;
    if (!PyArg_ParseTuple(args, "w*y*y*y*y*", &out, &src, &opos, &spos, &lens)) return NULL;
    PyObject *ret = NULL;
    Py_ssize_t n = lens.len / 8;
    if (sf_check_i64(&lens, -1, "lengths") || sf_check_i64(&opos, n, "out_pos") || sf_check_i64(&spos, n, "src_pos"))
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
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + GATHER_AHEAD < n) {  /* scattered runs: ask for the source's first lines early */
            const char *a = sb + s[i + GATHER_AHEAD];
            __builtin_prefetch(a); __builtin_prefetch(a + 64);
        }
        memcpy(ob + o[i], sb + s[i], (size_t)l[i]);
    }
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

/* index of the last element of sorted a[0..n) that is <= x, or -1 */
Py_ssize_t sf_last_le(const int64_t *a, Py_ssize_t n, int64_t x) {
    Py_ssize_t lo = -1, hi = n;
    while (hi - lo > 1) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (a[mid] <= x) lo = mid; else hi = mid;
    }
    return lo;
}

/* ------------------------------------------------------------------ framing (_framing.c) */

int sf_gains_nl(const int64_t *nl, Py_ssize_t NL, int64_t x) {
    if (!NL) return 0;
    Py_ssize_t j = sf_last_le(nl, NL, x);
    return j >= 0 && nl[j] == x;
}

/* the first record of the member after the one holding record x (nrec after the last) */
static int64_t member_end(const int64_t *mf, Py_ssize_t NMF, int64_t nrec, int64_t x) {
    Py_ssize_t m = NMF ? sf_last_le(mf, NMF, x) : -1;
    return m + 1 < NMF ? mf[m + 1] : nrec;
}

/* consecutive records of one run, checked in source order: each whole, and a tar sample
   against the one before it in its member (`tar_pair`) */
typedef struct {
    int kind;
    int have;  /* prev is the record before this one, in its member */
    tar_sample prev;
    int64_t edge;
    const int64_t *mf;
    Py_ssize_t NMF;
    int64_t nrec;
    const sf_seen *seen;
} run_frames;

static int frame_next(run_frames *f, const unsigned char *r, int64_t len, int open, int64_t y) {
    if (f->kind != FRAME_TAR) {
        uint64_t key = 0;
        return frame_record(f->kind, r, len, open, &key);
    }
    tar_sample t;
    int why = frame_tar(r, len, &t);
    if (why) return why;
    sf_seen_put(f->seen, y, &t);
    if (y >= f->edge) {
        f->have = 0;
        f->edge = member_end(f->mf, f->NMF, f->nrec, y);
    }
    if (f->have && (why = tar_pair(&f->prev, &t))) return why;
    f->prev = t;
    f->have = 1;
    return 0;
}

/* the window's runs of samples (build_window's ``edges``), each in one file */
typedef struct {
    Py_buffer first, count, fd, shift, pred, recend;
    Py_ssize_t n;
    int parsed;
} edge_runs;

static void edges_release(edge_runs *e) {
    if (!e->parsed) return;
    PyBuffer_Release(&e->first); PyBuffer_Release(&e->count); PyBuffer_Release(&e->fd);
    PyBuffer_Release(&e->shift); PyBuffer_Release(&e->pred); PyBuffer_Release(&e->recend);
}

/* ``edges`` parsed (None: no runs); every run's records must be records of the window's runs */
static int edges_parse(PyObject *edges, edge_runs *e, const int64_t *rf, const int64_t *rc, Py_ssize_t R,
                       int64_t nrec) {
    memset(e, 0, sizeof *e);
    if (edges == NULL || edges == Py_None) return 0;
    if (!PyArg_ParseTuple(edges, "y*y*y*y*y*y*", &e->first, &e->count, &e->fd, &e->shift, &e->pred, &e->recend))
        return -1;
    e->parsed = 1;
    e->n = e->first.len / 8;
    if (sf_check_i64(&e->first, -1, "edge first") || sf_check_i64(&e->count, e->n, "edge count")
        || sf_check_i64(&e->fd, e->n, "edge fd") || sf_check_i64(&e->shift, e->n, "edge shift")
        || sf_check_i64(&e->pred, e->n, "edge pred") || sf_check_i64(&e->recend, e->n, "edge recend"))
        return -1;
    const int64_t *f = e->first.buf, *c = e->count.buf, *fd = e->fd.buf;
    for (Py_ssize_t i = 0; i < e->n; i++) {
        int64_t x1 = f[i] + c[i] - 1;
        Py_ssize_t a = sf_last_le(rf, R, f[i]), z = sf_last_le(rf, R, x1);
        if (c[i] < 1 || f[i] < 0 || x1 >= nrec || fd[i] > INT32_MAX || a < 0 || f[i] >= rf[a] + rc[a] || z < 0
            || x1 >= rf[z] + rc[z]) {
            PyErr_Format(PyExc_IndexError, "edge run %zd is not of the window's records", i);
            return -1;
        }
    }
    return 0;
}

/* the edges of every run with a descriptor, its first and last sample walked in the window
   (``view_at``: the view position of a record); 0, a reason (*bad_id) or -errno */
static int check_edges(const edge_runs *e, const int64_t *b, const char *ob, const int64_t *rf, Py_ssize_t R,
                       const int64_t *rrank, const int64_t *dst, const int64_t *mf, Py_ssize_t NMF, int64_t nrec,
                       const sf_seen *seen, int64_t *bad_id) {
    const int64_t *f = e->first.buf, *c = e->count.buf, *fd = e->fd.buf, *sh = e->shift.buf, *pred = e->pred.buf,
                  *recend = e->recend.buf;
    sf_fd_reader *rd = e->n ? sf_fd_reader_new() : NULL;
    if (e->n && !rd) return -ENOMEM;
    int why = 0;
    for (Py_ssize_t i = 0; i < e->n && !why; i++) {
        if (fd[i] < 0) continue;
        int64_t x[2] = {f[i], f[i] + c[i] - 1};
        tar_sample t[2];
        for (int k = 0; k < 2 && !why; k++) {
            Py_ssize_t lo = sf_last_le(rf, R, x[k]);
            why = frame_tar((const unsigned char *)ob + dst[rrank[lo] + x[k] - rf[lo]], b[x[k] + 1] - b[x[k]], &t[k]);
            *bad_id = x[k];
        }
        int side = 0;
        Py_ssize_t m = NMF ? sf_last_le(mf, NMF, x[0]) : -1;  /* the neighbours in the member: walked before? */
        int64_t pred_id = m >= 0 && x[0] > mf[m] ? x[0] - 1 : -1;
        int64_t next_id = x[1] + 1 < member_end(mf, NMF, nrec, x[1]) ? x[1] + 1 : -1;
        if (!why) why = sf_tar_run_edges_seen(rd, seen, pred_id, next_id, (int)fd[i], pred[i], b[x[0]] + sh[i], &t[0],
                                              b[x[1] + 1] + sh[i], recend[i], &t[1], &side);
        if (why > 0) *bad_id = x[side];
    }
    sf_fd_reader_free(rd);
    return why;
}

int sf_framing_args(int kind, Py_buffer *report) {
    if (kind < 0 || kind >= FRAME_KINDS) {
        PyErr_Format(PyExc_ValueError, "no framing kind %d", kind);
        return -1;
    }
    if (kind && (report->buf == NULL || report->len < 16 || report->readonly)) {
        PyErr_SetString(PyExc_ValueError, "a framing check needs a writable int64[2] report");
        return -1;
    }
    if (report->buf && report->len >= 16) {
        ((int64_t *)report->buf)[0] = -1;
        ((int64_t *)report->buf)[1] = 0;
    }
    return 0;
}

static PyObject *build_window(PyObject *self, PyObject *args) {
    Py_buffer out, scratch, bounds, idsb, rfirst, rcount, rfd, rshift, nlb, mfb = {0}, rep = {0}, utb = {0},
              seenk = {0}, seenf = {0};
    PyObject *edges = NULL;
    int kind = 0;
    if (!PyArg_ParseTuple(args, "w*w*y*y*y*y*y*y*y*|iy*Ow*y*w*w*", &out, &scratch, &bounds, &idsb, &rfirst, &rcount,
                          &rfd, &rshift, &nlb, &kind, &mfb, &edges, &rep, &utb, &seenk, &seenf))
        return NULL;
    sf_seen seen = {NULL, NULL};
    PyObject *ret = NULL;
    edge_runs er = {0};
    int64_t *dst = NULL, *rrank = NULL;
    Py_ssize_t n = idsb.len / 8, R = rfirst.len / 8, nrec = bounds.len / 8 - 1, NL = nlb.len / 8, NMF = mfb.len / 8,
               NUT = utb.len / 8;
    if (sf_check_i64(&bounds, -1, "bounds") || sf_check_i64(&idsb, -1, "ids") || sf_check_i64(&rfirst, -1, "run_first")
        || sf_check_i64(&rcount, R, "run_count") || sf_check_i64(&rfd, R, "run_fd") || sf_check_i64(&rshift, R, "run_shift")
        || sf_check_i64(&nlb, -1, "newline_ids") || sf_check_i64(&mfb, -1, "member_first")
        || sf_check_i64(&utb, -1, "unterminated") || sf_framing_args(kind, &rep))
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
    if (edges_parse(kind == FRAME_TAR ? edges : NULL, &er, rf, rc, R, nrec) < 0
        || (kind == FRAME_TAR && sf_seen_of(&seenk, &seenf, nrec, &seen) < 0))
        goto done;
    /* view position of every record, stored by its rank in source order; each rank exactly once,
       so the ids are exactly the records of the runs */
    for (Py_ssize_t i = 0; i < n; i++) dst[i] = -1;
    int64_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t x = ids[i];
        Py_ssize_t lo = sf_last_le(rf, R, x);
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
            Py_ssize_t j = sf_last_le(nl, NL, x);
            pos += j >= 0 && nl[j] == x;
        }
    }
    if (pos > out.len) {
        PyErr_Format(PyExc_IndexError, "window of %lld bytes does not fit the output buffer", (long long)pos);
        goto done;
    }
    int err = 0, bad = 0;
    int64_t short_at = -1, bad_id = -1;
    Py_ssize_t short_run = -1;
    const int64_t *mf = mfb.buf, *ut = utb.buf;
    Py_BEGIN_ALLOW_THREADS
    char *ob = out.buf, *sb = scratch.buf;
    const int64_t cap = scratch.len;
    for (Py_ssize_t r = 0; r < R && !err && !bad; r++) {
        int64_t x = rf[r], end = rf[r] + rc[r], sh = shift[r];
        int fd = (int)fds[r];
        const int64_t *d = dst + rrank[r] - rf[r];  /* d[y] = view position of record y */
        run_frames f = {kind, 0, {0, 0, 0}, member_end(mf, NMF, nrec, x), mf, NMF, nrec, &seen};
        short_run = r;
        while (x < end && !err && !bad) {
            int64_t a = x, size = 0;
            while (x < end && size + (b[x + 1] - b[x]) <= cap) {
                size += b[x + 1] - b[x];
                x++;
            }
            if (x == a) {  /* one record larger than the scratch: read it in place */
                err = pread_full(fd, ob + d[a], b[a + 1] - b[a], b[a] + sh, &short_at);
                if (!err && kind && (bad = frame_next(&f, (unsigned char *)ob + d[a], b[a + 1] - b[a],
                                                      sf_gains_nl(ut, NUT, a), a)))
                    bad_id = a;
                x++;
                continue;
            }
            /* records that follow each other in the view too (`none`): read in place, no copy */
            int in_place = 1;
            for (int64_t y = a; y + 1 < x && in_place; y++) in_place = d[y + 1] == d[y] + (b[y + 1] - b[y]);
            char *rb = in_place ? ob + d[a] : sb;
            err = pread_full(fd, rb, size, b[a] + sh, &short_at);
            if (err) break;
            for (int64_t y = a, p = 0; y < x; y++) {
                if (kind && (bad = frame_next(&f, (unsigned char *)rb + p, b[y + 1] - b[y], sf_gains_nl(ut, NUT, y), y))) {
                    bad_id = y;
                    break;
                }
                if (!in_place) memcpy(ob + d[y], sb + p, (size_t)(b[y + 1] - b[y]));
                p += b[y + 1] - b[y];
            }
        }
    }
    if (!err && !bad && er.n) {  /* each run's first and last sample against their neighbours */
        int why = check_edges(&er, b, ob, rf, R, rrank, dst, mf, NMF, nrec, &seen, &bad_id);
        if (why < 0) err = -why; else bad = why;
    }
    for (Py_ssize_t j = 0; j < NL && !err && !bad; j++) {
        Py_ssize_t r = sf_last_le(rf, R, nl[j]);
        if (r >= 0 && nl[j] < rf[r] + rc[r])
            ob[dst[rrank[r] + nl[j] - rf[r]] + b[nl[j] + 1] - b[nl[j]]] = '\n';
    }
    Py_END_ALLOW_THREADS
    if (err > 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (bad) {
        ((int64_t *)rep.buf)[0] = bad_id;
        ((int64_t *)rep.buf)[1] = bad;
    }
    ret = err < 0 ? Py_BuildValue("nL", short_run, (long long)short_at) : PyLong_FromLongLong(pos);
done:
    free(dst);
    free(rrank);
    edges_release(&er);
    PyBuffer_Release(&out); PyBuffer_Release(&scratch); PyBuffer_Release(&bounds); PyBuffer_Release(&idsb);
    PyBuffer_Release(&rfirst); PyBuffer_Release(&rcount); PyBuffer_Release(&rfd); PyBuffer_Release(&rshift);
    PyBuffer_Release(&nlb); PyBuffer_Release(&mfb); PyBuffer_Release(&rep); PyBuffer_Release(&utb);
    PyBuffer_Release(&seenk); PyBuffer_Release(&seenf);
    return ret;
}


static PyObject *check_window(PyObject *self, PyObject *args) {
    Py_buffer win, bounds, idsb, nlb, rep, utb, keysb = {0};
    int kind;
    if (!PyArg_ParseTuple(args, "y*iy*y*y*w*y*|w*", &win, &kind, &bounds, &idsb, &nlb, &rep, &utb, &keysb))
        return NULL;
    PyObject *ret = NULL;
    Py_ssize_t n = idsb.len / 8, nrec = bounds.len / 8 - 1, NL = nlb.len / 8, NUT = utb.len / 8;
    if (sf_check_i64(&bounds, -1, "bounds") || sf_check_i64(&idsb, -1, "ids") || sf_check_i64(&nlb, -1, "newline_ids")
        || sf_check_i64(&utb, -1, "unterminated") || sf_framing_args(kind, &rep))
        goto done;
    if (nrec < 0 || (keysb.buf && keysb.len != n * 8)) {
        PyErr_SetString(PyExc_ValueError, "need bounds of at least one element, and a key per record");
        goto done;
    }
    const int64_t *b = bounds.buf, *ids = idsb.buf, *nl = nlb.buf, *ut = utb.buf;
    uint64_t *keys = keysb.buf;
    int64_t pos = 0, bad_id = -1;
    Py_ssize_t i = 0;
    int why = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; i < n; i++) {
        int64_t x = ids[i];
        if (x < 0 || x >= nrec) break;
        int64_t len = b[x + 1] - b[x];
        int gains = sf_gains_nl(nl, NL, x);
        if (len < 0 || pos > win.len - len - gains) break;
        uint64_t key = 0;
        if (kind && (why = frame_record(kind, (const unsigned char *)win.buf + pos, len, sf_gains_nl(ut, NUT, x), &key))) {
            bad_id = x;
            break;
        }
        if (keys) keys[i] = key;
        pos += len + gains;
    }
    Py_END_ALLOW_THREADS
    if (!why && i < n) {
        PyErr_Format(PyExc_IndexError, "record %zd (id %lld) is outside its bounds or the window", i, (long long)ids[i]);
        goto done;
    }
    if (why) {
        ((int64_t *)rep.buf)[0] = bad_id;
        ((int64_t *)rep.buf)[1] = why;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&win); PyBuffer_Release(&bounds); PyBuffer_Release(&idsb); PyBuffer_Release(&nlb);
    PyBuffer_Release(&rep); PyBuffer_Release(&utb); PyBuffer_Release(&keysb);
    return ret;
}


static PyMethodDef methods[] = {
    {"gather", gather, METH_VARARGS, "Copy byte ranges between buffers."},
    {"build_window", build_window, METH_VARARGS, "Read a window's records from a file into their view positions."},
    {"gather_mapped", sf_gather_mapped, METH_VARARGS, "Copy records in view order from mappings of their files."},
    {"check_window", check_window, METH_VARARGS, "Check the framing of every record of a window built elsewhere."},
    {"gather_rows", sf_gather_rows, METH_VARARGS, "Copy the runs of rows page by page (_rows.c)."},
    {"check_pieces", sf_check_pieces, METH_VARARGS, "Check runs of tar samples and their edges in fetched ranges."},
    {"cached_pages", sf_cached_pages, METH_VARARGS, "Pages of a mapped file in the page cache (cachestat or mincore), from an offset."},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_gather", NULL, -1, methods};

/* the framing kinds and reasons (_framing.c) as module constants */
static int add_framing(PyObject *m) {
    PyObject *reasons = PyTuple_New(framing_nreasons);
    if (!reasons) return -1;
    for (int i = 0; i < framing_nreasons; i++) {
        PyObject *r = PyUnicode_FromString(framing_reasons[i]);
        if (!r) {
            Py_DECREF(reasons);
            return -1;
        }
        PyTuple_SET_ITEM(reasons, i, r);
    }
    if (PyModule_AddObject(m, "FRAMING_REASONS", reasons) < 0) {
        Py_DECREF(reasons);
        return -1;
    }
    PyObject *kinds = Py_BuildValue("(sssss)", "", "lines", "rows", "tar", "tfrecord");
    if (!kinds || PyModule_AddObject(m, "FRAMING_KINDS", kinds) < 0) {
        Py_XDECREF(kinds);
        return -1;
    }
    return PyModule_AddIntConstant(m, "FRAMING_SPLIT", frame_split());
}

PyMODINIT_FUNC PyInit__gather(void) {
    PyObject *m = PyModule_Create(&mod);
    if (!m) return NULL;
    if (sf_mapped_init(m) < 0 || add_framing(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
