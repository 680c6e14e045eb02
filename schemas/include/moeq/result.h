/*
 * moeq/result.h — the result format (v 1): what a worker (or the
 * coordinator, for a rejected or expired job) publishes for a job, keyed by
 * the job id. Encode to msgpack or JSON; decode (for `moeq submit`, tests).
 *
 * Documented in schemas/result.md and schemas/result.schema.json. A result
 * is sent in the format its job arrived in, so metadata is echoed verbatim.
 *
 * Pure functions, no I/O; thread-safe on distinct arguments.
 */
#ifndef MOEQ_RESULT_H
#define MOEQ_RESULT_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "moeq/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOEQ_RESULT_VERSION 1

typedef enum moeq_result_status {
    MOEQ_RESULT_OK = 0,    /* "ok": generation finished (see finish_reason)          */
    MOEQ_RESULT_ERROR,     /* "error": rejected or failed; see error.code/message    */
    MOEQ_RESULT_EXPIRED,   /* "expired": deadline_ms passed before it could finish   */
    MOEQ_RESULT_CANCELLED, /* "cancelled": cancelled by an operator or the producer  */
    MOEQ_RESULT_STATUS__COUNT
} moeq_result_status;

typedef enum moeq_finish_reason {
    MOEQ_FINISH_NONE = 0,   /* absent: nothing was generated (rejected before running) */
    MOEQ_FINISH_STOP,       /* "stop": a stop string matched                           */
    MOEQ_FINISH_LENGTH,     /* "length": max_new_tokens reached                        */
    MOEQ_FINISH_STOP_TOKEN, /* "stop_token": the model emitted end-of-sequence         */
    MOEQ_FINISH_DEADLINE,   /* "deadline": deadline_ms passed mid-generation           */
    MOEQ_FINISH_CANCELLED,  /* "cancelled"                                             */
    MOEQ_FINISH_ERROR,      /* "error": generation failed part-way                     */
    MOEQ_FINISH__COUNT
} moeq_finish_reason;

/* Stable names ("ok", "stop_token", ...); "unknown" outside the enum. */
const char *moeq_result_status_name(moeq_result_status status);
const char *moeq_finish_reason_name(moeq_finish_reason reason);

/*
 * error.code of a result whose status is not ok: a job reject code
 * (moeq_job_reject_code_name) or one of these. Every process sends only
 * these names, through the macros; schemas/result.md lists exactly this set
 * plus the reject codes (test_result_codec checks both directions).
 */
#define MOEQ_CODE_REPLY_TO_NOT_ALLOWED "reply_to_not_allowed" /* error: reply_to not on results_allowed_topics */
#define MOEQ_CODE_PROMPT_TOO_LONG "prompt_too_long"           /* error: prompt + max_new_tokens > context     */
#define MOEQ_CODE_TOKENIZE "tokenize"                         /* error: the worker could not tokenize the job */
#define MOEQ_CODE_NUMERICAL_ERROR "numerical_error"           /* error: NaN/inf in the job's logits or router  */
#define MOEQ_CODE_DEAD_LETTER "dead_letter"                   /* error: batch delivered max_deliveries times  */
#define MOEQ_CODE_RESULT_UNDELIVERABLE "result_undeliverable" /* error: the broker refused the result for good */
#define MOEQ_CODE_ENGINE "engine"                             /* error: the engine failed a step              */
#define MOEQ_CODE_INTERNAL "internal"                         /* error: a bug or out of memory                */
#define MOEQ_CODE_DEADLINE "deadline"                         /* status expired: deadline_ms passed           */
#define MOEQ_CODE_CANCELLED "cancelled"                       /* status cancelled: an operator cancelled it   */
#define MOEQ_CODE_UNSUPPORTED_SCHEMA "unsupported_schema"     /* error: response_format uses a feature outside
                                                                 the supported subset, or is not valid        */
#define MOEQ_CODE_GRAMMAR_TOO_LARGE "grammar_too_large"       /* error: response_format's automaton is over
                                                                 the worker's grammar limits                  */
/* The reject code the worker itself sends (an entry it cannot run as given). */
#define MOEQ_CODE_INVALID_VALUE "invalid_value"

/* The codes above, in that order; *n receives the count. */
const char *const *moeq_result_error_codes(size_t *n);

/* 1 when code is a reject code or one of the codes above. */
int moeq_result_code_known(const char *code);

/* One generated token's log-probability (job field `logprobs`): the model's log-softmax at temperature 1. */
typedef struct moeq_result_logprob {
    int32_t token;              /* the generated id                                  */
    double logprob;             /* <= 0                                              */
    int n_top;                  /* alternatives (job field top_logprobs), best first */
    int32_t *top_tokens;        /* n_top ids                                         */
    double *top_logprobs;       /* their log-probabilities                           */
} moeq_result_logprob;

/*
 * A result. Plain data. For encoding, every pointer is borrowed (may be NULL
 * = absent); strings are NUL-terminated (text is text_len bytes and may hold
 * U+0000 too), and any invalid UTF-8 in them is replaced by U+FFFD on the wire. A decoded result owns every pointer:
 * release it with moeq_result_free.
 */
typedef struct moeq_result {
    char *id;                      /* the job's id (required)                          */
    moeq_result_status status;
    char *text;                    /* generated text; NULL = absent                    */
    size_t text_len;               /* its bytes, U+0000 included (a token may decode to byte 0);
                                      encode: 0 = strlen(text); decode: always set      */
    int32_t *tokens;               /* generated token ids; NULL = absent               */
    size_t n_tokens;
    moeq_finish_reason finish_reason;
    struct {
        int64_t prompt_tokens;     /* >= 0                                             */
        int64_t completion_tokens; /* >= 0                                             */
    } usage;
    struct {                       /* ms, >= 0; all 0 = absent                         */
        int64_t queued_ms;         /* Kafka append -> placed in a batch               */
        int64_t batched_ms;        /* in a Redis batch -> a worker took it             */
        int64_t prefill_ms;
        int64_t decode_ms;
        int64_t total_ms;          /* Kafka append -> result produced                  */
    } timings;
    char *model;                   /* model name; NULL = absent                        */
    char *worker;                  /* worker id; NULL = absent                         */
    struct {
        char *code;                /* a job reject code name, or "engine", "internal", "dead_letter", ... */
        char *message;             /* human-readable, names the field at fault         */
    } error;                       /* NULL code = absent (status ok)                   */
    uint8_t *metadata;             /* the job's metadata, encoded in metadata_format   */
    size_t metadata_len;           /* NULL = absent                                    */
    moeq_wire_format metadata_format;
    int has_mtp;                   /* 1 when the mtp stats below are set               */
    struct {
        int64_t drafted;           /* tokens proposed by the MTP head                  */
        int64_t accepted;          /* of those, accepted by the main model             */
    } mtp;
    char *job_hash;                /* the job's content hash (moeq_job_content_hash): which
                                      submission this answers; NULL = absent (older writers) */
    moeq_result_logprob *logprobs; /* one per generated token when the job asked; NULL = absent */
    size_t n_logprobs;
} moeq_result;

/* accepted / drafted rounded to 4 decimals (0 when nothing was drafted): the `mtp.acceptance` a result carries. */
double moeq_result_mtp_acceptance(const moeq_result *res);

/* Free every member and zero the struct. NULL is safe. Only for decoded results. */
void moeq_result_free(moeq_result *result);

/*
 * Append the encoded result to out. When metadata_format differs from format
 * the metadata is transcoded (JSON <-> msgpack); msgpack metadata with
 * non-string keys, bin or ext values cannot become JSON (MOEQ_ERR_FORMAT).
 * Returns MOEQ_OK, MOEQ_ERR_INVALID_ARG (NULL, no id, unknown enum, negative
 * count), MOEQ_ERR_FORMAT (metadata not transcodable / malformed),
 * MOEQ_ERR_NOMEM. On error out->len is restored.
 */
moeq_err moeq_result_encode(const moeq_result *result, moeq_wire_format format, moeq_buf *out,
                            char *errstr, size_t errstr_size);

/*
 * Decode a result (format chosen like moeq_job_decode). Unknown fields are
 * ignored; `v` must be 1. At most max_bytes are accepted (0 = 16 MiB).
 * On MOEQ_OK *result is owned by the caller. Errors: MOEQ_ERR_PARSE,
 * MOEQ_ERR_FORMAT, MOEQ_ERR_UNSUPPORTED, MOEQ_ERR_LIMIT, MOEQ_ERR_NOMEM,
 * MOEQ_ERR_INVALID_ARG, with a message naming the field; *result is zeroed.
 */
moeq_err moeq_result_decode(const void *bytes, size_t len, const char *content_type, size_t max_bytes,
                            moeq_result *result, char *errstr, size_t errstr_size);

#ifdef __cplusplus
}
#endif
#endif
