/* The whole-record framing checks of the compiled gather (_framing.c). */
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
/* the key of the first keyed member of a tar record of ``len`` bytes of which ``avail`` are at
   hand: 0 and *key, or -1 when it cannot be told from those bytes */
int frame_lead_key(const unsigned char *r, int64_t len, int64_t avail, uint64_t *key);
/* the reason of a sample whose next record has its key */
int frame_split(void);
#endif
