/*
 * job.c — decode and validate a job (schemas/job.md), and encode one.
 *
 * Two passes over the bytes, both with the non-allocating reader:
 *   1. scan: the whole document is well-formed, not too deep, every string is
 *      valid text, no known field is repeated; pick up `v` and `id`.
 *   2. fields: check `v`, then decode each known field in document order
 *      (unknown fields are skipped: forward compatibility).
 * Allocations happen only in pass 2, only for bytes that are present, and
 * arrays grow with what was actually read, up to their limit.
 *
 * Not here: clocks (deadline), the reply_to allow-list, tokenisation.
 */
#include "moeq/job.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire_internal.h"

/* ---- limits -------------------------------------------------------------- */

#define LIMIT(name, def, max, doc)                                                                                     \
    {#name, MOEQ_PROP_INT, offsetof(moeq_job_limits, name), sizeof(int64_t), 1, max, #def, doc}

const moeq_prop moeq_job_limits_props[] = {
    LIMIT(max_job_bytes, 1048576, 1073741824, "largest encoded job accepted, bytes"),
    LIMIT(max_id_bytes, 256, MOEQ_JOB_ID_HARD_MAX, "longest job id, bytes"),
    LIMIT(max_prompt_bytes, 524288, 1073741824, "longest prompt (or sum of message contents), bytes"),
    LIMIT(max_input_tokens, 131072, 16777216, "most entries in a job's `tokens`"),
    LIMIT(max_new_tokens, 8192, 1048576, "cap on a job's max_new_tokens"),
    LIMIT(max_messages, 1024, 1048576, "most entries in a job's `messages`"),
    LIMIT(max_stop, 16, 1024, "most stop strings"),
    LIMIT(max_stop_bytes, 256, 65536, "longest stop string, bytes"),
    LIMIT(max_string_bytes, 256, 65536, "longest role or reply_to, bytes"),
    LIMIT(max_metadata_bytes, 16384, 16777216, "largest encoded metadata value, bytes"),
    LIMIT(max_depth, 32, MOEQ_JOB_DEPTH_HARD_MAX, "deepest nesting of maps/arrays; the job map is level 1"),
    LIMIT(max_schema_bytes, 32768, 16777216, "largest response_format.json_schema.schema, encoded bytes"),
    LIMIT(max_pattern_bytes, 1024, 65536, "longest response_format.pattern, bytes"),
    LIMIT(max_choices, 256, 65536, "most response_format.choices"),
    LIMIT(max_choice_bytes, 1024, 65536, "longest response_format choice, bytes"),
    LIMIT(max_stop_token_ids, 64, 4096, "most entries in a job's stop_token_ids"),
    MOEQ_PROP_END,
};

moeq_job_limits moeq_job_default_limits(void) {
    moeq_job_limits limits;
    moeq_props_defaults(moeq_job_limits_props, &limits, NULL, 0);
    return limits;
}

moeq_err moeq_job_limits_check(const moeq_job_limits *limits, char *errstr, size_t errstr_size) {
    if (!limits) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "limits: NULL");
    for (const moeq_prop *p = moeq_job_limits_props; p->name; p++) {
        int64_t v;
        memcpy(&v, (const char *)limits + p->offset, sizeof v);
        if (v < (int64_t)p->min || v > (int64_t)p->max)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "limit '%s': %lld is outside [%.0f, %.0f]",
                             p->name, (long long)v, p->min, p->max);
    }
    return MOEQ_OK;
}

/* ---- reject codes -------------------------------------------------------- */

static const char *const reject_names[MOEQ_JOB_REJECT__COUNT] = {
    [MOEQ_JOB_REJECT_NONE] = "none",
    [MOEQ_JOB_REJECT_MALFORMED] = "malformed",
    [MOEQ_JOB_REJECT_NOT_A_MAP] = "not_a_map",
    [MOEQ_JOB_REJECT_UNSUPPORTED_VERSION] = "unsupported_version",
    [MOEQ_JOB_REJECT_MISSING_FIELD] = "missing_field",
    [MOEQ_JOB_REJECT_WRONG_TYPE] = "wrong_type",
    [MOEQ_JOB_REJECT_OUT_OF_RANGE] = "out_of_range",
    [MOEQ_JOB_REJECT_TOO_LARGE] = "too_large",
    [MOEQ_JOB_REJECT_INVALID_UTF8] = "invalid_utf8",
    [MOEQ_JOB_REJECT_TOO_DEEP] = "too_deep",
    [MOEQ_JOB_REJECT_CONFLICTING_INPUT] = "conflicting_input",
    [MOEQ_JOB_REJECT_DUPLICATE_KEY] = "duplicate_key",
    [MOEQ_JOB_REJECT_INVALID_VALUE] = "invalid_value",
};

const char *moeq_job_reject_code_name(moeq_job_reject_code code) {
    if ((unsigned)code >= MOEQ_JOB_REJECT__COUNT) return "unknown";
    return reject_names[code];
}

moeq_job_reject_code moeq_job_reject_code_from_name(const char *name) {
    for (int c = 0; name && c < MOEQ_JOB_REJECT__COUNT; c++)
        if (strcmp(reject_names[c], name) == 0) return (moeq_job_reject_code)c;
    return MOEQ_JOB_REJECT_NONE;
}

void moeq_job_content_hash(const void *bytes, size_t len, char out[MOEQ_JOB_HASH_SIZE]) {
    const unsigned char *p = bytes;
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    snprintf(out, MOEQ_JOB_HASH_SIZE, "%016llx", (unsigned long long)h);
}

moeq_err moeq_job_reject_err(moeq_job_reject_code code) {
    switch (code) {
    case MOEQ_JOB_REJECT_NONE: return MOEQ_OK;
    case MOEQ_JOB_REJECT_MALFORMED:
    case MOEQ_JOB_REJECT_NOT_A_MAP: return MOEQ_ERR_PARSE;
    case MOEQ_JOB_REJECT_UNSUPPORTED_VERSION: return MOEQ_ERR_UNSUPPORTED;
    case MOEQ_JOB_REJECT_TOO_LARGE:
    case MOEQ_JOB_REJECT_TOO_DEEP: return MOEQ_ERR_LIMIT;
    default: return MOEQ_ERR_FORMAT;
    }
}

/* ---- fields -------------------------------------------------------------- */

typedef enum field {
    F_V, F_ID, F_PRIORITY, F_PROMPT, F_MESSAGES, F_TOKENS, F_MAX_NEW_TOKENS, F_TEMPERATURE, F_TOP_P, F_TOP_K,
    F_SEED, F_STOP, F_DEADLINE_MS, F_REPLY_TO, F_MTP, F_METADATA, F_RESPONSE_FORMAT, F_LOGPROBS, F_TOP_LOGPROBS,
    F_STOP_TOKEN_IDS, F_MIN_TOKENS, F_REPETITION_PENALTY, F_PRESENCE_PENALTY, F_FREQUENCY_PENALTY, F__COUNT
} field;

static const char *const field_names[F__COUNT] = {
    "v", "id", "priority", "prompt", "messages", "tokens", "max_new_tokens", "temperature", "top_p", "top_k",
    "seed", "stop", "deadline_ms", "reply_to", "mtp", "metadata", "response_format", "logprobs", "top_logprobs",
    "stop_token_ids", "min_tokens", "repetition_penalty", "presence_penalty", "frequency_penalty",
};

static int field_of(const wval *key) {
    for (int f = 0; f < F__COUNT; f++)
        if (wval_str_is(key, field_names[f])) return f;
    return -1;
}

typedef struct dec {
    wrd r;
    const moeq_job_limits *limits;
    moeq_job *job;
    /* from the scan */
    int has_v;
    wval v;
    int has_id;
    char id[MOEQ_JOB_ID_HARD_MAX + 1];
} dec;

/* Set r->path to the key's text (truncated) so messages name the field. */
static void path_from_key(wrd *r, const wval *key) {
    if (key->type == WV_STR && key->dec_len < sizeof r->path) {
        wval_str_copy(key, r->path);
    } else if (key->type == WV_STR) {
        char *s = malloc(key->dec_len + 1);
        if (s) wval_str_copy(key, s);
        snprintf(r->path, sizeof r->path, "%.*s", (int)sizeof r->path - 4, s ? s : "?");
        free(s);
    } else {
        snprintf(r->path, sizeof r->path, "<%s key>", wval_type_name(key));
    }
}

static int fail_field(dec *d, moeq_job_reject_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_field(dec *d, moeq_job_reject_code code, const char *fmt, ...) {
    char tail[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tail, sizeof tail, fmt, ap);
    va_end(ap);
    return wrd_fail(&d->r, code, "field '%s': %s", d->r.path, tail);
}

static int wrong_type(dec *d, const wval *v, const char *want) {
    return fail_field(d, MOEQ_JOB_REJECT_WRONG_TYPE, "expected %s, got %s", want, wval_type_name(v));
}

/* An integer in [min, max]; floats are a type error even when whole (5.0). */
static int want_int(dec *d, const wval *v, int64_t min, int64_t max, int64_t *out) {
    if (v->type == WV_UINT)
        return fail_field(d, MOEQ_JOB_REJECT_OUT_OF_RANGE, "%llu is above the maximum %lld", (unsigned long long)v->u,
                          (long long)max);
    if (v->type != WV_INT) return wrong_type(d, v, "an integer");
    if (v->i < min)
        return fail_field(d, MOEQ_JOB_REJECT_OUT_OF_RANGE, "%lld is below the minimum %lld", (long long)v->i,
                          (long long)min);
    if (v->i > max)
        return fail_field(d, MOEQ_JOB_REJECT_OUT_OF_RANGE, "%lld is above the maximum %lld", (long long)v->i,
                          (long long)max);
    *out = v->i;
    return 0;
}

/* A finite number in [min, max] (or (min, max] when min_open); integers are accepted. */
static int want_num(dec *d, const wval *v, double min, int min_open, double max, double *out) {
    double x;
    if (v->type == WV_INT) x = (double)v->i;
    else if (v->type == WV_UINT) x = (double)v->u;
    else if (v->type == WV_FLOAT) x = v->f;
    else return wrong_type(d, v, "a number");
    if (!isfinite(x)) return fail_field(d, MOEQ_JOB_REJECT_OUT_OF_RANGE, "%g is not a finite number", x);
    if (x < min || (min_open && x == min) || x > max)
        return fail_field(d, MOEQ_JOB_REJECT_OUT_OF_RANGE, "%g is outside %s%g, %g]", x, min_open ? "(" : "[", min,
                          max);
    *out = x;
    return 0;
}

/* A string of 1..max bytes, copied. Length is checked before copying. */
static int want_str(dec *d, const wval *v, int64_t max, char **out, size_t *len) {
    if (v->type != WV_STR) return wrong_type(d, v, "a string");
    if (v->dec_len > (uint64_t)max)
        return fail_field(d, MOEQ_JOB_REJECT_TOO_LARGE, "%zu bytes exceeds the limit %lld", v->dec_len, (long long)max);
    if (v->dec_len == 0) return fail_field(d, MOEQ_JOB_REJECT_INVALID_VALUE, "must not be empty");
    *out = wrd_strdup(&d->r, v);
    if (!*out) return -1;
    if (len) *len = v->dec_len;
    return 0;
}

static int has_control(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return 1;
    return 0;
}

/* Grow *items (each `size` bytes) to hold n + 1, doubling, never beyond max. */
static int grow(dec *d, void **items, size_t *cap, size_t n, size_t size, int64_t max) {
    if (n < *cap) return 0;
    size_t c = *cap ? *cap * 2 : 8;
    if (c > (size_t)max) c = (size_t)max;
    void *p = realloc(*items, c * size);
    if (!p) {
        d->r.nomem = 1;
        return -1;
    }
    *items = p;
    *cap = c;
    return 0;
}

/*
 * Walk an array value at depth 2: calls each(d, i, elem) for every entry
 * after checking the count against max (declared msgpack counts are checked
 * before anything is read).
 */
typedef int (*elem_fn)(dec *d, size_t i, const wval *elem, void *ctx);

static int each_elem(dec *d, const wval *v, int64_t max, const char *name, elem_fn fn, void *ctx) {
    if (v->type != WV_ARRAY) return wrong_type(d, v, "an array");
    if (v->count > (uint64_t)max)
        return fail_field(d, MOEQ_JOB_REJECT_TOO_LARGE, "%llu entries exceeds the limit %lld",
                          (unsigned long long)v->count, (long long)max);
    witer it;
    if (wrd_iter_begin(&d->r, v, 2, &it) < 0) return -1;
    size_t i = 0;
    int more;
    while ((more = wrd_iter_next(&d->r, &it)) == 1) {
        if (i >= (size_t)max) {
            snprintf(d->r.path, sizeof d->r.path, "%s", name);
            return fail_field(d, MOEQ_JOB_REJECT_TOO_LARGE, "more than %lld entries", (long long)max);
        }
        snprintf(d->r.path, sizeof d->r.path, "%s[%zu]", name, i);
        wval elem;
        if (wrd_head(&d->r, &elem) < 0 || fn(d, i, &elem, ctx) < 0) return -1;
        i++;
    }
    snprintf(d->r.path, sizeof d->r.path, "%s", name);
    if (more < 0) return -1;
    if (i == 0) return fail_field(d, MOEQ_JOB_REJECT_INVALID_VALUE, "must not be empty");
    return 0;
}

static int set_input(dec *d, moeq_job_input input) {
    static const char *const names[] = {"", "prompt", "messages", "tokens"};
    if (d->job->input != MOEQ_JOB_INPUT_NONE)
        return fail_field(d, MOEQ_JOB_REJECT_CONFLICTING_INPUT,
                          "only one of 'prompt', 'messages', 'tokens' may be given ('%s' was given too)",
                          names[d->job->input]);
    d->job->input = input;
    return 0;
}

/* ---- one function per field ---------------------------------------------- */

static int f_id(dec *d, const wval *v) {
    moeq_job *job = d->job;
    if (want_str(d, v, d->limits->max_id_bytes, &job->id, &job->id_len) < 0) return -1;
    if (has_control(job->id)) return fail_field(d, MOEQ_JOB_REJECT_INVALID_VALUE, "control characters are not allowed");
    return 0;
}

static int f_prompt(dec *d, const wval *v) {
    if (set_input(d, MOEQ_JOB_INPUT_PROMPT) < 0) return -1;
    return want_str(d, v, d->limits->max_prompt_bytes, &d->job->prompt, &d->job->prompt_len);
}

static int tokens_elem(dec *d, size_t i, const wval *elem, void *ctx) {
    size_t *cap = ctx;
    int64_t id;
    if (want_int(d, elem, 0, INT32_MAX, &id) < 0) return -1;
    if (grow(d, (void **)&d->job->tokens, cap, i, sizeof(int32_t), d->limits->max_input_tokens) < 0) return -1;
    d->job->tokens[i] = (int32_t)id;
    d->job->n_tokens = i + 1;
    return 0;
}

static int f_tokens(dec *d, const wval *v) {
    if (set_input(d, MOEQ_JOB_INPUT_TOKENS) < 0) return -1;
    size_t cap = 0;
    return each_elem(d, v, d->limits->max_input_tokens, "tokens", tokens_elem, &cap);
}

static int stop_elem(dec *d, size_t i, const wval *elem, void *ctx) {
    size_t *cap = ctx;
    if (grow(d, (void **)&d->job->stop, cap, i, sizeof(char *), d->limits->max_stop) < 0) return -1;
    d->job->stop[i] = NULL;
    d->job->n_stop = i + 1;
    return want_str(d, elem, d->limits->max_stop_bytes, &d->job->stop[i], NULL);
}

static int f_stop(dec *d, const wval *v) {
    size_t cap = 0;
    return each_elem(d, v, d->limits->max_stop, "stop", stop_elem, &cap);
}

static int is_role(const char *role) {
    return !strcmp(role, "system") || !strcmp(role, "user") || !strcmp(role, "assistant") || !strcmp(role, "tool");
}

/* One message map at depth 3: role and content required, other keys ignored. */
static int message_fields(dec *d, const wval *v, moeq_job_message *m, size_t *prompt_bytes) {
    char base[64];
    snprintf(base, sizeof base, "%s", d->r.path);
    witer it;
    if (wrd_iter_begin(&d->r, v, 3, &it) < 0) return -1;
    int more;
    while ((more = wrd_iter_next(&d->r, &it)) == 1) {
        wval key, val;
        if (wrd_key(&d->r, &key) < 0) return -1;
        int is_role_key = wval_str_is(&key, "role"), is_content = wval_str_is(&key, "content");
        snprintf(d->r.path, sizeof d->r.path, "%.52s.%s", base, is_role_key ? "role" : is_content ? "content" : "?");
        if (key.type != WV_STR) return fail_field(d, MOEQ_JOB_REJECT_WRONG_TYPE, "message keys must be strings");
        if (wrd_head(&d->r, &val) < 0) return -1;
        if ((is_role_key && m->role) || (is_content && m->content))
            return fail_field(d, MOEQ_JOB_REJECT_DUPLICATE_KEY, "given twice");
        if (val.type == WV_NIL || (!is_role_key && !is_content)) {
            if (wrd_skip(&d->r, &val, 4) < 0) return -1;
        } else if (is_role_key) {
            if (want_str(d, &val, d->limits->max_string_bytes, &m->role, NULL) < 0) return -1;
            if (!is_role(m->role))
                return fail_field(d, MOEQ_JOB_REJECT_INVALID_VALUE, "'%s' is not one of system, user, assistant, tool",
                                  m->role);
        } else {
            if (val.type == WV_STR && val.dec_len == 0) { /* an empty turn is fine */
                m->content = wrd_strdup(&d->r, &val);
                if (!m->content) return -1;
            } else if (want_str(d, &val, d->limits->max_prompt_bytes, &m->content, &m->content_len) < 0) {
                return -1;
            }
            *prompt_bytes += m->content_len;
            if (*prompt_bytes > (size_t)d->limits->max_prompt_bytes)
                return fail_field(d, MOEQ_JOB_REJECT_TOO_LARGE, "messages' content totals more than %lld bytes",
                                  (long long)d->limits->max_prompt_bytes);
        }
    }
    snprintf(d->r.path, sizeof d->r.path, "%s", base);
    if (more < 0) return -1;
    if (!m->role) return fail_field(d, MOEQ_JOB_REJECT_MISSING_FIELD, "'role' is required");
    if (!m->content) return fail_field(d, MOEQ_JOB_REJECT_MISSING_FIELD, "'content' is required");
    return 0;
}

typedef struct msg_ctx {
    size_t cap;
    size_t prompt_bytes;
} msg_ctx;

static int messages_elem(dec *d, size_t i, const wval *elem, void *ctx) {
    msg_ctx *c = ctx;
    if (elem->type != WV_MAP) return wrong_type(d, elem, "a map");
    if (grow(d, (void **)&d->job->messages, &c->cap, i, sizeof(moeq_job_message), d->limits->max_messages) < 0)
        return -1;
    memset(&d->job->messages[i], 0, sizeof d->job->messages[i]);
    d->job->n_messages = i + 1;
    return message_fields(d, elem, &d->job->messages[i], &c->prompt_bytes);
}

static int f_messages(dec *d, const wval *v) {
    if (set_input(d, MOEQ_JOB_INPUT_MESSAGES) < 0) return -1;
    msg_ctx c = {0, 0};
    return each_elem(d, v, d->limits->max_messages, "messages", messages_elem, &c);
}

static int f_reply_to(dec *d, const wval *v) {
    int64_t max = d->limits->max_string_bytes < 249 ? d->limits->max_string_bytes : 249; /* Kafka's topic limit */
    if (want_str(d, v, max, &d->job->reply_to, NULL) < 0) return -1;
    const char *t = d->job->reply_to;
    if (!strcmp(t, ".") || !strcmp(t, "..") || strspn(t, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                         "0123456789._-") != strlen(t))
        return fail_field(d, MOEQ_JOB_REJECT_INVALID_VALUE, "'%s' is not a Kafka topic name (letters, digits, . _ -)",
                          t);
    return 0;
}

static int f_metadata(dec *d, const wval *v) {
    if (v->type != WV_MAP) return wrong_type(d, v, "a map");
    if (wrd_skip(&d->r, v, 2) < 0) return -1;
    size_t n = (size_t)(d->r.p - v->start);
    if (n > (size_t)d->limits->max_metadata_bytes)
        return fail_field(d, MOEQ_JOB_REJECT_TOO_LARGE, "%zu encoded bytes exceeds the limit %lld", n,
                          (long long)d->limits->max_metadata_bytes);
    d->job->metadata = malloc(n);
    if (!d->job->metadata) {
        d->r.nomem = 1;
        return -1;
    }
    memcpy(d->job->metadata, v->start, n);
    d->job->metadata_len = n;
    return 0;
}


/* ---- structured output (response_format) and decoding controls ----------- */

static int stop_token_elem(dec *d, size_t i, const wval *elem, void *ctx) {
    size_t *cap = ctx;
    int64_t id;
    if (want_int(d, elem, 0, INT32_MAX, &id) < 0) return -1;
    if (grow(d, (void **)&d->job->stop_token_ids, cap, i, sizeof(int32_t), d->limits->max_stop_token_ids) < 0)
        return -1;
    d->job->stop_token_ids[i] = (int32_t)id;
    d->job->n_stop_token_ids = i + 1;
    return 0;
}

static int f_stop_token_ids(dec *d, const wval *v) {
    size_t cap = 0;
    return each_elem(d, v, d->limits->max_stop_token_ids, "stop_token_ids", stop_token_elem, &cap);
}

static int choice_elem(dec *d, size_t i, const wval *elem, void *ctx) {
    size_t *cap = ctx;
    moeq_response_format *rf = &d->job->response_format;
    if (grow(d, (void **)&rf->choices, cap, i, sizeof(char *), d->limits->max_choices) < 0) return -1;
    rf->choices[i] = NULL;
    rf->n_choices = i + 1;
    return want_str(d, elem, d->limits->max_choice_bytes, &rf->choices[i], NULL);
}

/* The schema value (any JSON value; a map in practice) kept as JSON text: msgpack is transcoded, JSON copied. */
static int rf_schema(dec *d, const wval *v) {
    moeq_response_format *rf = &d->job->response_format;
    if (v->type != WV_MAP && v->type != WV_BOOL) return wrong_type(d, v, "a map (a JSON Schema)");
    if (wrd_skip(&d->r, v, 4) < 0) return -1;
    size_t n = (size_t)(d->r.p - v->start);
    if (n > (size_t)d->limits->max_schema_bytes)
        return fail_field(d, MOEQ_JOB_REJECT_TOO_LARGE, "%zu encoded bytes exceeds the limit %lld", n,
                          (long long)d->limits->max_schema_bytes);
    moeq_buf buf = {0};
    ww w;
    wrd r2;
    ww_init(&w, &buf, MOEQ_WIRE_JSON);
    if (ww_value_from(&w, v->start, n, d->r.fmt, (int)d->limits->max_depth, &r2) < 0 || w.err != MOEQ_OK) {
        moeq_buf_free(&buf);
        if (w.err == MOEQ_ERR_NOMEM) return d->r.nomem = 1, -1;
        return fail_field(d, MOEQ_JOB_REJECT_WRONG_TYPE, "not expressible as JSON (%s)", r2.msg);
    }
    rf->schema = (char *)buf.data;
    rf->schema_len = buf.len;
    return 0;
}

/* json_schema: {name, schema, strict}; schema required, other keys ignored. */
static int rf_json_schema(dec *d, const wval *v) {
    moeq_response_format *rf = &d->job->response_format;
    if (v->type != WV_MAP) return wrong_type(d, v, "a map");
    witer it;
    if (wrd_iter_begin(&d->r, v, 3, &it) < 0) return -1;
    int more;
    while ((more = wrd_iter_next(&d->r, &it)) == 1) {
        wval key, val;
        if (wrd_key(&d->r, &key) < 0 || wrd_head(&d->r, &val) < 0) return -1;
        int is_name = wval_str_is(&key, "name"), is_schema = wval_str_is(&key, "schema"),
            is_strict = wval_str_is(&key, "strict");
        snprintf(d->r.path, sizeof d->r.path, "response_format.json_schema.%s",
                 is_name ? "name" : is_schema ? "schema" : is_strict ? "strict" : "?");
        if ((is_name && rf->name) || (is_schema && rf->schema))
            return fail_field(d, MOEQ_JOB_REJECT_DUPLICATE_KEY, "given twice");
        if (val.type == WV_NIL || (!is_name && !is_schema && !is_strict)) {
            if (wrd_skip(&d->r, &val, 4) < 0) return -1;
        } else if (is_name) {
            if (want_str(d, &val, d->limits->max_string_bytes, &rf->name, NULL) < 0) return -1;
        } else if (is_strict) {
            if (val.type != WV_BOOL) return wrong_type(d, &val, "a boolean");
            rf->strict = val.b;
        } else if (rf_schema(d, &val) < 0) {
            return -1;
        }
    }
    snprintf(d->r.path, sizeof d->r.path, "response_format.json_schema");
    if (more < 0) return -1;
    if (!rf->schema) return fail_field(d, MOEQ_JOB_REJECT_MISSING_FIELD, "'schema' is required");
    return 0;
}

static int rf_type(dec *d, const wval *v, moeq_response_type *type) {
    static const char *const names[] = {"text", "json_object", "json_schema", "regex", "choice"};
    if (v->type != WV_STR) return wrong_type(d, v, "a string");
    for (int t = 0; t < 5; t++)
        if (wval_str_is(v, names[t])) return *type = (moeq_response_type)t, 0;
    return fail_field(d, MOEQ_JOB_REJECT_INVALID_VALUE, "not one of text, json_object, json_schema, regex, choice");
}

/* One response_format entry at depth 3 (the map is level 2). */
static int rf_entry(dec *d, const wval *key, const wval *val, int *has_type, moeq_response_type *type) {
    moeq_response_format *rf = &d->job->response_format;
    size_t cap = 0;
    if (wval_str_is(key, "type")) {
        snprintf(d->r.path, sizeof d->r.path, "response_format.type");
        if (*has_type) return fail_field(d, MOEQ_JOB_REJECT_DUPLICATE_KEY, "given twice");
        *has_type = 1;
        return rf_type(d, val, type);
    }
    if (wval_str_is(key, "json_schema")) {
        snprintf(d->r.path, sizeof d->r.path, "response_format.json_schema");
        if (rf->schema) return fail_field(d, MOEQ_JOB_REJECT_DUPLICATE_KEY, "given twice");
        return rf_json_schema(d, val);
    }
    if (wval_str_is(key, "pattern")) {
        snprintf(d->r.path, sizeof d->r.path, "response_format.pattern");
        if (rf->pattern) return fail_field(d, MOEQ_JOB_REJECT_DUPLICATE_KEY, "given twice");
        return want_str(d, val, d->limits->max_pattern_bytes, &rf->pattern, NULL);
    }
    if (wval_str_is(key, "choices")) {
        snprintf(d->r.path, sizeof d->r.path, "response_format.choices");
        if (rf->choices) return fail_field(d, MOEQ_JOB_REJECT_DUPLICATE_KEY, "given twice");
        return each_elem(d, val, d->limits->max_choices, "response_format.choices", choice_elem, &cap);
    }
    return wrd_skip(&d->r, val, 3); /* unknown keys are ignored, as in the job map */
}

static int f_response_format(dec *d, const wval *v) {
    moeq_response_format *rf = &d->job->response_format;
    if (v->type != WV_MAP) return wrong_type(d, v, "a map");
    witer it;
    if (wrd_iter_begin(&d->r, v, 2, &it) < 0) return -1;
    int more, has_type = 0;
    moeq_response_type type = MOEQ_RESPONSE_TEXT;
    while ((more = wrd_iter_next(&d->r, &it)) == 1) {
        wval key, val;
        if (wrd_key(&d->r, &key) < 0 || wrd_head(&d->r, &val) < 0) return -1;
        if (key.type != WV_STR) return fail_field(d, MOEQ_JOB_REJECT_WRONG_TYPE, "keys must be strings");
        if (val.type == WV_NIL) {
            if (wrd_skip(&d->r, &val, 3) < 0) return -1;
        } else if (rf_entry(d, &key, &val, &has_type, &type) < 0) {
            return -1;
        }
    }
    snprintf(d->r.path, sizeof d->r.path, "response_format");
    if (more < 0) return -1;
    if (!has_type) return fail_field(d, MOEQ_JOB_REJECT_MISSING_FIELD, "'type' is required");
    rf->type = type;
    if (type == MOEQ_RESPONSE_JSON_SCHEMA && !rf->schema)
        return fail_field(d, MOEQ_JOB_REJECT_MISSING_FIELD, "type json_schema needs 'json_schema'");
    if (type == MOEQ_RESPONSE_REGEX && !rf->pattern)
        return fail_field(d, MOEQ_JOB_REJECT_MISSING_FIELD, "type regex needs 'pattern'");
    if (type == MOEQ_RESPONSE_CHOICE && !rf->choices)
        return fail_field(d, MOEQ_JOB_REJECT_MISSING_FIELD, "type choice needs 'choices'");
    return 0;
}

static int f_logprobs(dec *d, const wval *v) {
    if (v->type != WV_BOOL) return wrong_type(d, v, "a boolean");
    d->job->logprobs = v->b;
    return 0;
}

/* Decode one known field whose value head is in v. Containers are consumed by their decoder. */
static int decode_field(dec *d, field f, const wval *v) {
    moeq_job *job = d->job;
    const moeq_job_limits *lim = d->limits;
    int64_t i;
    switch (f) {
    case F_V: return 0; /* checked before pass 2 */
    case F_ID: return f_id(d, v);
    case F_PRIORITY:
        if (want_int(d, v, 0, 3, &i) < 0) return -1;
        job->priority = (int)i;
        return 0;
    case F_PROMPT: return f_prompt(d, v);
    case F_MESSAGES: return f_messages(d, v);
    case F_TOKENS: return f_tokens(d, v);
    case F_MAX_NEW_TOKENS:
        if (v->type == WV_INT && v->i > lim->max_new_tokens)
            return fail_field(d, MOEQ_JOB_REJECT_OUT_OF_RANGE, "%lld exceeds the cap %lld", (long long)v->i,
                              (long long)lim->max_new_tokens);
        if (want_int(d, v, 1, lim->max_new_tokens, &i) < 0) return -1;
        job->max_new_tokens = (int32_t)i;
        return 0;
    case F_TEMPERATURE: return want_num(d, v, 0, 0, 2, &job->temperature);
    case F_TOP_P: return want_num(d, v, 0, 1, 1, &job->top_p);
    case F_TOP_K:
        if (want_int(d, v, 0, INT32_MAX, &i) < 0) return -1;
        job->top_k = (int32_t)i;
        return 0;
    case F_SEED:
        if (v->type == WV_UINT) job->seed = v->u;
        else if (want_int(d, v, 0, INT64_MAX, &i) < 0) return -1;
        else job->seed = (uint64_t)i;
        job->has_seed = 1;
        return 0;
    case F_STOP: return f_stop(d, v);
    case F_DEADLINE_MS: return want_int(d, v, 0, INT64_MAX, &job->deadline_ms);
    case F_REPLY_TO: return f_reply_to(d, v);
    case F_MTP:
        if (v->type != WV_BOOL) return wrong_type(d, v, "a boolean");
        job->mtp = v->b;
        return 0;
    case F_METADATA: return f_metadata(d, v);
    case F_RESPONSE_FORMAT: return f_response_format(d, v);
    case F_LOGPROBS: return f_logprobs(d, v);
    case F_TOP_LOGPROBS:
        if (want_int(d, v, 0, MOEQ_JOB_MAX_TOP_LOGPROBS, &i) < 0) return -1;
        job->top_logprobs = (int)i;
        return 0;
    case F_STOP_TOKEN_IDS: return f_stop_token_ids(d, v);
    case F_MIN_TOKENS:
        if (want_int(d, v, 0, lim->max_new_tokens, &i) < 0) return -1;
        job->min_tokens = (int32_t)i;
        return 0;
    case F_REPETITION_PENALTY: return want_num(d, v, 0, 1, 2, &job->repetition_penalty);
    case F_PRESENCE_PENALTY: return want_num(d, v, -2, 0, 2, &job->presence_penalty);
    case F_FREQUENCY_PENALTY: return want_num(d, v, -2, 0, 2, &job->frequency_penalty);
    case F__COUNT: break;
    }
    return wrd_fail(&d->r, MOEQ_JOB_REJECT_MALFORMED, "internal: unknown field %d", (int)f);
}

/* ---- the two passes ------------------------------------------------------ */

/* Remember the id for the reject when it is one we could publish a result for. */
static void scan_id(dec *d, const wval *v) {
    if (v->type != WV_STR || v->dec_len == 0 || v->dec_len > (uint64_t)d->limits->max_id_bytes) return;
    wval_str_copy(v, d->id);
    d->has_id = !has_control(d->id);
}

static int scan(dec *d) {
    wrd *r = &d->r;
    wval top, key, v;
    if (wrd_head(r, &top) < 0) return -1;
    if (top.type != WV_MAP) {
        wrd_skip(r, &top, 1);
        return wrd_fail(r, MOEQ_JOB_REJECT_NOT_A_MAP, "the job is %s, not a map", wval_type_name(&top));
    }
    witer it;
    if (wrd_iter_begin(r, &top, 1, &it) < 0) return -1;
    unsigned seen = 0;
    int more;
    while ((more = wrd_iter_next(r, &it)) == 1) {
        if (wrd_key(r, &key) < 0) return -1;
        if (key.type != WV_STR)
            return wrd_fail(r, MOEQ_JOB_REJECT_WRONG_TYPE, "a job key is %s; keys must be strings",
                            wval_type_name(&key));
        path_from_key(r, &key);
        int f = field_of(&key);
        if (f >= 0 && (seen & (1u << f)))
            return wrd_fail(r, MOEQ_JOB_REJECT_DUPLICATE_KEY, "field '%s': given twice", field_names[f]);
        if (f >= 0) seen |= 1u << f;
        if (wrd_head(r, &v) < 0) return -1;
        if (f == F_V && v.type != WV_NIL) {
            d->has_v = 1;
            d->v = v;
        }
        if (f == F_ID) scan_id(d, &v);
        if (wrd_skip(r, &v, 2) < 0) return -1;
        r->path[0] = 0; /* between entries no field is at fault */
    }
    r->path[0] = 0;
    if (more < 0) return -1;
    return wrd_finish(r);
}

static int check_version(dec *d) {
    wrd *r = &d->r;
    snprintf(r->path, sizeof r->path, "v");
    if (!d->has_v) return fail_field(d, MOEQ_JOB_REJECT_MISSING_FIELD, "required (the format version, 1)");
    if (d->v.type == WV_UINT)
        return fail_field(d, MOEQ_JOB_REJECT_UNSUPPORTED_VERSION, "version %llu is not supported (expected 1)",
                          (unsigned long long)d->v.u);
    if (d->v.type != WV_INT) return wrong_type(d, &d->v, "an integer");
    if (d->v.i != MOEQ_JOB_VERSION)
        return fail_field(d, MOEQ_JOB_REJECT_UNSUPPORTED_VERSION, "version %lld is not supported (expected 1)",
                          (long long)d->v.i);
    return 0;
}

static int fields(dec *d) {
    wrd *r = &d->r;
    wval top, key, v;
    witer it;
    if (wrd_head(r, &top) < 0 || wrd_iter_begin(r, &top, 1, &it) < 0) return -1;
    int more;
    while ((more = wrd_iter_next(r, &it)) == 1) {
        if (wrd_key(r, &key) < 0) return -1;
        path_from_key(r, &key);
        int f = field_of(&key);
        if (wrd_head(r, &v) < 0) return -1;
        if (f < 0 || v.type == WV_NIL) { /* unknown fields are skipped; null means absent */
            if (wrd_skip(r, &v, 2) < 0) return -1;
        } else if (decode_field(d, (field)f, &v) < 0) {
            return -1;
        }
        r->path[0] = 0;
    }
    if (more < 0) return -1;
    r->path[0] = 0;
    if (!d->job->id) {
        snprintf(r->path, sizeof r->path, "id");
        return fail_field(d, MOEQ_JOB_REJECT_MISSING_FIELD, "required");
    }
    if (d->job->input == MOEQ_JOB_INPUT_NONE)
        return wrd_fail(r, MOEQ_JOB_REJECT_MISSING_FIELD, "one of 'prompt', 'messages', 'tokens' is required");
    if (d->job->top_logprobs > 0 && !d->job->logprobs) {
        snprintf(r->path, sizeof r->path, "top_logprobs");
        return fail_field(d, MOEQ_JOB_REJECT_INVALID_VALUE, "needs 'logprobs': true (as OpenAI's API)");
    }
    if (d->job->min_tokens > d->job->max_new_tokens) {
        snprintf(r->path, sizeof r->path, "min_tokens");
        return fail_field(d, MOEQ_JOB_REJECT_OUT_OF_RANGE, "%d is above max_new_tokens %d", (int)d->job->min_tokens,
                          (int)d->job->max_new_tokens);
    }
    return 0;
}

static void job_defaults(moeq_job *job, const moeq_job_limits *limits, moeq_wire_format fmt) {
    memset(job, 0, sizeof *job);
    job->version = MOEQ_JOB_VERSION;
    job->format = fmt;
    job->priority = MOEQ_JOB_DEFAULT_PRIORITY;
    job->max_new_tokens = (int32_t)(limits->max_new_tokens < MOEQ_JOB_DEFAULT_MAX_NEW_TOKENS
                                        ? limits->max_new_tokens
                                        : MOEQ_JOB_DEFAULT_MAX_NEW_TOKENS);
    job->temperature = MOEQ_JOB_DEFAULT_TEMPERATURE;
    job->top_p = MOEQ_JOB_DEFAULT_TOP_P;
    job->top_k = MOEQ_JOB_DEFAULT_TOP_K;
    job->mtp = 1;
    job->repetition_penalty = 1.0;
}

static moeq_err finish_reject(dec *d, moeq_job_reject *reject) {
    moeq_job_free(d->job);
    if (d->r.nomem) return MOEQ_ERR_NOMEM;
    if (reject) {
        reject->code = d->r.code;
        snprintf(reject->field, sizeof reject->field, "%s", d->r.path);
        snprintf(reject->message, sizeof reject->message, "%s", d->r.msg);
        reject->has_id = d->has_id;
        if (d->has_id) memcpy(reject->id, d->id, sizeof reject->id);
    }
    return moeq_job_reject_err(d->r.code);
}

moeq_err moeq_job_decode(const void *bytes, size_t len, const char *content_type, const moeq_job_limits *limits,
                         moeq_job *job, moeq_job_reject *reject) {
    if (reject) memset(reject, 0, sizeof *reject);
    if (job) memset(job, 0, sizeof *job);
    moeq_job_limits defaults = moeq_job_default_limits();
    if (!limits) limits = &defaults;
    if ((!bytes && len) || !job || moeq_job_limits_check(limits, NULL, 0) != MOEQ_OK) return MOEQ_ERR_INVALID_ARG;

    dec *d = calloc(1, sizeof *d);
    if (!d) return MOEQ_ERR_NOMEM;
    d->limits = limits;
    d->job = job;
    moeq_wire_format fmt = moeq_wire_detect(bytes, len, content_type);
    if (reject) reject->format = fmt;
    wrd_init(&d->r, bytes, len, fmt, (int)limits->max_depth);

    if (len > (uint64_t)limits->max_job_bytes)
        wrd_fail(&d->r, MOEQ_JOB_REJECT_TOO_LARGE, "the job is %zu bytes, over the limit %lld", len,
                 (long long)limits->max_job_bytes);
    else if (len == 0) wrd_fail(&d->r, MOEQ_JOB_REJECT_MALFORMED, "the job is empty");
    else if (fmt == MOEQ_WIRE_UNKNOWN)
        wrd_fail(&d->r, MOEQ_JOB_REJECT_MALFORMED, "neither a msgpack map nor a JSON object (first byte 0x%02x)",
                 ((const uint8_t *)bytes)[0]);
    else if (scan(d) == 0 && check_version(d) == 0) {
        job_defaults(job, limits, fmt);
        wrd_init(&d->r, bytes, len, fmt, (int)limits->max_depth);
        fields(d);
    }
    moeq_err err = MOEQ_OK;
    if (d->r.code != MOEQ_JOB_REJECT_NONE || d->r.nomem) err = finish_reject(d, reject);
    free(d);
    return err;
}

void moeq_job_free(moeq_job *job) {
    if (!job) return;
    free(job->id);
    free(job->prompt);
    for (size_t i = 0; job->messages && i < job->n_messages; i++) {
        free(job->messages[i].role);
        free(job->messages[i].content);
    }
    free(job->messages);
    free(job->tokens);
    for (size_t i = 0; job->stop && i < job->n_stop; i++) free(job->stop[i]);
    free(job->stop);
    free(job->reply_to);
    free(job->metadata);
    moeq_response_format *rf = &job->response_format;
    free(rf->name);
    free(rf->schema);
    free(rf->pattern);
    for (size_t i = 0; rf->choices && i < rf->n_choices; i++) free(rf->choices[i]);
    free(rf->choices);
    free(job->stop_token_ids);
    memset(job, 0, sizeof *job);
}

/* ---- encode -------------------------------------------------------------- */

static void encode_input(ww *w, const moeq_job *job) {
    if (job->input == MOEQ_JOB_INPUT_PROMPT) {
        ww_key(w, "prompt");
        ww_str(w, job->prompt, job->prompt_len);
    } else if (job->input == MOEQ_JOB_INPUT_MESSAGES) {
        ww_key(w, "messages");
        ww_array(w, (uint32_t)job->n_messages);
        for (size_t i = 0; i < job->n_messages; i++) {
            ww_map(w, 2);
            ww_key(w, "role");
            ww_str(w, job->messages[i].role, strlen(job->messages[i].role));
            ww_key(w, "content");
            ww_str(w, job->messages[i].content, job->messages[i].content_len);
            ww_end_map(w);
        }
        ww_end_array(w);
    } else {
        ww_key(w, "tokens");
        ww_array(w, (uint32_t)job->n_tokens);
        for (size_t i = 0; i < job->n_tokens; i++) ww_int(w, job->tokens[i]);
        ww_end_array(w);
    }
}

static void encode_response_format(ww *w, const moeq_response_format *rf) {
    static const char *const names[] = {"text", "json_object", "json_schema", "regex", "choice"};
    uint32_t n = 1 + (rf->type == MOEQ_RESPONSE_JSON_SCHEMA || rf->type == MOEQ_RESPONSE_REGEX ||
                      rf->type == MOEQ_RESPONSE_CHOICE);
    ww_key(w, "response_format");
    ww_map(w, n);
    ww_key(w, "type"), ww_str(w, names[rf->type], strlen(names[rf->type]));
    if (rf->type == MOEQ_RESPONSE_JSON_SCHEMA) {
        ww_key(w, "json_schema");
        ww_map(w, 2 + (rf->name != NULL));
        if (rf->name) ww_key(w, "name"), ww_str(w, rf->name, strlen(rf->name));
        ww_key(w, "schema");
        wrd r;
        if (ww_value_from(w, rf->schema, rf->schema_len, MOEQ_WIRE_JSON, MOEQ_JOB_DEPTH_HARD_MAX, &r) < 0)
            w->err = MOEQ_ERR_INVALID_ARG;
        ww_key(w, "strict"), ww_bool(w, rf->strict);
        ww_end_map(w);
    } else if (rf->type == MOEQ_RESPONSE_REGEX) {
        ww_key(w, "pattern"), ww_str(w, rf->pattern, strlen(rf->pattern));
    } else if (rf->type == MOEQ_RESPONSE_CHOICE) {
        ww_key(w, "choices");
        ww_array(w, (uint32_t)rf->n_choices);
        for (size_t i = 0; i < rf->n_choices; i++) ww_str(w, rf->choices[i], strlen(rf->choices[i]));
        ww_end_array(w);
    }
    ww_end_map(w);
}

/* 0 (a zeroed job built in C) means unset, as 1 does. */
static int has_repetition(const moeq_job *job) { return job->repetition_penalty != 1.0 && job->repetition_penalty != 0.0; }

/* The structured-output and decoding-control fields, each only when set (a v1 job without them is unchanged). */
static uint32_t count_controls(const moeq_job *job) {
    return (uint32_t)(job->response_format.type != MOEQ_RESPONSE_TEXT) + (uint32_t)(job->logprobs != 0) +
           (uint32_t)(job->top_logprobs != 0) + (uint32_t)(job->n_stop_token_ids > 0) +
           (uint32_t)(job->min_tokens != 0) + (uint32_t)has_repetition(job) +
           (uint32_t)(job->presence_penalty != 0.0) + (uint32_t)(job->frequency_penalty != 0.0);
}

static void encode_controls(ww *w, const moeq_job *job) {
    if (job->response_format.type != MOEQ_RESPONSE_TEXT) encode_response_format(w, &job->response_format);
    if (job->logprobs) ww_key(w, "logprobs"), ww_bool(w, 1);
    if (job->top_logprobs) ww_key(w, "top_logprobs"), ww_int(w, job->top_logprobs);
    if (job->n_stop_token_ids) {
        ww_key(w, "stop_token_ids");
        ww_array(w, (uint32_t)job->n_stop_token_ids);
        for (size_t i = 0; i < job->n_stop_token_ids; i++) ww_int(w, job->stop_token_ids[i]);
        ww_end_array(w);
    }
    if (job->min_tokens) ww_key(w, "min_tokens"), ww_int(w, job->min_tokens);
    if (has_repetition(job)) ww_key(w, "repetition_penalty"), ww_double(w, job->repetition_penalty);
    if (job->presence_penalty != 0.0) ww_key(w, "presence_penalty"), ww_double(w, job->presence_penalty);
    if (job->frequency_penalty != 0.0) ww_key(w, "frequency_penalty"), ww_double(w, job->frequency_penalty);
}

moeq_err moeq_job_encode(const moeq_job *job, moeq_wire_format format, moeq_buf *out) {
    if (!job || !job->id || !out || (format != MOEQ_WIRE_MSGPACK && format != MOEQ_WIRE_JSON)) return MOEQ_ERR_INVALID_ARG;
    if (job->input < MOEQ_JOB_INPUT_PROMPT || job->input > MOEQ_JOB_INPUT_TOKENS) return MOEQ_ERR_INVALID_ARG;
    if (job->metadata && job->format != format) return MOEQ_ERR_INVALID_ARG;
    int has[6] = {
        job->priority != MOEQ_JOB_DEFAULT_PRIORITY, job->top_k != MOEQ_JOB_DEFAULT_TOP_K, job->has_seed,
        job->n_stop > 0, job->deadline_ms != 0, job->reply_to != NULL,
    };
    /* always: v id <input> max_new_tokens temperature top_p mtp */
    uint32_t n = 7 + (uint32_t)(job->metadata != NULL) + count_controls(job);
    for (int i = 0; i < 6; i++) n += (uint32_t)has[i];
    size_t len0 = out->len;
    ww w;
    ww_init(&w, out, format);
    ww_map(&w, n);
    ww_key(&w, "v"), ww_int(&w, MOEQ_JOB_VERSION);
    ww_key(&w, "id"), ww_str(&w, job->id, strlen(job->id));
    if (has[0]) ww_key(&w, "priority"), ww_int(&w, job->priority);
    encode_input(&w, job);
    ww_key(&w, "max_new_tokens"), ww_int(&w, job->max_new_tokens);
    ww_key(&w, "temperature"), ww_double(&w, job->temperature);
    ww_key(&w, "top_p"), ww_double(&w, job->top_p);
    if (has[1]) ww_key(&w, "top_k"), ww_int(&w, job->top_k);
    if (has[2]) ww_key(&w, "seed"), ww_uint(&w, job->seed);
    if (has[3]) {
        ww_key(&w, "stop");
        ww_array(&w, (uint32_t)job->n_stop);
        for (size_t i = 0; i < job->n_stop; i++) ww_str(&w, job->stop[i], strlen(job->stop[i]));
        ww_end_array(&w);
    }
    if (has[4]) ww_key(&w, "deadline_ms"), ww_int(&w, job->deadline_ms);
    if (has[5]) ww_key(&w, "reply_to"), ww_str(&w, job->reply_to, strlen(job->reply_to));
    ww_key(&w, "mtp"), ww_bool(&w, job->mtp);
    encode_controls(&w, job);
    if (job->metadata) ww_key(&w, "metadata"), ww_raw(&w, job->metadata, job->metadata_len);
    ww_end_map(&w);
    if (w.err != MOEQ_OK) {
        out->len = len0;
        if (out->data) out->data[len0] = 0;
    }
    return w.err;
}
