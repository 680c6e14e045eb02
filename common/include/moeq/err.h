/*
 * moeq/err.h — the one error enum shared by every moeq module.
 *
 * Every fallible function returns a moeq_err and, where the caller passes one,
 * writes a message naming the cause (field, file, tensor, key) into
 * `char *errstr, size_t errstr_size`. Library code never exits on bad input.
 *
 * Retriable vs fatal is explicit (moeq_err_is_retriable) because it decides
 * whether a Kafka offset is committed or a Redis batch is retried.
 */
#ifndef MOEQ_ERR_H
#define MOEQ_ERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moeq_err {
    MOEQ_OK = 0,
    MOEQ_ERR_INVALID_ARG,   /* caller passed a bad argument or config value   */
    MOEQ_ERR_NOMEM,         /* allocation failed                              */
    MOEQ_ERR_IO,            /* open/read/write/mmap failed                    */
    MOEQ_ERR_PARSE,         /* malformed input (JSON, msgpack, header)        */
    MOEQ_ERR_FORMAT,        /* well-formed but wrong: shape, dtype, field type */
    MOEQ_ERR_UNSUPPORTED,   /* valid but not supported (model_type, dtype)    */
    MOEQ_ERR_LIMIT,         /* a configured bound was exceeded                */
    MOEQ_ERR_NOT_FOUND,     /* missing file, tensor, key or job               */
    MOEQ_ERR_TIMEOUT,       /* deadline passed (retriable for I/O waits)      */
    MOEQ_ERR_TRANSIENT,     /* broker/server temporarily unavailable: retry   */
    MOEQ_ERR_CANCELLED,     /* the operation was cancelled                    */
    MOEQ_ERR_INTERNAL,      /* a bug: an invariant did not hold              */
    MOEQ_ERR_NUMERIC,       /* a non-finite value (NaN, inf) in the model's numbers:
                               broken weights or an overflow; not retriable   */
    MOEQ_ERR__COUNT
} moeq_err;

/* Stable, lower-case name of an error ("invalid_arg", "parse", ...). Never NULL. */
const char *moeq_err_str(moeq_err err);

/* 1 when retrying the same operation later may succeed (TRANSIENT, TIMEOUT). */
int moeq_err_is_retriable(moeq_err err);

/*
 * printf into errstr (truncating, always NUL-terminated when errstr_size > 0)
 * and return err, so call sites read `return moeq_errf(MOEQ_ERR_IO, ...)`.
 * errstr may be NULL.
 */
moeq_err moeq_errf(moeq_err err, char *errstr, size_t errstr_size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#ifdef __cplusplus
}
#endif
#endif
