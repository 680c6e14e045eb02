/* log.c — logfmt lines on stderr. */
#define _POSIX_C_SOURCE 200809L
#include "moeq/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static moeq_log_level log_level = MOEQ_LOG_INFO;
static int log_level_read_env;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void moeq_log_set_level(moeq_log_level level) {
    log_level = level;
    log_level_read_env = 1;
}

int moeq_log_parse_level(const char *name, moeq_log_level *level) {
    for (int i = 0; i < 4; i++)
        if (strcasecmp(name, level_names[i]) == 0) { *level = (moeq_log_level)i; return 1; }
    return 0;
}

const char *moeq_log_quote(const char *s, char *out, size_t out_size) {
    if (out_size == 0) return out;
    int needs = (*s == 0);
    for (const char *p = s; *p; p++)
        if (*p == ' ' || *p == '"' || *p == '=' || *p == '\\' || (unsigned char)*p < 0x20) needs = 1;
    if (!needs) {
        snprintf(out, out_size, "%s", s);
        return out;
    }
    size_t o = 0;
    out[o++] = '"';
    for (const char *p = s; *p && o + 3 < out_size; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') { out[o++] = '\\'; out[o++] = (char)c; }
        else if (c == '\n') { out[o++] = '\\'; out[o++] = 'n'; }
        else if (c < 0x20) out[o++] = '?';
        else out[o++] = (char)c;
    }
    if (o + 1 < out_size) out[o++] = '"';
    out[o] = 0;
    return out;
}

void moeq_log(moeq_log_level level, const char *comp, const char *event, const char *fmt, ...) {
    if (!log_level_read_env) {
        const char *env = getenv("MOEQ_LOG_LEVEL");
        if (env) moeq_log_parse_level(env, &log_level);
        log_level_read_env = 1;
    }
    if (level < log_level) return;
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s comp=%s event=%s",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, level_names[level], comp, event);
    if (fmt && *fmt && n > 0 && (size_t)n < sizeof line - 2) {
        line[n++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
        va_end(ap);
        if (m > 0) n += m;
    }
    if (n < 0) return;
    if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
    line[n++] = '\n';
    /* One write per line so concurrent threads never interleave inside a line. */
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
