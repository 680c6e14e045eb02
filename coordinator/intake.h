/*
 * intake.h — what the coordinator decides about one consumed job message:
 * accept it (with its exact prompt token ids), reject it (error result +
 * dead letter, with a stable reason code), or answer it as expired. Also
 * builds the result bytes the coordinator itself publishes (error, expired,
 * cancelled). Pure: decoding, validation and tokenization only, no I/O and
 * no clock (now_ms is passed in).
 *
 * Reason codes are the codec's (moeq_job_reject_code_name); the checks that
 * need configuration add to them with the same codes:
 *   reply_to not allowed             -> invalid_value, field reply_to
 *   prompt + max_new_tokens too long -> too_large, field prompt/messages/tokens
 *   token id outside the vocabulary  -> out_of_range, field tokens[i]
 *   messages without a chat format   -> invalid_value, field messages
 *   a response_format schema or pattern outside the supported subset (ctx->schemas: schema_check.h) ->
 *   result code unsupported_schema (codec code invalid_value), field response_format, the grammar's message
 *   prompt + max_new_tokens past the model's context (max_position_embeddings
 *   or max_model_len: params->max_model_len, which the coordinator resolves
 *   at start; 0 = unchecked) -> result code prompt_too_long (moeq_intake_code; the
 *   codec code underneath, for metrics, is too_large), field prompt/messages/
 *   tokens. Rejected, not clamped: as OpenAI and vLLM answer prompt +
 *   max_tokens > context, so a client never gets a shorter completion than it
 *   asked for without being told. Checked only when the prompt length is
 *   exact (a tokenizer, or `tokens` jobs); the worker checks it for the rest.
 *
 * Without a tokenizer (`model` empty) prompt and messages jobs are bucketed
 * by an estimate (ceil(bytes / 4) tokens) and carry no token ids: the worker
 * tokenizes them. `tokens` jobs never need the tokenizer.
 *
 * Thread-safe on distinct moeq_intake values (the tokenizer is immutable) without ctx->schemas; with it, one
 * thread (its cache).
 */
#ifndef MOEQ_INTAKE_H
#define MOEQ_INTAKE_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "moeq/job.h"
#include "moeq/result.h"
#include "moeq/tokenizer.h"
#include "moeq/wire.h"
#include "params.h"
#include "schema_check.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moeq_intake_verdict {
    MOEQ_INTAKE_ACCEPT = 0, /* batch it                                       */
    MOEQ_INTAKE_REJECT,     /* error result (when the id is known) + dead letter */
    MOEQ_INTAKE_EXPIRED,    /* deadline_ms passed: `expired` result           */
} moeq_intake_verdict;

typedef struct moeq_intake_ctx {
    const moeq_coordinator_params *params; /* borrowed */
    const moeq_tokenizer *tokenizer;       /* borrowed; NULL = estimate lengths */
    moeq_schema_check *schemas;            /* borrowed; NULL = response_format left to the worker */
} moeq_intake_ctx;

/* The decision about one message. Zero-initialise; reuse with moeq_intake_clear. */
typedef struct moeq_intake {
    moeq_intake_verdict verdict;
    int decoded;             /* 1 when job holds a decoded job (ACCEPT, EXPIRED, some REJECTs) */
    moeq_job job;            /* owned                                                          */
    moeq_tokens tokens;      /* owned: ids from the tokenizer (reused across calls)             */
    const int32_t *prompt;   /* ACCEPT: prompt ids (job.tokens or tokens.ids); NULL = estimated */
    int32_t prompt_len;      /* ACCEPT/EXPIRED: exact (or estimated) prompt length in tokens   */
    moeq_job_reject reject;  /* REJECT: code, field, message, id (has_id)                      */
    char job_hash[MOEQ_JOB_HASH_SIZE]; /* content hash of the bytes; results carry it ("" = none) */
    const char *code;        /* REJECT: the result's code when it is not reject.code's name
                                (prompt_too_long); NULL otherwise. Static.                     */
} moeq_intake;

/*
 * Decide about bytes[0..len) (content_type may be NULL) at now_ms.
 * Returns MOEQ_OK with out->verdict set; MOEQ_ERR_NOMEM or
 * MOEQ_ERR_INVALID_ARG otherwise (then nothing was decided: retry or stop).
 */
moeq_err moeq_intake_job(const moeq_intake_ctx *ctx, const void *bytes, size_t len, const char *content_type,
                         int64_t now_ms, moeq_intake *out);

/* Free the job (keep the token buffer for reuse) and zero the decision. */
void moeq_intake_clear(moeq_intake *in);
/* Free everything. */
void moeq_intake_free(moeq_intake *in);

/* REJECT: the error code of the result and the dead letter (in->code, else reject.code's name). */
const char *moeq_intake_code(const moeq_intake *in);

/* The job id to answer (decoded or from the reject); NULL when none could be read. */
const char *moeq_intake_id(const moeq_intake *in);

/* Topic for the result: the job's reply_to when allowed, else params->results_topic. */
const char *moeq_intake_result_topic(const moeq_intake_ctx *ctx, const moeq_intake *in);

/* Format results are sent in: the job's own, or JSON when it could not be told. */
moeq_wire_format moeq_intake_format(const moeq_intake *in);

/*
 * Encode the result the coordinator publishes for in: status ERROR (code and
 * message from the reject), EXPIRED or CANCELLED (message may be NULL), with
 * the job's metadata echoed when it was decoded. Appends to out.
 * MOEQ_ERR_NOT_FOUND when there is no id to answer.
 */
moeq_err moeq_intake_result_encode(const moeq_intake *in, moeq_result_status status, const char *message,
                                   int64_t queued_ms, moeq_buf *out, char *errstr, size_t errstr_size);

#ifdef __cplusplus
}
#endif
#endif
