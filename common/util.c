/* util.c — clocks, UTF-8 validation, file reading. */
#define _POSIX_C_SOURCE 200809L
#include "moeq/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#ifndef MOEQ_PROJECT_VERSION /* set by common/CMakeLists.txt; other builds of this file (fuzzers) say so */
#define MOEQ_PROJECT_VERSION "unknown"
#endif

const char *moeq_version(void) { return MOEQ_PROJECT_VERSION; }

int64_t moeq_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t moeq_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Length of the UTF-8 sequence starting at s (>= 1), or 0 when it is malformed or truncated. */
static size_t utf8_seq_len(const unsigned char *s, size_t avail) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) { n = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) n = 3;
    else if (c == 0xED) { n = 3; hi = 0x9F; }      /* no surrogates */
    else if (c >= 0xEE && c <= 0xEF) n = 3;
    else if (c == 0xF0) { n = 4; lo = 0x90; }      /* no overlongs */
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) { n = 4; hi = 0x8F; }      /* <= U+10FFFF */
    else return 0;
    if (avail < n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return n;
}

int moeq_utf8_valid(const char *str, size_t len, size_t *bad_offset) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) { i++; continue; }
        size_t n = utf8_seq_len(s + i, len - i);
        if (n == 0) {
            if (bad_offset) *bad_offset = i;
            return 0;
        }
        i += n;
    }
    return 1;
}

size_t moeq_utf8_complete_prefix(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    /* Walk back over at most 3 continuation bytes to the last lead byte. */
    size_t i = len;
    size_t back = 0;
    while (i > 0 && back < 4 && (s[i - 1] & 0xC0) == 0x80) { i--; back++; }
    if (i == 0) return len;
    unsigned c = s[i - 1];
    size_t need = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return (back + 1 >= need) ? len : i - 1;
}

moeq_err moeq_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len,
                        char *errstr, size_t errstr_size) {
    FILE *f = fopen(path, "rb");
    if (!f) return moeq_errf(MOEQ_ERR_IO, errstr, errstr_size, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return moeq_errf(MOEQ_ERR_IO, errstr, errstr_size, "%s: not a regular file", path);
    }
    if ((size_t)st.st_size > max_bytes) {
        fclose(f);
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "%s: %lld bytes, over the limit of %zu",
                         path, (long long)st.st_size, max_bytes);
    }
    size_t len = (size_t)st.st_size;
    char *buf = malloc(len + 1);
    if (!buf) {
        fclose(f);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "%s: out of memory (%zu bytes)", path, len);
    }
    size_t got = fread(buf, 1, len, f);
    fclose(f);
    if (got != len) {
        free(buf);
        return moeq_errf(MOEQ_ERR_IO, errstr, errstr_size, "%s: short read (%zu of %zu)", path, got, len);
    }
    buf[len] = 0;
    *out = buf;
    if (out_len) *out_len = len;
    return MOEQ_OK;
}
