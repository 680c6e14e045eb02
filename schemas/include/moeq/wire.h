/*
 * moeq/wire.h — what the job, result and batch codecs share: the two wire
 * formats (msgpack, JSON), how a format is chosen for incoming bytes, and a
 * growable output buffer.
 *
 * Pure functions over bytes: no I/O, no global state; every function is
 * thread-safe on distinct arguments.
 */
#ifndef MOEQ_WIRE_H
#define MOEQ_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moeq_wire_format {
    MOEQ_WIRE_UNKNOWN = 0, /* not (yet) known                          */
    MOEQ_WIRE_MSGPACK,     /* a msgpack map; the primary encoding       */
    MOEQ_WIRE_JSON,        /* a UTF-8 JSON object (RFC 8259)            */
} moeq_wire_format;

/* "msgpack", "json" or "unknown". Never NULL. */
const char *moeq_wire_format_name(moeq_wire_format format);

/* The content-type header value to publish with a format ("application/msgpack", "application/json"). */
const char *moeq_wire_content_type(moeq_wire_format format);

/*
 * Choose the format of a message.
 *
 * content_type (may be NULL) is the Kafka `content-type` header, compared
 * case-insensitively and ignoring parameters ("; charset=utf-8"):
 * application/msgpack, application/x-msgpack, application/vnd.msgpack -> MSGPACK;
 * application/json -> JSON. Any other value, or none, falls back to sniffing
 * the bytes: a first byte 0x80..0x8f, 0xde or 0xdf (msgpack map) -> MSGPACK;
 * '{' after optional JSON whitespace -> JSON; anything else -> UNKNOWN.
 */
moeq_wire_format moeq_wire_detect(const void *bytes, size_t len, const char *content_type);

/*
 * A growable byte buffer the encoders append to. Zero-initialise it
 * (`moeq_buf buf = {0};`), reuse it across encodes with moeq_buf_reset, free
 * it with moeq_buf_free. Encoders keep data NUL-terminated one byte past len
 * (not counted), so JSON output is also a C string.
 */
typedef struct moeq_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
} moeq_buf;

/* Forget the contents, keep the allocation. */
void moeq_buf_reset(moeq_buf *buf);
/* Release the allocation and zero the struct. NULL is safe. */
void moeq_buf_free(moeq_buf *buf);
/* Append n bytes. MOEQ_ERR_NOMEM when growing fails (buf unchanged). */
moeq_err moeq_buf_append(moeq_buf *buf, const void *bytes, size_t n);

#ifdef __cplusplus
}
#endif
#endif
