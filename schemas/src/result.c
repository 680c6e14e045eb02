/*
 * result.c — encode a result (schemas/result.md) to msgpack or JSON, and
 * decode one back (for `moeq submit` and tests).
 *
 * The encoder omits absent optional fields, replaces invalid UTF-8 in
 * strings with U+FFFD (engine output is never allowed to make a result
 * unpublishable) and transcodes metadata only when the job's format differs.
 * The decoder shares the job decoder's reader, so it is just as strict
 * about bytes, but more lenient about values: it reads what workers wrote.
 */
#include "moeq/result.h"
#include "moeq/job.h"

#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire_internal.h"

static const char *const status_names[MOEQ_RESULT_STATUS__COUNT] = {"ok", "error", "expired", "cancelled"};
static const char *const finish_names[MOEQ_FINISH__COUNT] = {"none",     "stop",      "length", "stop_token",
                                                             "deadline", "cancelled", "error"};

const char *moeq_result_status_name(moeq_result_status status) {
    return (unsigned)status < MOEQ_RESULT_STATUS__COUNT ? status_names[status] : "unknown";
}

const char *moeq_finish_reason_name(moeq_finish_reason reason) {
    return (unsigned)reason < MOEQ_FINISH__COUNT ? finish_names[reason] : "unknown";
}

static const char *const error_codes[] = {
    MOEQ_CODE_REPLY_TO_NOT_ALLOWED, MOEQ_CODE_PROMPT_TOO_LONG, MOEQ_CODE_TOKENIZE, MOEQ_CODE_NUMERICAL_ERROR,
    MOEQ_CODE_DEAD_LETTER, MOEQ_CODE_RESULT_UNDELIVERABLE, MOEQ_CODE_ENGINE, MOEQ_CODE_INTERNAL,
    MOEQ_CODE_DEADLINE, MOEQ_CODE_CANCELLED, MOEQ_CODE_UNSUPPORTED_SCHEMA, MOEQ_CODE_GRAMMAR_TOO_LARGE,
};

const char *const *moeq_result_error_codes(size_t *n) {
    *n = sizeof error_codes / sizeof error_codes[0];
    return error_codes;
}

int moeq_result_code_known(const char *code) {
    if (!code) return 0;
    if (moeq_job_reject_code_from_name(code) != MOEQ_JOB_REJECT_NONE) return 1;
    for (size_t i = 0; i < sizeof error_codes / sizeof error_codes[0]; i++)
        if (!strcmp(code, error_codes[i])) return 1;
    return 0;
}

void moeq_result_free(moeq_result *result) {
    if (!result) return;
    free(result->id);
    free(result->text);
    free(result->tokens);
    free(result->model);
    free(result->worker);
    free(result->error.code);
    free(result->error.message);
    free(result->metadata);
    free(result->job_hash);
    for (size_t i = 0; result->logprobs && i < result->n_logprobs; i++) {
        free(result->logprobs[i].top_tokens);
        free(result->logprobs[i].top_logprobs);
    }
    free(result->logprobs);
    memset(result, 0, sizeof *result);
}

/* ---- encode -------------------------------------------------------------- */

static int has_timings(const moeq_result *res) {
    return res->timings.queued_ms || res->timings.batched_ms || res->timings.prefill_ms || res->timings.decode_ms ||
           res->timings.total_ms;
}

static uint32_t count_fields(const moeq_result *res) {
    return 4 /* v id status usage */ + (res->text != NULL) + (res->tokens != NULL) +
           (res->finish_reason != MOEQ_FINISH_NONE) + (uint32_t)has_timings(res) + (res->model != NULL) +
           (res->worker != NULL) + (res->error.code != NULL) + (res->metadata != NULL) + (uint32_t)(res->has_mtp != 0) +
           (res->job_hash != NULL) + (res->logprobs != NULL);
}

double moeq_result_mtp_acceptance(const moeq_result *res) {
    if (!res || res->mtp.drafted <= 0) return 0.0;
    return round((double)res->mtp.accepted / (double)res->mtp.drafted * 1e4) / 1e4;
}

static void put_int(ww *w, const char *key, int64_t x) {
    ww_key(w, key);
    ww_int(w, x);
}

static void put_str(ww *w, const char *key, const char *s) {
    ww_key(w, key);
    ww_str_lossy(w, s);
}

static void encode_numbers(ww *w, const moeq_result *res) {
    ww_key(w, "usage");
    ww_map(w, 2);
    put_int(w, "prompt_tokens", res->usage.prompt_tokens);
    put_int(w, "completion_tokens", res->usage.completion_tokens);
    ww_end_map(w);
    if (has_timings(res)) {
        ww_key(w, "timings");
        ww_map(w, 5);
        put_int(w, "queued_ms", res->timings.queued_ms);
        put_int(w, "batched_ms", res->timings.batched_ms);
        put_int(w, "prefill_ms", res->timings.prefill_ms);
        put_int(w, "decode_ms", res->timings.decode_ms);
        put_int(w, "total_ms", res->timings.total_ms);
        ww_end_map(w);
    }
}

/* [{token, logprob, top_logprobs: [{token, logprob}]}] — OpenAI's shape with ids for token strings. */
static void encode_logprobs(ww *w, const moeq_result *res) {
    ww_key(w, "logprobs");
    ww_array(w, (uint32_t)res->n_logprobs);
    for (size_t i = 0; i < res->n_logprobs; i++) {
        const moeq_result_logprob *lp = &res->logprobs[i];
        ww_map(w, 3);
        put_int(w, "token", lp->token);
        ww_key(w, "logprob"), ww_double(w, lp->logprob);
        ww_key(w, "top_logprobs");
        ww_array(w, (uint32_t)lp->n_top);
        for (int k = 0; k < lp->n_top; k++) {
            ww_map(w, 2);
            put_int(w, "token", lp->top_tokens[k]);
            ww_key(w, "logprob"), ww_double(w, lp->top_logprobs[k]);
            ww_end_map(w);
        }
        ww_end_array(w);
        ww_end_map(w);
    }
    ww_end_array(w);
}

static moeq_err check_result(const moeq_result *res, char *errstr, size_t errstr_size) {
    if (!res->id) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "result: field 'id' is required");
    if ((unsigned)res->status >= MOEQ_RESULT_STATUS__COUNT)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "result: field 'status': %d is not a status",
                         (int)res->status);
    if ((unsigned)res->finish_reason >= MOEQ_FINISH__COUNT)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "result: field 'finish_reason': %d is not one",
                         (int)res->finish_reason);
    for (size_t i = 0; res->logprobs && i < res->n_logprobs; i++)
        if (res->logprobs[i].n_top < 0 || (res->logprobs[i].n_top && (!res->logprobs[i].top_tokens ||
                                                                      !res->logprobs[i].top_logprobs)))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "result: logprobs[%zu]: bad top list", i);
    if (res->n_tokens > UINT32_MAX || (res->n_tokens && !res->tokens))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "result: field 'tokens': bad count %zu",
                         res->n_tokens);
    const int64_t *nums = &res->usage.prompt_tokens;
    int64_t all[] = {nums[0], nums[1], res->timings.queued_ms, res->timings.batched_ms, res->timings.prefill_ms,
                     res->timings.decode_ms, res->timings.total_ms, res->mtp.drafted, res->mtp.accepted};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i] < 0)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "result: usage/timings/mtp must be >= 0");
    return MOEQ_OK;
}

moeq_err moeq_result_encode(const moeq_result *res, moeq_wire_format format, moeq_buf *out, char *errstr,
                            size_t errstr_size) {
    if (!res || !out || (format != MOEQ_WIRE_MSGPACK && format != MOEQ_WIRE_JSON))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "result: NULL argument or unknown format");
    moeq_err err = check_result(res, errstr, errstr_size);
    if (err != MOEQ_OK) return err;
    size_t len0 = out->len;
    ww w;
    ww_init(&w, out, format);
    ww_map(&w, count_fields(res));
    put_int(&w, "v", MOEQ_RESULT_VERSION);
    put_str(&w, "id", res->id);
    ww_key(&w, "status"), ww_str_lossy(&w, status_names[res->status]);
    if (res->text) { /* by its length: a token may decode to byte 0 (JSON: \u0000), the text goes on after it */
        ww_key(&w, "text");
        ww_str_lossy_n(&w, res->text, res->text_len ? res->text_len : strlen(res->text));
    }
    if (res->tokens) {
        ww_key(&w, "tokens");
        ww_array(&w, (uint32_t)res->n_tokens);
        for (size_t i = 0; i < res->n_tokens; i++) ww_int(&w, res->tokens[i]);
        ww_end_array(&w);
    }
    if (res->finish_reason != MOEQ_FINISH_NONE) put_str(&w, "finish_reason", finish_names[res->finish_reason]);
    encode_numbers(&w, res);
    if (res->model) put_str(&w, "model", res->model);
    if (res->worker) put_str(&w, "worker", res->worker);
    if (res->error.code) {
        ww_key(&w, "error");
        ww_map(&w, 2);
        put_str(&w, "code", res->error.code);
        put_str(&w, "message", res->error.message ? res->error.message : "");
        ww_end_map(&w);
    }
    wrd r;
    r.code = MOEQ_JOB_REJECT_NONE;
    if (res->metadata) {
        ww_key(&w, "metadata");
        moeq_wire_format from = res->metadata_format ? res->metadata_format : format;
        if (ww_value_from(&w, res->metadata, res->metadata_len, from, MOEQ_JOB_DEPTH_HARD_MAX - 1, &r) < 0 &&
            w.err == MOEQ_OK)
            w.err = r.nomem ? MOEQ_ERR_NOMEM : MOEQ_ERR_FORMAT;
    }
    if (res->has_mtp) {
        ww_key(&w, "mtp");
        ww_map(&w, 3);
        put_int(&w, "drafted", res->mtp.drafted);
        put_int(&w, "accepted", res->mtp.accepted);
        ww_key(&w, "acceptance"); /* derived, for readers; decoders ignore it */
        ww_double(&w, moeq_result_mtp_acceptance(res));
        ww_end_map(&w);
    }
    if (res->logprobs) encode_logprobs(&w, res);
    if (res->job_hash) put_str(&w, "job_hash", res->job_hash); /* last: results without it encode as before */
    ww_end_map(&w);
    if (w.err != MOEQ_OK) {
        out->len = len0;
        if (out->data) out->data[len0] = 0;
        if (r.code != MOEQ_JOB_REJECT_NONE && w.err == MOEQ_ERR_FORMAT)
            return moeq_errf(w.err, errstr, errstr_size, "result: field 'metadata': %s", r.msg);
        return moeq_errf(w.err, errstr, errstr_size, "result: encoding failed: %s", moeq_err_str(w.err));
    }
    return MOEQ_OK;
}

/* ---- decode -------------------------------------------------------------- */

typedef struct rdec {
    wrd r;
    moeq_result *res;
    size_t max_str;
    moeq_err err; /* the moeq_err for a value problem (FORMAT, UNSUPPORTED) */
} rdec;

static int rfail(rdec *d, moeq_err err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rfail(rdec *d, moeq_err err, const char *fmt, ...) {
    char tail[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tail, sizeof tail, fmt, ap);
    va_end(ap);
    d->err = err;
    return wrd_fail(&d->r, MOEQ_JOB_REJECT_WRONG_TYPE, "field '%s': %s", d->r.path, tail);
}

static int r_str(rdec *d, const wval *v, char **out) {
    if (v->type != WV_STR) return rfail(d, MOEQ_ERR_FORMAT, "expected a string, got %s", wval_type_name(v));
    free(*out);
    *out = wrd_strdup(&d->r, v);
    return *out ? 0 : -1;
}

static int r_int(rdec *d, const wval *v, int64_t min, int64_t max, int64_t *out) {
    if (v->type != WV_INT || v->i < min || v->i > max)
        return rfail(d, MOEQ_ERR_FORMAT, "expected an integer in [%lld, %lld]", (long long)min, (long long)max);
    *out = v->i;
    return 0;
}

static int r_enum(rdec *d, const wval *v, const char *const *names, int n, int *out) {
    if (v->type != WV_STR) return rfail(d, MOEQ_ERR_FORMAT, "expected a string, got %s", wval_type_name(v));
    for (int i = 0; i < n; i++)
        if (wval_str_is(v, names[i])) {
            *out = i;
            return 0;
        }
    return rfail(d, MOEQ_ERR_FORMAT, "not a known value");
}

/* A map of int64 fields: keys[i] -> outs[i]; other keys skipped. Map at depth 2. */
static int r_int_map(rdec *d, const wval *v, const char *const *keys, int64_t *const *outs, int n) {
    if (v->type != WV_MAP) return rfail(d, MOEQ_ERR_FORMAT, "expected a map, got %s", wval_type_name(v));
    witer it;
    if (wrd_iter_begin(&d->r, v, 2, &it) < 0) return -1;
    int more;
    while ((more = wrd_iter_next(&d->r, &it)) == 1) {
        wval key, x;
        if (wrd_key(&d->r, &key) < 0 || wrd_skip(&d->r, &key, 3) < 0 || wrd_head(&d->r, &x) < 0) return -1;
        int k = -1;
        for (int i = 0; i < n; i++)
            if (wval_str_is(&key, keys[i])) k = i;
        if (k < 0) {
            if (wrd_skip(&d->r, &x, 3) < 0) return -1;
        } else if (r_int(d, &x, 0, INT64_MAX, outs[k]) < 0) {
            return -1;
        }
    }
    return more;
}

static int r_error(rdec *d, const wval *v) {
    if (v->type != WV_MAP) return rfail(d, MOEQ_ERR_FORMAT, "expected a map, got %s", wval_type_name(v));
    witer it;
    if (wrd_iter_begin(&d->r, v, 2, &it) < 0) return -1;
    int more;
    while ((more = wrd_iter_next(&d->r, &it)) == 1) {
        wval key, x;
        if (wrd_key(&d->r, &key) < 0 || wrd_skip(&d->r, &key, 3) < 0 || wrd_head(&d->r, &x) < 0) return -1;
        if (wval_str_is(&key, "code")) {
            if (r_str(d, &x, &d->res->error.code) < 0) return -1;
        } else if (wval_str_is(&key, "message")) {
            if (r_str(d, &x, &d->res->error.message) < 0) return -1;
        } else if (wrd_skip(&d->r, &x, 3) < 0) {
            return -1;
        }
    }
    return more;
}

static int r_tokens(rdec *d, const wval *v) {
    if (v->type != WV_ARRAY) return rfail(d, MOEQ_ERR_FORMAT, "expected an array, got %s", wval_type_name(v));
    moeq_result *res = d->res;
    free(res->tokens);
    res->tokens = NULL;
    res->n_tokens = 0;
    size_t cap = 0;
    witer it;
    if (wrd_iter_begin(&d->r, v, 2, &it) < 0) return -1;
    int more;
    while ((more = wrd_iter_next(&d->r, &it)) == 1) {
        wval x;
        int64_t id = 0;
        if (wrd_head(&d->r, &x) < 0 || r_int(d, &x, 0, INT32_MAX, &id) < 0) return -1;
        if (res->n_tokens == cap) { /* grows with what was read, never by a declared count */
            size_t c = cap ? cap * 2 : 64;
            int32_t *t = realloc(res->tokens, c * sizeof *t);
            if (!t) {
                d->r.nomem = 1;
                return -1;
            }
            res->tokens = t;
            cap = c;
        }
        res->tokens[res->n_tokens++] = (int32_t)id;
    }
    if (more == 0 && !res->tokens) res->tokens = malloc(1); /* present but empty */
    return more;
}

/* A finite number: JSON has no NaN or infinity, so a result holding one could not be written again. */
static int r_num(rdec *d, const wval *v, double *out) {
    if (v->type == WV_FLOAT) *out = v->f;
    else if (v->type == WV_INT) *out = (double)v->i;
    else return rfail(d, MOEQ_ERR_FORMAT, "expected a number, got %s", wval_type_name(v));
    if (!isfinite(*out)) return rfail(d, MOEQ_ERR_FORMAT, "expected a finite number");
    return 0;
}

/* One {token, logprob[, top_logprobs]} map at depth `depth`; top entries (n_top of them) when top != NULL. */
static int r_logprob_map(rdec *d, const wval *v, int depth, moeq_result_logprob *lp, int with_top) {
    if (v->type != WV_MAP) return rfail(d, MOEQ_ERR_FORMAT, "expected a map, got %s", wval_type_name(v));
    witer it;
    if (wrd_iter_begin(&d->r, v, depth, &it) < 0) return -1;
    int more;
    while ((more = wrd_iter_next(&d->r, &it)) == 1) {
        wval key, x;
        int64_t id = 0;
        if (wrd_key(&d->r, &key) < 0 || wrd_skip(&d->r, &key, depth + 1) < 0 || wrd_head(&d->r, &x) < 0) return -1;
        if (wval_str_is(&key, "token")) {
            if (r_int(d, &x, 0, INT32_MAX, &id) < 0) return -1;
            lp->token = (int32_t)id;
        } else if (wval_str_is(&key, "logprob")) {
            if (r_num(d, &x, &lp->logprob) < 0) return -1;
        } else if (with_top && wval_str_is(&key, "top_logprobs") && x.type == WV_ARRAY) {
            witer it2;
            if (wrd_iter_begin(&d->r, &x, depth + 1, &it2) < 0) return -1;
            int m;
            while ((m = wrd_iter_next(&d->r, &it2)) == 1) {
                wval e;
                moeq_result_logprob t = {0};
                if (wrd_head(&d->r, &e) < 0 || r_logprob_map(d, &e, depth + 2, &t, 0) < 0) return -1;
                if ((lp->n_top & (lp->n_top + 1)) == 0) { /* grow at 2^k - 1 entries */
                    size_t c = (size_t)(lp->n_top + 1) * 2;
                    int32_t *tt = realloc(lp->top_tokens, c * sizeof *tt);
                    if (tt) lp->top_tokens = tt;
                    double *tv = realloc(lp->top_logprobs, c * sizeof *tv);
                    if (tv) lp->top_logprobs = tv;
                    if (!tt || !tv) return d->r.nomem = 1, -1;
                }
                lp->top_tokens[lp->n_top] = t.token;
                lp->top_logprobs[lp->n_top++] = t.logprob;
            }
            if (m < 0) return -1;
        } else if (wrd_skip(&d->r, &x, depth + 1) < 0) {
            return -1;
        }
    }
    return more;
}

static int r_logprobs(rdec *d, const wval *v) {
    if (v->type != WV_ARRAY) return rfail(d, MOEQ_ERR_FORMAT, "expected an array, got %s", wval_type_name(v));
    moeq_result *res = d->res;
    size_t cap = 0;
    witer it;
    if (res->logprobs) return rfail(d, MOEQ_ERR_FORMAT, "given twice");
    if (wrd_iter_begin(&d->r, v, 2, &it) < 0) return -1;
    int more;
    while ((more = wrd_iter_next(&d->r, &it)) == 1) {
        wval x;
        if (res->n_logprobs == cap) {
            size_t c = cap ? cap * 2 : 16;
            moeq_result_logprob *l = realloc(res->logprobs, c * sizeof *l);
            if (!l) return d->r.nomem = 1, -1;
            res->logprobs = l, cap = c;
        }
        moeq_result_logprob *lp = &res->logprobs[res->n_logprobs++];
        memset(lp, 0, sizeof *lp);
        if (wrd_head(&d->r, &x) < 0 || r_logprob_map(d, &x, 3, lp, 1) < 0) return -1;
    }
    if (more == 0 && !res->logprobs) res->logprobs = calloc(1, sizeof *res->logprobs); /* present but empty */
    return more;
}

static int r_metadata(rdec *d, const wval *v) {
    if (v->type != WV_MAP) return rfail(d, MOEQ_ERR_FORMAT, "expected a map, got %s", wval_type_name(v));
    if (wrd_skip(&d->r, v, 2) < 0) return -1;
    size_t n = (size_t)(d->r.p - v->start);
    free(d->res->metadata);
    d->res->metadata = malloc(n);
    if (!d->res->metadata) {
        d->r.nomem = 1;
        return -1;
    }
    memcpy(d->res->metadata, v->start, n);
    d->res->metadata_len = n;
    d->res->metadata_format = d->r.fmt;
    return 0;
}

static int r_field(rdec *d, const wval *key, const wval *v) {
    moeq_result *res = d->res;
    int e;
    if (wval_str_is(key, "v")) {
        if (v->type != WV_INT) return rfail(d, MOEQ_ERR_FORMAT, "expected an integer");
        if (v->i != MOEQ_RESULT_VERSION) return rfail(d, MOEQ_ERR_UNSUPPORTED, "version %lld", (long long)v->i);
        return 0;
    }
    if (wval_str_is(key, "id")) return r_str(d, v, &res->id);
    if (wval_str_is(key, "status")) {
        if (r_enum(d, v, status_names, MOEQ_RESULT_STATUS__COUNT, &e) < 0) return -1;
        res->status = (moeq_result_status)e;
        return 0;
    }
    if (wval_str_is(key, "text")) {
        res->text_len = v->type == WV_STR ? v->dec_len : 0;
        return r_str(d, v, &res->text);
    }
    if (wval_str_is(key, "tokens")) return r_tokens(d, v);
    if (wval_str_is(key, "finish_reason")) {
        if (r_enum(d, v, finish_names, MOEQ_FINISH__COUNT, &e) < 0) return -1;
        res->finish_reason = (moeq_finish_reason)e;
        return 0;
    }
    if (wval_str_is(key, "usage")) {
        static const char *const keys[] = {"prompt_tokens", "completion_tokens"};
        int64_t *const outs[] = {&res->usage.prompt_tokens, &res->usage.completion_tokens};
        return r_int_map(d, v, keys, outs, 2);
    }
    if (wval_str_is(key, "timings")) {
        static const char *const keys[] = {"queued_ms", "batched_ms", "prefill_ms", "decode_ms", "total_ms"};
        int64_t *const outs[] = {&res->timings.queued_ms, &res->timings.batched_ms, &res->timings.prefill_ms,
                                 &res->timings.decode_ms, &res->timings.total_ms};
        return r_int_map(d, v, keys, outs, 5);
    }
    if (wval_str_is(key, "model")) return r_str(d, v, &res->model);
    if (wval_str_is(key, "worker")) return r_str(d, v, &res->worker);
    if (wval_str_is(key, "error")) return r_error(d, v);
    if (wval_str_is(key, "metadata")) return r_metadata(d, v);
    if (wval_str_is(key, "job_hash")) return r_str(d, v, &res->job_hash);
    if (wval_str_is(key, "logprobs")) return r_logprobs(d, v);
    if (wval_str_is(key, "mtp")) {
        static const char *const keys[] = {"drafted", "accepted"};
        int64_t *const outs[] = {&res->mtp.drafted, &res->mtp.accepted};
        res->has_mtp = 1;
        return r_int_map(d, v, keys, outs, 2);
    }
    return wrd_skip(&d->r, v, 2);
}

static int r_document(rdec *d) {
    wrd *r = &d->r;
    wval top, key, v;
    if (wrd_head(r, &top) < 0) return -1;
    if (top.type != WV_MAP) return wrd_fail(r, MOEQ_JOB_REJECT_NOT_A_MAP, "the result is %s, not a map",
                                            wval_type_name(&top));
    witer it;
    if (wrd_iter_begin(r, &top, 1, &it) < 0) return -1;
    int more, has_v = 0;
    while ((more = wrd_iter_next(r, &it)) == 1) {
        if (wrd_key(r, &key) < 0) return -1;
        /* U+0000 is text only in `text` (a token may decode to byte 0); metadata and the rest refuse it, as jobs do */
        r->allow_nul = key.type == WV_STR && wval_str_is(&key, "text");
        int head = wrd_head(r, &v);
        r->allow_nul = 0;
        if (head < 0) return -1;
        if (key.type != WV_STR) {
            if (wrd_skip(r, &key, 2) < 0 || wrd_skip(r, &v, 2) < 0) return -1;
            continue;
        }
        snprintf(r->path, sizeof r->path, "%.*s", (int)(key.n < 60 ? key.n : 60), (const char *)key.s);
        has_v |= wval_str_is(&key, "v");
        if (v.type != WV_NIL && r_field(d, &key, &v) < 0) return -1;
    }
    if (more < 0 || wrd_finish(r) < 0) return -1;
    snprintf(r->path, sizeof r->path, "v");
    if (!has_v) return rfail(d, MOEQ_ERR_FORMAT, "required");
    if (!d->res->id) {
        snprintf(r->path, sizeof r->path, "id");
        return rfail(d, MOEQ_ERR_FORMAT, "required");
    }
    return 0;
}

moeq_err moeq_result_decode(const void *bytes, size_t len, const char *content_type, size_t max_bytes,
                            moeq_result *result, char *errstr, size_t errstr_size) {
    if (result) memset(result, 0, sizeof *result);
    if ((!bytes && len) || !result) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "result: NULL argument");
    if (max_bytes == 0) max_bytes = 16u << 20;
    if (len > max_bytes)
        return moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size, "result: %zu bytes, over the limit %zu", len, max_bytes);
    moeq_wire_format fmt = moeq_wire_detect(bytes, len, content_type);
    if (fmt == MOEQ_WIRE_UNKNOWN)
        return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "result: neither a msgpack map nor a JSON object");
    rdec d;
    memset(&d, 0, sizeof d);
    d.res = result;
    wrd_init(&d.r, bytes, len, fmt, MOEQ_JOB_DEPTH_HARD_MAX);
    if (r_document(&d) == 0) return MOEQ_OK;
    moeq_result_free(result);
    if (d.r.nomem) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "result: out of memory");
    moeq_err err = d.err != MOEQ_OK ? d.err : moeq_job_reject_err(d.r.code);
    return moeq_errf(err, errstr, errstr_size, "result: %s", d.r.msg);
}
