/* Tar samples checked against their neighbours in their files, for shufflefs._gather (the rule
   is in _framing.c: `tar_left`, `tar_right`).  A window holds a run of consecutive samples of a
   file whole; the headers before and after it are read here: with preads from the file's
   descriptor (`sf_tar_run_edges`, for build_window; a few 512-byte headers per run, read 4 KiB
   at a time), or from byte ranges fetched beforehand (check_pieces, for windows built from a
   source without descriptors: object storage, or a stage in front of it).

   check_pieces(kind, buffers, piece_buf, piece_file, piece_start, piece_end, piece_pos,
                file_size, bounds, first, count, file, shift, pred, recend, whole, report, need)
       Bytes [piece_start[p], piece_end[p]) of file piece_file[p] are at piece_pos[p] of
       buffers[piece_buf[p]] (pieces sorted by file, then start; files of file_size[f] bytes).
       Run r is records [first[r], first[r] + count[r]) of ``bounds``, at file offsets shifted
       by shift[r] in file[r]; pred[r]: where the record before it in that file starts (-1:
       none), recend[r]: where the file's samples end.  Checks each run's first and last sample
       (``whole``: every sample, each against the one before it) and its edges.  The first
       failure goes to ``report`` (int64[2]: record id, reason); a run whose bytes are not all at
       hand is left for later: need[3r:3r+3] = (file, offset, length) of the first bytes missing
       (file -1: the run is done).  Returns the number of runs left.  Without GIL.  ``seen`` (optional:
       pred_id, next_id, key, flags): the records before and after each run in its file (-1: not
       in the index), and what earlier walks found of every record (`seen_samples`): a neighbour
       walked before is not read again, and every sample walked is added. */
#include "_gather.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "_framing.h"

#define FD_READ 4096  /* bytes read at once around a header (the next small member's too) */

/* ------------------------------------------------------------------ preads */

typedef struct {
    tar_src s;
    int fd;
    unsigned char *buf;
    int64_t cap, at, len;  /* buf holds [at, at + len) of the file */
} fd_src;

static const unsigned char *fd_read(tar_src *s, int64_t off, int64_t n) {
    fd_src *f = (fd_src *)s;
    if (off < 0) {
        s->state = SRC_EOF;
        return NULL;
    }
    if (off >= f->at && n <= f->len && off - f->at <= f->len - n) return f->buf + (off - f->at);
    int64_t want = n > FD_READ ? n : FD_READ;
    if (want > f->cap) {
        unsigned char *more = realloc(f->buf, (size_t)want);
        if (!more) {
            s->state = SRC_ERROR;
            s->err = ENOMEM;
            return NULL;
        }
        f->buf = more;
        f->cap = want;
    }
    int64_t got = 0;
    while (got < want) {
        ssize_t k = pread(f->fd, f->buf + got, (size_t)(want - got), (off_t)(off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            f->len = 0;
            s->state = SRC_ERROR;
            s->err = errno;
            return NULL;
        }
        if (k == 0) break;
        got += k;
    }
    f->at = off;
    f->len = got;
    if (got < n) {
        s->state = SRC_EOF;
        return NULL;
    }
    return f->buf;
}

sf_fd_reader *sf_fd_reader_new(void) {
    fd_src *f = calloc(1, sizeof(fd_src));
    if (f) f->s.read = fd_read;
    return (sf_fd_reader *)f;
}

void sf_fd_reader_free(sf_fd_reader *r) {
    if (!r) return;
    free(((fd_src *)r)->buf);
    free(r);
}

int sf_tar_run_edges(sf_fd_reader *r, int fd, int64_t pred, int64_t start, const tar_sample *first, int64_t end,
                     int64_t recend, const tar_sample *last, int *side) {
    static const sf_seen none = {NULL, NULL};
    return sf_tar_run_edges_seen(r, &none, -1, -1, fd, pred, start, first, end, recend, last, side);
}

int sf_tar_run_edges_seen(sf_fd_reader *r, const sf_seen *seen, int64_t pred_id, int64_t next_id, int fd,
                          int64_t pred, int64_t start, const tar_sample *first, int64_t end, int64_t recend,
                          const tar_sample *last, int *side) {
    fd_src *f = (fd_src *)r;
    if (f->fd != fd) {
        f->fd = fd;
        f->len = 0;
    }
    tar_sample near;
    *side = 0;
    int why = pred >= 0 && sf_seen_get(seen, pred_id, &near) ? tar_pair(&near, first) : tar_left(&f->s, pred, start, first);
    if (!why) {
        *side = 1;
        if (end != recend && sf_seen_get(seen, next_id, &near)) why = tar_pair(last, &near);
        else why = tar_right(&f->s, end, recend, last);
    }
    if (why == FRAME_UNREAD) return f->s.state == SRC_ERROR ? -(f->s.err ? f->s.err : EIO) : frame_eof();
    return why;
}

/* ------------------------------------------------------------------ fetched pieces */

typedef struct {
    tar_src s;
    Py_buffer *bufs;
    const int64_t *pb, *pf, *ps, *pe, *pp, *size;
    Py_ssize_t P;
    int64_t file;
} piece_src;

#define PIECES_BACK 64  /* overlapping pieces looked at below the last that starts at or before */

static const unsigned char *piece_read(tar_src *s, int64_t off, int64_t n) {
    piece_src *p = (piece_src *)s;
    if (off < 0 || off > p->size[p->file] - n) {
        s->state = SRC_EOF;
        return NULL;
    }
    Py_ssize_t lo = -1, hi = p->P;  /* the last piece at or before (file, off) */
    while (hi - lo > 1) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (p->pf[mid] < p->file || (p->pf[mid] == p->file && p->ps[mid] <= off)) lo = mid; else hi = mid;
    }
    for (Py_ssize_t j = lo; j >= 0 && j > lo - PIECES_BACK && p->pf[j] == p->file; j--)
        if (p->ps[j] <= off && off + n <= p->pe[j])
            return (const unsigned char *)p->bufs[p->pb[j]].buf + p->pp[j] + (off - p->ps[j]);
    s->state = SRC_MISSING;
    s->need_off = off;
    s->need_len = n;
    return NULL;
}

/* check_pieces' ``seen``: the records before and after every run, and the samples walked */
typedef struct {
    const int64_t *pred_id, *next_id;
    sf_seen m;
} seen_samples;

int sf_seen_of(Py_buffer *key, Py_buffer *flags, Py_ssize_t nrec, sf_seen *m) {
    m->key = NULL;
    m->flags = NULL;
    if (!key->buf || (key->len == 0 && flags->len == 0)) return 0;
    if (key->len != nrec * 8 || flags->len != nrec || key->readonly || flags->readonly) {
        PyErr_SetString(PyExc_ValueError, "seen keys and flags need one per record, writable");
        return -1;
    }
    m->key = key->buf;
    m->flags = flags->buf;
    return 0;
}

static void seen_put(seen_samples *m, int64_t x, const tar_sample *t) {
    if (m) sf_seen_put(&m->m, x, t);
}

static int seen_get(const seen_samples *m, int64_t x, tar_sample *t) {
    return m ? sf_seen_get(&m->m, x, t) : 0;
}

/* run r: 0 (done), FRAME_UNREAD (bytes missing: in s), or a reason with *bad */
static int piece_run(piece_src *src, const int64_t *b, int64_t x0, int64_t x1, int64_t sh, int64_t pred,
                     int64_t recend, int whole, seen_samples *seen, Py_ssize_t r, int64_t *bad) {
    tar_src *s = &src->s;
    tar_sample first, last, t, near;
    for (int64_t x = x0; x <= x1; x = (whole || x == x1) ? x + 1 : x1) {
        *bad = x;
        int why = tar_sample_at(s, b[x] + sh, b[x + 1] + sh, &t);
        if (why) return why == FRAME_UNREAD && s->state == SRC_EOF ? frame_eof() : why;
        seen_put(seen, x, &t);  /* what [b[x], b[x+1]) is, whatever its neighbours */
        if (whole && x > x0 && (why = tar_pair(&last, &t))) return why;
        if (x == x0) first = t;
        last = t;
    }
    *bad = x0;
    int why = pred >= 0 && seen_get(seen, seen ? seen->pred_id[r] : -1, &near) ? tar_pair(&near, &first)
                                                                                : tar_left(s, pred, b[x0] + sh, &first);
    if (why) return why;
    *bad = x1;
    if (b[x1 + 1] + sh != recend && seen_get(seen, seen ? seen->next_id[r] : -1, &near)) why = tar_pair(&last, &near);
    else why = tar_right(s, b[x1 + 1] + sh, recend, &last);
    return why;
}

/* ``seen`` (None, or pred_id, next_id: int64[R], key: uint64[nrec], flags: uint8[nrec]) parsed */
static int seen_parse(PyObject *o, Py_buffer *bufs, Py_ssize_t R, Py_ssize_t nrec, seen_samples *m, int *parsed) {
    *parsed = 0;
    if (o == Py_None) return 0;
    if (!PyArg_ParseTuple(o, "y*y*w*w*", &bufs[0], &bufs[1], &bufs[2], &bufs[3])) return -1;
    *parsed = 1;
    if (sf_check_i64(&bufs[0], R, "pred_id") || sf_check_i64(&bufs[1], R, "next_id")
        || sf_seen_of(&bufs[2], &bufs[3], nrec, &m->m) < 0)
        return -1;
    const int64_t *p = bufs[0].buf, *q = bufs[1].buf;
    for (Py_ssize_t r = 0; r < R; r++)
        if (p[r] < -1 || p[r] >= nrec || q[r] < -1 || q[r] >= nrec) {
            PyErr_Format(PyExc_IndexError, "seen record of run %zd out of bounds", r);
            return -1;
        }
    m->pred_id = p;
    m->next_id = q;
    return 0;
}

PyObject *sf_check_pieces(PyObject *self, PyObject *args) {
    PyObject *bufs, *seen_arg = Py_None;
    Py_buffer pbb, pfb, psb, peb, ppb, szb, bb, fb, cb, flb, shb, prb, reb, rep, needb, seenb[4];
    int kind, whole, seen_parsed = 0;
    if (!PyArg_ParseTuple(args, "iO!y*y*y*y*y*y*y*y*y*y*y*y*y*iw*w*|O", &kind, &PyTuple_Type, &bufs, &pbb, &pfb, &psb,
                          &peb, &ppb, &szb, &bb, &fb, &cb, &flb, &shb, &prb, &reb, &whole, &rep, &needb, &seen_arg))
        return NULL;
    PyObject *ret = NULL;
    seen_samples seen_m = {NULL, NULL, {NULL, NULL}}, *seen = NULL;
    Py_ssize_t M = PyTuple_GET_SIZE(bufs), got = 0, P = pbb.len / 8, F = szb.len / 8, R = fb.len / 8,
               nrec = bb.len / 8 - 1;
    Py_buffer *mb = calloc((size_t)(M ? M : 1), sizeof(Py_buffer));
    if (!mb) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < M; got++)
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(bufs, got), &mb[got], PyBUF_SIMPLE) < 0) goto done;
    if (sf_check_i64(&pbb, -1, "piece_buf") || sf_check_i64(&pfb, P, "piece_file") || sf_check_i64(&psb, P, "piece_start")
        || sf_check_i64(&peb, P, "piece_end") || sf_check_i64(&ppb, P, "piece_pos") || sf_check_i64(&szb, -1, "file_size")
        || sf_check_i64(&bb, -1, "bounds") || sf_check_i64(&fb, -1, "first") || sf_check_i64(&cb, R, "count")
        || sf_check_i64(&flb, R, "file") || sf_check_i64(&shb, R, "shift") || sf_check_i64(&prb, R, "pred")
        || sf_check_i64(&reb, R, "recend") || sf_framing_args(kind, &rep))
        goto done;
    if (kind != FRAME_TAR || nrec < 0 || needb.len < R * 24 || needb.readonly) {
        PyErr_SetString(PyExc_ValueError, "check_pieces checks tar runs, with bounds and a need of 3 int64 per run");
        goto done;
    }
    const int64_t *pb = pbb.buf, *pf = pfb.buf, *ps = psb.buf, *pe = peb.buf, *pp = ppb.buf, *size = szb.buf,
                  *b = bb.buf, *first = fb.buf, *count = cb.buf, *file = flb.buf, *shift = shb.buf, *pred = prb.buf,
                  *recend = reb.buf;
    for (Py_ssize_t p = 0; p < P; p++) {
        if (pb[p] < 0 || pb[p] >= M || pf[p] < 0 || pf[p] >= F || ps[p] < 0 || pe[p] < ps[p] || pp[p] < 0
            || pp[p] > mb[pb[p]].len - (pe[p] - ps[p]) || (p && (pf[p] < pf[p - 1] || (pf[p] == pf[p - 1] && ps[p] < ps[p - 1])))) {
            PyErr_Format(PyExc_ValueError, "piece %zd is out of its buffer or order", p);
            goto done;
        }
    }
    for (Py_ssize_t r = 0; r < R; r++) {
        if (count[r] < 1 || first[r] < 0 || first[r] > nrec - count[r] || file[r] < 0 || file[r] >= F) {
            PyErr_Format(PyExc_IndexError, "run %zd out of bounds", r);
            goto done;
        }
    }
    if (seen_parse(seen_arg, seenb, R, nrec, &seen_m, &seen_parsed) < 0) goto done;
    if (seen_parsed) seen = &seen_m;
    int64_t *need = needb.buf, bad = -1;
    int why = 0;
    Py_ssize_t left = 0;
    Py_BEGIN_ALLOW_THREADS
    piece_src src = {{NULL, 0, piece_read, 0, 0, 0, 0}, mb, pb, pf, ps, pe, pp, size, P, 0};
    for (Py_ssize_t r = 0; r < R; r++) {
        need[3 * r] = -1;
        if (why) continue;
        src.file = file[r];
        src.s.state = 0;
        int got_why = piece_run(&src, b, first[r], first[r] + count[r] - 1, shift[r], pred[r], recend[r], whole, seen,
                                r, &bad);
        if (got_why == FRAME_UNREAD && src.s.state == SRC_MISSING) {
            need[3 * r] = file[r];
            need[3 * r + 1] = src.s.need_off;
            need[3 * r + 2] = src.s.need_len;
            left++;
        } else if (got_why) {
            why = got_why == FRAME_UNREAD ? frame_eof() : got_why;
            ((int64_t *)rep.buf)[0] = bad;
            ((int64_t *)rep.buf)[1] = why;
        }
    }
    Py_END_ALLOW_THREADS
    ret = PyLong_FromSsize_t(why ? 0 : left);
done:
    if (mb) {
        for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&mb[i]);
        free(mb);
    }
    PyBuffer_Release(&pbb); PyBuffer_Release(&pfb); PyBuffer_Release(&psb); PyBuffer_Release(&peb);
    PyBuffer_Release(&ppb); PyBuffer_Release(&szb); PyBuffer_Release(&bb); PyBuffer_Release(&fb);
    PyBuffer_Release(&cb); PyBuffer_Release(&flb); PyBuffer_Release(&shb); PyBuffer_Release(&prb);
    PyBuffer_Release(&reb); PyBuffer_Release(&rep); PyBuffer_Release(&needb);
    if (seen_parsed)
        for (int i = 0; i < 4; i++) PyBuffer_Release(&seenb[i]);
    return ret;
}
