/*
 * intake.c — decode, validate, tokenize one job; build the coordinator's own
 * results. See intake.h. The order of checks is chosen so the cheap ones
 * come first: decode, reply_to, deadline, then tokenization, then length.
 */
#include "intake.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void moeq_intake_clear(moeq_intake *in) {
    if (!in) return;
    moeq_job_free(&in->job);
    moeq_tokens keep = in->tokens;
    memset(in, 0, sizeof(*in));
    keep.n = 0;
    in->tokens = keep;
}

void moeq_intake_free(moeq_intake *in) {
    if (!in) return;
    moeq_job_free(&in->job);
    moeq_tokens_free(&in->tokens);
    memset(in, 0, sizeof(*in));
}

static moeq_err reject(moeq_intake *in, moeq_job_reject_code code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static moeq_err reject(moeq_intake *in, moeq_job_reject_code code, const char *field, const char *fmt, ...) {
    in->verdict = MOEQ_INTAKE_REJECT;
    in->reject.code = code;
    snprintf(in->reject.field, sizeof(in->reject.field), "%s", field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(in->reject.message, sizeof(in->reject.message), fmt, ap);
    va_end(ap);
    in->reject.format = in->job.format;
    in->reject.has_id = 1;
    snprintf(in->reject.id, sizeof(in->reject.id), "%s", in->job.id);
    return MOEQ_OK;
}

static const char *input_field(const moeq_job *job) {
    return job->input == MOEQ_JOB_INPUT_MESSAGES ? "messages" : job->input == MOEQ_JOB_INPUT_TOKENS ? "tokens" : "prompt";
}

/* Fill in->prompt / prompt_len. Returns MOEQ_OK, or a reject already recorded (still MOEQ_OK), or NOMEM. */
static moeq_err count_tokens(const moeq_intake_ctx *ctx, moeq_intake *in) {
    const moeq_job *job = &in->job;
    const moeq_tokenizer *tok = ctx->tokenizer;
    char err[256] = "";
    if (job->input == MOEQ_JOB_INPUT_TOKENS) {
        int n_ids = tok ? moeq_tokenizer_n_ids(tok) : INT32_MAX;
        for (size_t i = 0; i < job->n_tokens; i++)
            if (job->tokens[i] >= n_ids) {
                char field[64];
                snprintf(field, sizeof(field), "tokens[%zu]", i);
                return reject(in, MOEQ_JOB_REJECT_OUT_OF_RANGE, field,
                              "field '%s': id %d is outside the vocabulary (%d ids)", field, (int)job->tokens[i], n_ids);
            }
        in->prompt = job->tokens;
        in->prompt_len = (int32_t)job->n_tokens;
        return MOEQ_OK;
    }
    if (!tok) { /* estimate: bucketing only, the worker tokenizes */
        size_t bytes = job->prompt_len;
        for (size_t i = 0; job->input == MOEQ_JOB_INPUT_MESSAGES && i < job->n_messages; i++)
            bytes += job->messages[i].content_len + 8;
        in->prompt = NULL;
        in->prompt_len = (int32_t)((bytes + 3) / 4 > INT32_MAX ? INT32_MAX : (bytes + 3) / 4);
        if (in->prompt_len < 1) in->prompt_len = 1;
        return MOEQ_OK;
    }
    moeq_err e;
    in->tokens.n = 0;
    if (job->input == MOEQ_JOB_INPUT_PROMPT) {
        unsigned flags = moeq_tokenizer_add_bos(tok) ? MOEQ_TOKENIZE_ADD_BOS : 0;
        e = moeq_tokenizer_encode(tok, job->prompt, job->prompt_len, flags, &in->tokens, err, sizeof(err));
    } else {
        moeq_chat_message stack[16] = {{0}}, *msgs = job->n_messages <= 16 ? stack : malloc(job->n_messages * sizeof(*msgs));
        if (!msgs) return MOEQ_ERR_NOMEM;
        for (size_t i = 0; i < job->n_messages; i++) {
            msgs[i].role = job->messages[i].role;
            msgs[i].content = job->messages[i].content;
        }
        e = moeq_tokenizer_apply_chat(tok, msgs, job->n_messages, 1, &in->tokens, err, sizeof(err));
        if (msgs != stack) free(msgs);
    }
    if (e == MOEQ_ERR_NOMEM) return e;
    if (e) return reject(in, MOEQ_JOB_REJECT_INVALID_VALUE, input_field(job), "field '%s': %s", input_field(job), err);
    if (in->tokens.n == 0)
        return reject(in, MOEQ_JOB_REJECT_INVALID_VALUE, input_field(job), "field '%s': encodes to no tokens",
                      input_field(job));
    in->prompt = in->tokens.ids;
    in->prompt_len = in->tokens.n > INT32_MAX ? INT32_MAX : (int32_t)in->tokens.n;
    return MOEQ_OK;
}

moeq_err moeq_intake_job(const moeq_intake_ctx *ctx, const void *bytes, size_t len, const char *content_type,
                         int64_t now_ms, moeq_intake *in) {
    if (!ctx || !ctx->params || !in || (!bytes && len)) return MOEQ_ERR_INVALID_ARG;
    moeq_intake_clear(in);
    moeq_job_content_hash(bytes ? bytes : "", len, in->job_hash);
    const moeq_coordinator_params *p = ctx->params;
    moeq_err e = moeq_job_decode(bytes ? bytes : "", len, content_type, &p->limits, &in->job, &in->reject);
    if (e == MOEQ_ERR_NOMEM || e == MOEQ_ERR_INVALID_ARG) return e;
    if (e) {
        in->verdict = MOEQ_INTAKE_REJECT;
        if (in->reject.code == MOEQ_JOB_REJECT_NONE) in->reject.code = MOEQ_JOB_REJECT_MALFORMED;
        return MOEQ_OK;
    }
    in->decoded = 1;
    if (in->job.reply_to && !moeq_coordinator_reply_allowed(p, in->job.reply_to)) {
        reject(in, MOEQ_JOB_REJECT_INVALID_VALUE, "reply_to",
               "field 'reply_to': topic '%.128s' is not in results_allowed_topics", in->job.reply_to);
        in->code = MOEQ_CODE_REPLY_TO_NOT_ALLOWED; /* the documented code; the metric stays invalid_value */
        return MOEQ_OK;
    }
    if (in->job.deadline_ms > 0 && in->job.deadline_ms <= now_ms) {
        in->verdict = MOEQ_INTAKE_EXPIRED;
        return MOEQ_OK;
    }
    if (ctx->schemas) { /* a schema the worker would refuse is refused here, before it is batched */
        char why[256];
        e = moeq_schema_check_job(ctx->schemas, &in->job.response_format, why, sizeof why);
        if (e == MOEQ_ERR_NOMEM) return e;
        if (e) {
            reject(in, MOEQ_JOB_REJECT_INVALID_VALUE, "response_format", "field 'response_format': %s", why);
            in->code = MOEQ_CODE_UNSUPPORTED_SCHEMA;
            return MOEQ_OK;
        }
    }
    if ((e = count_tokens(ctx, in)) != MOEQ_OK) return e;
    if (in->verdict == MOEQ_INTAKE_REJECT) return MOEQ_OK;
    int64_t budget = (int64_t)in->prompt_len + in->job.max_new_tokens;
    if (p->max_model_len > 0 && (in->prompt || in->job.input == MOEQ_JOB_INPUT_TOKENS) && budget > p->max_model_len) {
        reject(in, MOEQ_JOB_REJECT_TOO_LARGE, input_field(&in->job),
               "field '%s': %d prompt tokens + max_new_tokens %d exceed the model's context of %lld tokens",
               input_field(&in->job), (int)in->prompt_len, (int)in->job.max_new_tokens, (long long)p->max_model_len);
        in->code = MOEQ_CODE_PROMPT_TOO_LONG;
        return MOEQ_OK;
    }
    if (budget > p->max_batch_tokens)
        return reject(in, MOEQ_JOB_REJECT_TOO_LARGE, input_field(&in->job),
                      "field '%s': %d prompt tokens + max_new_tokens %d exceed max_batch_tokens %lld",
                      input_field(&in->job), (int)in->prompt_len, (int)in->job.max_new_tokens,
                      (long long)p->max_batch_tokens);
    in->verdict = MOEQ_INTAKE_ACCEPT;
    return MOEQ_OK;
}

const char *moeq_intake_code(const moeq_intake *in) {
    return in->code ? in->code : moeq_job_reject_code_name(in->reject.code);
}

const char *moeq_intake_id(const moeq_intake *in) {
    if (in->decoded) return in->job.id;
    return in->reject.has_id ? in->reject.id : NULL;
}

const char *moeq_intake_result_topic(const moeq_intake_ctx *ctx, const moeq_intake *in) {
    if (in->decoded && in->job.reply_to && moeq_coordinator_reply_allowed(ctx->params, in->job.reply_to))
        return in->job.reply_to;
    return ctx->params->results_topic;
}

moeq_wire_format moeq_intake_format(const moeq_intake *in) {
    moeq_wire_format f = in->decoded ? in->job.format : in->reject.format;
    return f == MOEQ_WIRE_UNKNOWN ? MOEQ_WIRE_JSON : f;
}

moeq_err moeq_intake_result_encode(const moeq_intake *in, moeq_result_status status, const char *message,
                                   int64_t queued_ms, moeq_buf *out, char *errstr, size_t errstr_size) {
    const char *id = moeq_intake_id(in);
    if (!id) return moeq_errf(MOEQ_ERR_NOT_FOUND, errstr, errstr_size, "no job id to answer");
    moeq_result r;
    memset(&r, 0, sizeof(r));
    r.id = (char *)id;
    r.status = status;
    r.finish_reason = status == MOEQ_RESULT_CANCELLED ? MOEQ_FINISH_CANCELLED : MOEQ_FINISH_NONE;
    r.timings.queued_ms = queued_ms > 0 ? queued_ms : 0;
    r.usage.prompt_tokens = in->prompt_len > 0 ? in->prompt_len : 0;
    if (status == MOEQ_RESULT_ERROR) {
        r.error.code = (char *)moeq_intake_code(in);
        r.error.message = (char *)in->reject.message;
    } else if (status == MOEQ_RESULT_EXPIRED) {
        r.error.code = MOEQ_CODE_DEADLINE;
        r.error.message = (char *)(message ? message : "deadline_ms passed before the job was batched");
    } else if (status == MOEQ_RESULT_CANCELLED) {
        r.error.code = MOEQ_CODE_CANCELLED;
        r.error.message = (char *)(message ? message : "cancelled before the job was batched");
    }
    if (in->decoded && in->job.metadata) {
        r.metadata = in->job.metadata;
        r.metadata_len = in->job.metadata_len;
        r.metadata_format = in->job.format;
    }
    r.job_hash = in->job_hash[0] ? (char *)in->job_hash : NULL;
    return moeq_result_encode(&r, moeq_intake_format(in), out, errstr, errstr_size);
}
