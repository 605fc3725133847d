/* Whole-record framing checks of shufflefs's compiled gather (compiled into shufflefs._gather).

   An offset table from a cache entry or a published index is a hint: its checksum says it is
   whole, not that it is this file's.  So every record is checked as it is gathered, over all of
   its bytes, against its format's framing, so that an index whose bounds all sit on plausible
   places (every second bound of a JSON-lines file dropped: each remaining one still ends a line)
   cannot merge or split records:

     lines     exactly one newline, the record's last byte (none in an unterminated last line);
     rows      (CSV) the same counting only newlines outside quotes, and no quote left open;
     tfrecord  the length field of the frame is the record's length less its 16 framing bytes;
     tar       the record is a chain of whole members, each header's checksum holding, with
               exactly one sample key among its regular files; and it is one sample of a scan of
               its file: the members of no key (directories, names without a dot) before a
               sample's first keyed member are its own, and those after its last keyed member
               the next sample's (a file's first sample opens with a keyed member: what precedes
               it is the header); so the sample before it in its file ends with a keyed member
               of another key, and after it come the end of the archive or a keyed member of
               another key (`tar_left`, `tar_right`, reading the file through a `tar_src`).

   The functions run without the GIL, on bytes the gather just copied (still in the CPU cache),
   and for tar on a few headers of the neighbours in the file (a mapping, preads or fetched
   ranges: _edges.c).  Each returns 0 or a reason (`framing_reasons`, the messages of the Python
   errors). */
#include <stdint.h>
#include <string.h>

#include "_framing.h"

const char *const framing_reasons[] = {
    "",
    "a newline inside a line",
    "a line does not end where the record does",
    "a newline outside quotes inside a row",
    "a row ends inside a quoted field",
    "a frame's length field is not the record's length",
    "a record shorter than a frame's framing",
    "a sample of part of a 512-byte block",
    "no tar header where a member must start",
    "a member runs past the end of its sample",
    "two sample keys in one record",
    "no sample key in a record",
    "the next record has the same sample key (one sample cut in two)",
    "an extended header with no member after it",
    "a GNU sparse member",
    "a tar size field that is not a number",
    "a sample ends with members of no sample key while another sample follows (they are the next one's)",
    "a file's first sample starts with members of no sample key (they are the file's header)",
    "the record before it in its file is not one whole sample",
    "neither a tar header nor the end of the archive after a sample",
    "the file ends inside a sample or the headers next to it",
};
const int framing_nreasons = (int)(sizeof framing_reasons / sizeof framing_reasons[0]);

enum {
    R_LINE_INNER = 1, R_LINE_END, R_ROW_INNER, R_ROW_QUOTED, R_TF_LENGTH, R_TF_SHORT, R_TAR_PARTIAL,
    R_TAR_HEADER, R_TAR_OVERRUN, R_TAR_TWO_KEYS, R_TAR_NO_KEY, R_TAR_SPLIT, R_TAR_META_LAST, R_TAR_SPARSE,
    R_TAR_SIZE, R_TAR_KEYLESS_END, R_TAR_KEYLESS_FIRST, R_TAR_PREV, R_TAR_NO_NEXT, R_TAR_EOF,
};

static int check_line(const unsigned char *r, int64_t len, int open) {
    if (len < 1) return R_LINE_END;
    if (open) return memchr(r, '\n', (size_t)len) ? R_LINE_INNER : 0;
    if (r[len - 1] != '\n') return R_LINE_END;
    return memchr(r, '\n', (size_t)(len - 1)) ? R_LINE_INNER : 0;
}

/* RFC 4180: a newline ends a row only outside quotes (an escaped "" toggles twice) */
static int check_row(const unsigned char *r, int64_t len, int open) {
    if (len < 1) return R_LINE_END;
    int64_t limit = open ? len : len - 1, i = 0;
    if (!open && r[len - 1] != '\n') return R_LINE_END;
    while (i < limit) {
        const unsigned char *q = memchr(r + i, '"', (size_t)(limit - i));
        int64_t at = q ? q - r : limit;
        if (memchr(r + i, '\n', (size_t)(at - i))) return R_ROW_INNER;
        if (!q) return 0;
        q = memchr(r + at + 1, '"', (size_t)(limit - at - 1));  /* the quote that closes it */
        if (!q) return R_ROW_QUOTED;
        i = q - r + 1;
    }
    return 0;
}

static int check_frame(const unsigned char *r, int64_t len) {
    if (len < 16) return R_TF_SHORT;
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = n << 8 | r[k];
    return n == (uint64_t)(len - 16) ? 0 : R_TF_LENGTH;
}

/* ------------------------------------------------------------------ tar */

/* octal field as the scan reads it: spaces, digits, then NUL, space or the field's end */
static int octal(const unsigned char *f, int width, int64_t *out) {
    int i = 0;
    while (i < width && f[i] == ' ') i++;
    if (i == width || f[i] < '0' || f[i] > '7') return -1;
    int64_t v = 0;
    for (; i < width && f[i] >= '0' && f[i] <= '7'; i++) {
        if (v > (INT64_MAX >> 3)) return -1;
        v = v << 3 | (f[i] - '0');
    }
    if (i < width && f[i] != 0 && f[i] != ' ') return -1;
    *out = v;
    return 0;
}

static int header_ok(const unsigned char *h) {
    if (memcmp(h + 257, "ustar", 5)) return 0;
    int64_t stored;
    if (octal(h + 148, 8, &stored)) return 0;
    uint32_t u = 0;  /* the whole block (a loop the compiler vectorises), less the field */
    for (int i = 0; i < 512; i++) u += h[i];
    for (int i = 148; i < 156; i++) u -= h[i];
    if ((int64_t)u + 8 * ' ' == stored) return 1;
    int32_t s = 0;  /* some old writers summed signed bytes */
    for (int i = 0; i < 512; i++) s += (signed char)h[i];
    for (int i = 148; i < 156; i++) s -= (signed char)h[i];
    return (int64_t)s + 8 * ' ' == stored;
}

static int member_size(const unsigned char *h, int64_t *size) {
    const unsigned char *f = h + 124;
    if (f[0] == 0x80) {  /* base-256, for 8 GiB and more */
        if (f[1] || f[2] || f[3] || f[4] >= 0x80) return -1;
        int64_t v = 0;
        for (int i = 4; i < 12; i++) v = v << 8 | f[i];
        *size = v;
        return 0;
    }
    return octal(f, 12, size);
}

static uint64_t hash_bytes(uint64_t h, const unsigned char *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;  /* FNV-1a */
    return h;
}

static uint64_t mix(uint64_t h) {  /* splitmix64's finaliser */
    h ^= h >> 30; h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27; h *= 0x94d049bb133111ebULL;
    return h ^ h >> 31;
}

static int64_t nul_len(const unsigned char *p, int64_t n) {
    const unsigned char *z = memchr(p, 0, (size_t)n);
    return z ? z - p : n;
}

/* the key of a member's name (webdataset's grouping, as the scan reads it: the name up to the
   first dot of its basename, which must not start with a dot); 0 if it has none */
static int name_key(const unsigned char *a, int64_t na, const unsigned char *b, int64_t nb, uint64_t *key) {
    /* the name is a + "/" + b when a is not NULL (a POSIX prefix), else b */
    int64_t total = a ? na + 1 + nb : nb, base = 0, dot = -1;
    for (int64_t i = 0; i < total; i++) {
        unsigned char c = a ? (i < na ? a[i] : i == na ? '/' : b[i - na - 1]) : b[i];
        if (c == '/') { base = i + 1; dot = -1; }
        else if (c == '.' && dot < 0 && i > base) dot = i;
    }
    if (base >= total || dot < 0) return 0;
    unsigned char first = a ? (base < na ? a[base] : base == na ? '/' : b[base - na - 1]) : b[base];
    if (first == '.') return 0;
    uint64_t h = 0xcbf29ce484222325ULL;
    if (a) {
        int64_t from_a = dot < na ? dot : na;
        h = hash_bytes(h, a, from_a);
        if (dot > na) { h = hash_bytes(h, (const unsigned char *)"/", 1); h = hash_bytes(h, b, dot - na - 1); }
    } else {
        h = hash_bytes(h, b, dot);
    }
    *key = mix(h ^ (uint64_t)dot);
    return 1;
}

/* a pax extended header's "path" record ("<length> <key>=<value>\n" records) */
static int pax_path(const unsigned char *d, int64_t n, const unsigned char **path, int64_t *plen) {
    int64_t pos = 0;
    int found = 0;
    while (pos < n) {
        int64_t len = 0, i = pos;
        while (i < n && d[i] >= '0' && d[i] <= '9' && len < ((int64_t)1 << 40)) len = len * 10 + (d[i++] - '0');
        if (i == pos || i >= n || d[i] != ' ' || len <= 0) break;
        int64_t rec = i + 1, end = pos + len - 1;  /* the record's last byte is its newline */
        if (end > n) end = n;
        if (end - rec >= 5 && !memcmp(d + rec, "path=", 5)) {
            *path = d + rec + 5;
            *plen = end - rec - 5;
            found = 1;
        }
        pos += len;
    }
    return found;
}

static const unsigned char *src_at(tar_src *s, int64_t off, int64_t n) {
    static const unsigned char none[1];
    if (n == 0) return none;
    if (s->mem) {
        if (off >= 0 && n > 0 && off <= s->avail - n) return s->mem + off;
        s->state = SRC_EOF;
        return NULL;
    }
    return s->read(s, off, n);
}

/* the key of a regular member's own header (ustar name, or POSIX prefix/name) */
static int header_key(const unsigned char *h, uint64_t *k) {
    if (h[262] == 0 && h[345] != 0)  /* "ustar\0" (POSIX) with a prefix */
        return name_key(h + 345, nul_len(h + 345, 155), h, nul_len(h, 100), k);
    return name_key(NULL, 0, h, nul_len(h, 100), k);
}

/* the long name of a GNU 'L' or pax 'x' header (data of ``size`` bytes at ``at``), which names
   the next member: *set, and its key in *keyed / *key; FRAME_UNREAD if not at hand */
typedef struct { int set, keyed; uint64_t key; } long_name;

static int read_long_name(tar_src *s, int64_t at, int64_t size, unsigned char flag, long_name *ln) {
    const unsigned char *d = src_at(s, at, size), *p = d;
    if (!d) return FRAME_UNREAD;
    int64_t n = size;
    if (flag == 'L') {
        n = nul_len(d, size);
    } else if (!pax_path(d, size, &p, &n)) {
        return 0;  /* a pax header without a path: the name stays as it was */
    }
    ln->set = 1;
    ln->keyed = name_key(NULL, 0, p, n, &ln->key);
    return 0;
}

/* one header at ``h`` (a member at ``at``): its flag, and the blocks of data after it */
static int member_blocks(const unsigned char *h, unsigned char *flag, int64_t *blocks) {
    int64_t size;
    if (member_size(h, &size) || size < 0) return R_TAR_SIZE;
    *flag = h[156];
    if (*flag == 'S') return R_TAR_SPARSE;
    int nodata = *flag >= '1' && *flag <= '6';
    *blocks = nodata ? 0 : size / 512 + (size % 512 != 0);
    return 0;
}

static int is_meta(unsigned char flag) { return flag == 'L' || flag == 'K' || flag == 'x'; }

static int64_t data_size(const unsigned char *h) {
    int64_t size = 0;
    member_size(h, &size);
    return size;
}

/* the key of a member with header ``h``, named by ``ln`` if a long name came before it */
static int member_key(const unsigned char *h, unsigned char flag, const long_name *ln, uint64_t *k) {
    if (flag != '0' && flag != '7' && flag != 0) return 0;
    if (ln->set) {
        *k = ln->key;
        return ln->keyed;
    }
    return header_key(h, k);
}

int tar_sample_at(tar_src *s, int64_t start, int64_t end, tar_sample *t) {
    int64_t len = end - start, off = 0;
    int have = 0, meta = 0, members = 0;
    long_name ln = {0, 0, 0};
    t->first_keyed = t->last_keyed = 0;
    t->key = 0;
    if (len < 0 || len % 512) return R_TAR_PARTIAL;
    while (off < len) {
        const unsigned char *h = src_at(s, start + off, 512);
        if (!h) return FRAME_UNREAD;
        if (!header_ok(h)) return R_TAR_HEADER;
        unsigned char flag;
        int64_t blocks;
        int why = member_blocks(h, &flag, &blocks);
        if (why) return why;
        if (blocks > (len - off) / 512 - 1) return R_TAR_OVERRUN;
        int64_t next = off + 512 + blocks * 512;
        if (is_meta(flag)) {
            if (flag != 'K' && read_long_name(s, start + off + 512, data_size(h), flag, &ln)) return FRAME_UNREAD;
            meta = 1;
            off = next;
            continue;
        }
        uint64_t k = 0;
        int keyed = member_key(h, flag, &ln, &k);  /* h is not used after another read */
        if (keyed) {
            if (have && k != t->key) return R_TAR_TWO_KEYS;
            have = 1;
            t->key = k;
        }
        if (!members++) t->first_keyed = keyed;
        t->last_keyed = keyed;
        ln.set = 0;
        meta = 0;
        off = next;
    }
    if (meta) return R_TAR_META_LAST;
    return have ? 0 : R_TAR_NO_KEY;
}

enum { NEXT_KEY = 0, NEXT_END = -2, NEXT_KEYLESS = -3 };

static int all_zero(const unsigned char *h) {
    for (int i = 0; i < 512; i++)
        if (h[i]) return 0;
    return 1;
}

/* what a scan finds at ``at``, right after a sample: NEXT_KEY (*key, the first keyed member's),
   NEXT_END (the end of the archive: a zero block or the end of the file), NEXT_KEYLESS (members of
   no key, then the end), a reason, or FRAME_UNREAD */
static int tar_next(tar_src *s, int64_t at, uint64_t *key) {
    int keyless = 0, meta = 0;
    long_name ln = {0, 0, 0};
    for (;;) {
        const unsigned char *h = src_at(s, at, 512);
        if (!h && s->state != SRC_EOF) return FRAME_UNREAD;
        if (!h || all_zero(h)) {
            if (meta) return R_TAR_META_LAST;
            return keyless ? NEXT_KEYLESS : NEXT_END;
        }
        if (!header_ok(h)) return R_TAR_NO_NEXT;
        unsigned char flag;
        int64_t blocks;
        int why = member_blocks(h, &flag, &blocks);
        if (why) return why;
        int64_t next = at + 512 + blocks * 512;
        if (is_meta(flag)) {
            if (flag != 'K' && read_long_name(s, at + 512, data_size(h), flag, &ln)) return FRAME_UNREAD;
            meta = 1;
            at = next;
            continue;
        }
        if (member_key(h, flag, &ln, key)) return NEXT_KEY;
        keyless = 1;
        ln.set = 0;
        meta = 0;
        at = next;
    }
}

int tar_pair(const tar_sample *prev, const tar_sample *next) {
    if (!prev->last_keyed) return R_TAR_KEYLESS_END;
    return prev->key == next->key ? R_TAR_SPLIT : 0;
}

int tar_left(tar_src *s, int64_t pred, int64_t start, const tar_sample *first) {
    if (pred < 0) return first->first_keyed ? 0 : R_TAR_KEYLESS_FIRST;
    tar_sample prev;
    int why = tar_sample_at(s, pred, start, &prev);
    if (why == FRAME_UNREAD) return s->state == SRC_EOF ? R_TAR_EOF : FRAME_UNREAD;
    return why ? R_TAR_PREV : tar_pair(&prev, first);
}

int tar_right(tar_src *s, int64_t end, int64_t recend, const tar_sample *last) {
    if (end == recend) return 0;  /* the file's end of archive, checked when its index was taken */
    uint64_t key;
    int got = tar_next(s, end, &key);
    if (got == FRAME_UNREAD) return s->state == SRC_EOF ? R_TAR_EOF : FRAME_UNREAD;
    if (got > 0) return got;
    if (got == NEXT_END) return 0;
    if (got == NEXT_KEYLESS || !last->last_keyed) return R_TAR_KEYLESS_END;
    return key == last->key ? R_TAR_SPLIT : 0;
}

int frame_tar(const unsigned char *r, int64_t len, tar_sample *t) {
    tar_src s = {r, len, NULL, 0, 0, 0, 0};
    int why = tar_sample_at(&s, 0, len, t);
    return why == FRAME_UNREAD ? R_TAR_OVERRUN : why;
}

int frame_record(int kind, const unsigned char *r, int64_t len, int unterminated, uint64_t *key) {
    switch (kind) {
    case FRAME_LINES: return check_line(r, len, unterminated);
    case FRAME_ROWS: return check_row(r, len, unterminated);
    case FRAME_TFRECORD: return check_frame(r, len);
    case FRAME_TAR: {
        tar_sample t;
        int why = frame_tar(r, len, &t);
        *key = t.key;
        return why;
    }
    default: return 0;
    }
}

int frame_split(void) { return R_TAR_SPLIT; }

int frame_eof(void) { return R_TAR_EOF; }
