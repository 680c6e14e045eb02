/*
 * moeq/util.h — small helpers every module needs: clocks, UTF-8 validation,
 * checked arithmetic, file reading.
 */
#ifndef MOEQ_UTIL_H
#define MOEQ_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The project version ("0.1.0", CMake's PROJECT_VERSION): build_info metrics, heartbeats. */
const char *moeq_version(void);

/* Wall clock, ms since the Unix epoch (for deadlines and timestamps). */
int64_t moeq_now_ms(void);
/* Monotonic clock in ns (for durations and benchmarks). */
int64_t moeq_mono_ns(void);

/*
 * 1 when s[0..len) is well-formed UTF-8 (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF); else 0 and, when bad_offset is not
 * NULL, the byte offset of the first bad sequence.
 */
int moeq_utf8_valid(const char *s, size_t len, size_t *bad_offset);

/* Length in bytes of the longest prefix of s[0..len) that ends on a character boundary. */
size_t moeq_utf8_complete_prefix(const char *s, size_t len);

/* a*b without overflow; 0 and *out untouched on overflow. */
static inline int moeq_mul_ok(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/*
 * Read a whole file into a malloc'd, NUL-terminated buffer (caller frees).
 * Fails with MOEQ_ERR_LIMIT when the file is larger than max_bytes.
 */
moeq_err moeq_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len,
                        char *errstr, size_t errstr_size);

#ifdef __cplusplus
}
#endif
#endif
