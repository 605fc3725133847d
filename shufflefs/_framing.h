/* The whole-record framing checks of the compiled gather (_framing.c), and the tar samples'
   checks against their neighbours in their file (read through a `tar_src`: _edges.c). */
#ifndef SHUFFLEFS_FRAMING_H
#define SHUFFLEFS_FRAMING_H
#include <stdint.h>

enum { FRAME_NONE = 0, FRAME_LINES = 1, FRAME_ROWS = 2, FRAME_TAR = 3, FRAME_TFRECORD = 4, FRAME_KINDS = 5 };

extern const char *const framing_reasons[];
extern const int framing_nreasons;

/* 0, or the reason record ``r`` (``len`` source bytes; ``unterminated``: a line without its
   newline, the last of its file) is not one whole record of ``kind``; a tar record's sample key
   in *key */
int frame_record(int kind, const unsigned char *r, int64_t len, int unterminated, uint64_t *key);
/* the reason of a sample whose neighbour in its file has its key */
int frame_split(void);

/* ------------------------------------------------------------------ tar samples in their file */

/* Where a tar check reads bytes: ``mem`` holds [0, avail) (a record's copy, or a whole mapped
   file), else ``read`` gives ``n`` bytes at ``off`` (a pointer valid until its next call) or NULL
   with the reason in ``state``: SRC_EOF (past the end of the file), SRC_MISSING (not fetched yet:
   ``need_off``, ``need_len``), SRC_ERROR (``err``, an errno). */
enum { SRC_EOF = 1, SRC_MISSING = 2, SRC_ERROR = 3 };
typedef struct tar_src tar_src;
struct tar_src {
    const unsigned char *mem;
    int64_t avail;
    const unsigned char *(*read)(tar_src *s, int64_t off, int64_t n);
    int state, err;
    int64_t need_off, need_len;
};

/* what a whole sample's walk found: its key, and whether its first and last members have one */
typedef struct {
    uint64_t key;
    int first_keyed, last_keyed;
} tar_sample;

/* returned for bytes not at hand (then s->state says why); reasons are positive */
#define FRAME_UNREAD (-1)

/* record ``r`` (``len`` bytes at hand) as one whole tar sample: 0 and *t, or a reason */
int frame_tar(const unsigned char *r, int64_t len, tar_sample *t);
/* [start, end) of ``s`` as one whole sample: 0 and *t, a reason, or FRAME_UNREAD */
int tar_sample_at(tar_src *s, int64_t start, int64_t end, tar_sample *t);
/* the sample before ``first`` (starting at ``start``) in its file: the one at ``pred`` (-1: none,
   ``first`` opens its file's samples) must end with a keyed member of another key; 0, a reason or
   FRAME_UNREAD */
int tar_left(tar_src *s, int64_t pred, int64_t start, const tar_sample *first);
/* what follows ``last`` (ending at ``end``; ``recend``: where its file's samples end): the end of
   the archive, or a keyed member of another key, ``last`` ending with a keyed member; 0, a
   reason or FRAME_UNREAD */
int tar_right(tar_src *s, int64_t end, int64_t recend, const tar_sample *last);
/* two samples one after the other in a file: 0, or why they are not two of a scan */
int tar_pair(const tar_sample *prev, const tar_sample *next);
/* the reason for a file that ends, or cannot be read, inside a sample or its neighbour's headers */
int frame_eof(void);
#endif
