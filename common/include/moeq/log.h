/*
 * moeq/log.h — one line per event, machine-parsable (logfmt).
 *
 *   ts=2026-11-29T11:40:02.123Z level=info comp=coordinator event=batch_written batch=17-0 jobs=32
 *
 * The format string supplies the trailing `key=value` pairs; values with
 * spaces should be quoted by the caller (moeq_log_quote helps). Thread-safe:
 * each line is written with one fwrite on an unbuffered stderr.
 */
#ifndef MOEQ_LOG_H
#define MOEQ_LOG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moeq_log_level {
    MOEQ_LOG_DEBUG = 0,
    MOEQ_LOG_INFO,
    MOEQ_LOG_WARN,
    MOEQ_LOG_ERROR,
} moeq_log_level;

/* Lines below level are dropped. Default INFO; MOEQ_LOG_LEVEL=debug overrides. */
void moeq_log_set_level(moeq_log_level level);
int moeq_log_parse_level(const char *name, moeq_log_level *level);

void moeq_log(moeq_log_level level, const char *comp, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Copy s into out as a logfmt value: quoted and escaped when needed. */
const char *moeq_log_quote(const char *s, char *out, size_t out_size);

#ifdef __cplusplus
}
#endif
#endif
