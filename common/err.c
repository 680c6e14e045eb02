/* err.c — names of moeq_err and the errstr helper. */
#include "moeq/err.h"

#include <stdarg.h>
#include <stdio.h>

static const char *const err_names[MOEQ_ERR__COUNT] = {
    [MOEQ_OK] = "ok",
    [MOEQ_ERR_INVALID_ARG] = "invalid_arg",
    [MOEQ_ERR_NOMEM] = "nomem",
    [MOEQ_ERR_IO] = "io",
    [MOEQ_ERR_PARSE] = "parse",
    [MOEQ_ERR_FORMAT] = "format",
    [MOEQ_ERR_UNSUPPORTED] = "unsupported",
    [MOEQ_ERR_LIMIT] = "limit",
    [MOEQ_ERR_NOT_FOUND] = "not_found",
    [MOEQ_ERR_TIMEOUT] = "timeout",
    [MOEQ_ERR_TRANSIENT] = "transient",
    [MOEQ_ERR_CANCELLED] = "cancelled",
    [MOEQ_ERR_INTERNAL] = "internal",
    [MOEQ_ERR_NUMERIC] = "numerical",
};

const char *moeq_err_str(moeq_err err) {
    if ((unsigned)err >= MOEQ_ERR__COUNT) return "unknown";
    return err_names[err];
}

int moeq_err_is_retriable(moeq_err err) {
    return err == MOEQ_ERR_TRANSIENT || err == MOEQ_ERR_TIMEOUT;
}

moeq_err moeq_errf(moeq_err err, char *errstr, size_t errstr_size, const char *fmt, ...) {
    if (errstr && errstr_size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errstr, errstr_size, fmt, ap);
        va_end(ap);
    }
    return err;
}
