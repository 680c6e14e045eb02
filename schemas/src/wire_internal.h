/*
 * wire_internal.h — the pull reader and the writer the job, result and batch
 * codecs are built on. Internal to moeq_schemas.
 *
 * Why our own reader instead of msgpack-c's unpacker and cJSON: the
 * unpacker allocates an array of the declared size before reading its
 * elements (a 5-byte input can ask for 100 GB); cJSON keeps numbers as
 * doubles (seeds lose bits), cuts strings at \u0000, keeps duplicate keys
 * silently, and cannot give back the raw bytes of a value (metadata must be
 * echoed verbatim). The reader here never allocates: it walks the input in
 * place, checks every declared length against the bytes that remain, bounds
 * the nesting depth, and validates every string as it is read.
 *
 * Errors are reported as a job reject code plus a message naming r->path.
 */
#ifndef MOEQ_WIRE_INTERNAL_H
#define MOEQ_WIRE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/job.h"
#include "moeq/wire.h"

typedef enum wval_type {
    WV_NIL,
    WV_BOOL,
    WV_INT,   /* fits int64_t: v->i                          */
    WV_UINT,  /* above INT64_MAX: v->u                       */
    WV_FLOAT, /* v->f (may be NaN/inf from msgpack)          */
    WV_STR,   /* validated text (UTF-8, no NUL)              */
    WV_BIN,   /* msgpack only                                */
    WV_EXT,   /* msgpack only                                */
    WV_ARRAY,
    WV_MAP,
} wval_type;

typedef struct wval {
    wval_type type;
    int b;
    int64_t i;
    uint64_t u;
    double f;
    const uint8_t *s;     /* STR/BIN/EXT payload; JSON STR: raw bytes between the quotes */
    size_t n;             /* bytes at s                                                  */
    size_t dec_len;       /* STR: length once unescaped                                  */
    int escaped;          /* JSON STR containing backslash escapes                       */
    uint64_t count;       /* msgpack ARRAY/MAP: declared entries                         */
    const uint8_t *start; /* first byte of the encoded value                             */
} wval;

typedef struct wrd {
    const uint8_t *base, *p, *end;
    moeq_wire_format fmt;
    int max_depth;
    moeq_job_reject_code code; /* NONE until something failed */
    int nomem;                 /* an allocation failed        */
    int allow_nul;             /* 1: U+0000 is text (results: a token may decode to byte 0); jobs refuse it */
    char path[64];             /* field being read, for messages */
    char msg[256];
} wrd;

typedef struct witer {
    uint64_t left; /* msgpack: entries still to come */
    int first;     /* JSON: no entry read yet        */
    int close;     /* JSON: ']' or '}'               */
} witer;

void wrd_init(wrd *r, const void *bytes, size_t len, moeq_wire_format fmt, int max_depth);
/* Record a failure (the first one wins); always returns -1. */
int wrd_fail(wrd *r, moeq_job_reject_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Read the next value's head: scalars and strings whole, containers only their header. 0 or -1. */
int wrd_head(wrd *r, wval *v);
/* Start iterating a container whose head was read at `depth` (the job map is 1). 0 or -1 (too_deep). */
int wrd_iter_begin(wrd *r, const wval *c, int depth, witer *it);
/* 1 when another entry follows (for a map: read its key with wrd_key), 0 at the end, -1 on error. */
int wrd_iter_next(wrd *r, witer *it);
/* Read a map key (and, in JSON, the ':' after it). JSON keys are always strings. */
int wrd_key(wrd *r, wval *key);
/* Skip the rest of a value whose head was read at `depth`, validating it. */
int wrd_skip(wrd *r, const wval *v, int depth);
/* Read and skip one whole value at `depth`; start and end receive its bytes. */
int wrd_value_span(wrd *r, int depth, wval *head, const uint8_t **start, const uint8_t **end);
/* After the document: only JSON whitespace may follow. */
int wrd_finish(wrd *r);
/* 1 when the STR value equals the NUL-terminated lit. */
int wval_str_is(const wval *v, const char *lit);
/* Unescaped copy of a STR value into dst (dec_len + 1 bytes, NUL-terminated). */
void wval_str_copy(const wval *v, char *dst);
/* malloc'd copy (NUL-terminated); NULL and r->nomem on failure. */
char *wrd_strdup(wrd *r, const wval *v);
/* "string", "integer", ... for messages. */
const char *wval_type_name(const wval *v);

/* Writer: appends to a moeq_buf; errors are sticky (check ww.err at the end). */
typedef struct ww {
    moeq_buf *out;
    moeq_wire_format fmt;
    moeq_err err;
    int depth;
    uint8_t comma[MOEQ_JOB_DEPTH_HARD_MAX + 2]; /* JSON: an entry was written at this depth */
} ww;

void ww_init(ww *w, moeq_buf *out, moeq_wire_format fmt);
void ww_map(ww *w, uint32_t n); /* n entries follow (msgpack needs the count) */
void ww_array(ww *w, uint32_t n);
void ww_end_map(ww *w);
void ww_end_array(ww *w);
void ww_key(ww *w, const char *key);
void ww_str(ww *w, const char *s, size_t len);   /* must be valid UTF-8            */
void ww_str_lossy(ww *w, const char *s);          /* invalid UTF-8 -> U+FFFD         */
void ww_str_lossy_n(ww *w, const char *s, size_t len); /* the same, len bytes (NUL kept) */
void ww_int(ww *w, int64_t x);
void ww_uint(ww *w, uint64_t x);
void ww_double(ww *w, double x);
void ww_bool(ww *w, int b);
void ww_nil(ww *w);
void ww_bin(ww *w, const void *bytes, size_t len); /* msgpack only                   */
/* An already encoded value in w->fmt, verbatim. */
void ww_raw(ww *w, const void *bytes, size_t len);
/*
 * Copy one encoded value from `from` (bytes in from_fmt) into w, transcoding
 * when the formats differ. On failure returns -1 with the reason in *r.
 */
int ww_value_from(ww *w, const void *bytes, size_t len, moeq_wire_format from_fmt, int max_depth, wrd *r);

#endif
