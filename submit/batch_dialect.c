/*
 * batch_dialect.c — moeq and OpenAI Batch lines for `moeq submit` (see
 * batch_dialect.h; the mapping is documented in schemas/openai_batch.md).
 *
 * An OpenAI line is read with cJSON and rewritten as a moeq job, which the
 * job decoder then judges with the configured limits: one validator for both
 * dialects, its field names translated back to the OpenAI ones. Output is
 * written by hand, not with cJSON, because result text may hold U+0000.
 */
#include "batch_dialect.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *moeq_dialect_name(moeq_dialect dialect) { return dialect == MOEQ_DIALECT_OPENAI ? "openai" : "moeq"; }

moeq_dialect moeq_dialect_detect(const char *line, size_t len) {
    cJSON *root = cJSON_ParseWithLength(line, len);
    int openai = cJSON_IsObject(root) && (cJSON_GetObjectItemCaseSensitive(root, "custom_id") ||
                                          cJSON_GetObjectItemCaseSensitive(root, "url") ||
                                          cJSON_GetObjectItemCaseSensitive(root, "body"));
    cJSON_Delete(root);
    return openai ? MOEQ_DIALECT_OPENAI : MOEQ_DIALECT_MOEQ;
}

void moeq_submit_line_free(moeq_submit_line *line) {
    if (!line) return;
    free(line->id);
    free(line->job);
    free(line->model);
    memset(line, 0, sizeof *line);
}

/* ---- a JSON writer that stops at the first failed append ------------------------- */

typedef struct jw {
    moeq_buf *b;
    moeq_err e;
} jw;

static void jw_raw(jw *w, const char *s, size_t n) {
    if (!w->e) w->e = moeq_buf_append(w->b, s, n);
}
static void jw_put(jw *w, const char *s) { jw_raw(w, s, strlen(s)); }

static void jw_fmt(jw *w, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) jw_raw(w, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string of len bytes (copied as they are but for quotes, backslashes and controls). */
static void jw_strn(jw *w, const char *s, size_t len) {
    jw_raw(w, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7f) continue;
        jw_raw(w, s + run, i - run);
        run = i + 1;
        if (c == '"') jw_put(w, "\\\"");
        else if (c == '\\') jw_put(w, "\\\\");
        else if (c == '\n') jw_put(w, "\\n");
        else if (c == '\t') jw_put(w, "\\t");
        else if (c == '\r') jw_put(w, "\\r");
        else jw_fmt(w, "\\u%04x", c);
    }
    jw_raw(w, s + run, len - run);
    jw_raw(w, "\"", 1);
}
static void jw_str(jw *w, const char *s) {
    if (s) jw_strn(w, s, strlen(s));
    else jw_put(w, "null");
}

/* Shortest of %.15g / %.17g that reads back as the same double. */
static void jw_num(jw *w, double v) {
    char tmp[40];
    snprintf(tmp, sizeof tmp, "%.15g", v);
    if (strtod(tmp, NULL) != v) snprintf(tmp, sizeof tmp, "%.17g", v);
    jw_put(w, tmp);
}

/* ---- OpenAI line -> moeq job ---------------------------------------------------------- */

typedef struct oa {
    moeq_submit_line *out;
    jw w;
    const char *max_key; /* which of max_tokens / max_completion_tokens the body used */
} oa;

static moeq_err oa_fail(moeq_submit_line *o, const char *param, const char *fmt, ...) {
    snprintf(o->code, sizeof o->code, "invalid_request");
    snprintf(o->param, sizeof o->param, "%s", param);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->message, sizeof o->message, fmt, ap);
    va_end(ap);
    return MOEQ_ERR_INVALID_ARG;
}

#define MAX_EXACT_INT 9007199254740992.0 /* 2^53: a JSON number cJSON holds exactly */

static int is_int(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble) &&
           v->valuedouble >= lo && v->valuedouble <= hi;
}

/* A value only accepted as its default (n = 1, stream = false, ...): anything else moeq cannot honour. */
static int default_only(const cJSON *v, const char *key) {
    if (!strcmp(key, "n") || !strcmp(key, "best_of")) return is_int(v, 1, 1);
    return cJSON_IsFalse(v); /* stream, echo */
}

static const char *const default_only_keys[] = {"n", "best_of", "stream", "echo", NULL};

static int in_list(const char *const *list, const char *key) {
    for (; *list; list++)
        if (!strcmp(*list, key)) return 1;
    return 0;
}

/* content: a string, or an array of {"type": "text", "text": ...} parts (joined). */
static moeq_err oa_content(oa *a, const cJSON *c, size_t i) {
    char param[64];
    snprintf(param, sizeof param, "body.messages[%zu].content", i);
    if (cJSON_IsString(c)) return jw_str(&a->w, c->valuestring), MOEQ_OK;
    if (!cJSON_IsArray(c)) return oa_fail(a->out, param, "%s: must be a string or an array of text parts", param);
    moeq_buf text = {0};
    jw t = {&text, MOEQ_OK};
    size_t k = 0;
    for (const cJSON *part = c->child; part; part = part->next, k++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(s)) {
            moeq_buf_free(&text);
            return oa_fail(a->out, param, "%s[%zu]: only {\"type\": \"text\", \"text\": ...} parts are supported%s%s",
                           param, k, cJSON_IsString(type) ? ", not type " : "",
                           cJSON_IsString(type) ? type->valuestring : "");
        }
        jw_put(&t, s->valuestring);
    }
    jw_strn(&a->w, text.data ? (const char *)text.data : "", text.len);
    moeq_err e = t.e;
    moeq_buf_free(&text);
    return e;
}

static moeq_err oa_messages(oa *a, const cJSON *v) {
    if (!cJSON_IsArray(v)) return oa_fail(a->out, "body.messages", "body.messages: must be an array");
    jw_put(&a->w, ",\"messages\":[");
    size_t i = 0;
    for (const cJSON *m = v->child; m; m = m->next, i++) {
        char param[64];
        snprintf(param, sizeof param, "body.messages[%zu]", i);
        if (!cJSON_IsObject(m)) return oa_fail(a->out, param, "%s: must be an object", param);
        for (const cJSON *k = m->child; k; k = k->next)
            if (strcmp(k->string, "role") && strcmp(k->string, "content"))
                return oa_fail(a->out, param, "%s.%s is not supported (a message has role and content)", param,
                               k->string);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role)) return oa_fail(a->out, param, "%s.role: required, a string", param);
        if (!content) return oa_fail(a->out, param, "%s.content: required", param);
        jw_put(&a->w, i ? ",{\"role\":" : "{\"role\":"); /* OpenAI's newer "developer" is moeq's "system" */
        jw_str(&a->w, strcmp(role->valuestring, "developer") ? role->valuestring : "system");
        jw_put(&a->w, ",\"content\":");
        moeq_err e = oa_content(a, content, i);
        if (e) return e;
        jw_put(&a->w, "}");
    }
    jw_put(&a->w, "]");
    return MOEQ_OK;
}

/* prompt: a string, an array of one string, or an array of token ids. */
static moeq_err oa_prompt(oa *a, const cJSON *v) {
    if (cJSON_IsString(v)) {
        jw_put(&a->w, ",\"prompt\":");
        return jw_str(&a->w, v->valuestring), MOEQ_OK;
    }
    int n = cJSON_GetArraySize(v);
    if (cJSON_IsArray(v) && n == 1 && cJSON_IsString(v->child)) return oa_prompt(a, v->child);
    if (!cJSON_IsArray(v) || n == 0)
        return oa_fail(a->out, "body.prompt", "body.prompt: must be a string or an array of token ids");
    jw_put(&a->w, ",\"tokens\":[");
    size_t i = 0;
    for (const cJSON *t = v->child; t; t = t->next, i++) {
        if (!is_int(t, 0, 2147483647.0))
            return oa_fail(a->out, "body.prompt",
                           "body.prompt[%zu]: a batch of several prompts in one line is not supported "
                           "(one request per line), nor is anything but a token id 0..2^31-1", i);
        jw_fmt(&a->w, i ? ",%.0f" : "%.0f", t->valuedouble);
    }
    jw_put(&a->w, "]");
    return MOEQ_OK;
}

static moeq_err oa_stop(oa *a, const cJSON *v) {
    jw_put(&a->w, ",\"stop\":[");
    if (cJSON_IsString(v)) jw_str(&a->w, v->valuestring);
    else if (!cJSON_IsArray(v)) return oa_fail(a->out, "body.stop", "body.stop: must be a string or an array");
    else
        for (const cJSON *s = v->child; s; s = s->next) {
            if (!cJSON_IsString(s)) return oa_fail(a->out, "body.stop", "body.stop: every entry must be a string");
            if (s != v->child) jw_put(&a->w, ",");
            jw_str(&a->w, s->valuestring);
        }
    jw_put(&a->w, "]");
    return MOEQ_OK;
}

/* A number field: temperature, top_p (bounds are the job decoder's). */
static moeq_err oa_number(oa *a, const char *key, const char *job_key, const cJSON *v) {
    char param[96];
    snprintf(param, sizeof param, "body.%s", key);
    if (!cJSON_IsNumber(v)) return oa_fail(a->out, param, "%s: must be a number", param);
    jw_fmt(&a->w, ",\"%s\":", job_key);
    jw_num(&a->w, v->valuedouble);
    return MOEQ_OK;
}

static moeq_err oa_integer(oa *a, const char *key, const char *job_key, const cJSON *v, double lo) {
    char param[96];
    snprintf(param, sizeof param, "body.%s", key);
    if (!is_int(v, lo, MAX_EXACT_INT)) return oa_fail(a->out, param, "%s: must be an integer in [%.0f, 2^53]", param, lo);
    jw_fmt(&a->w, ",\"%s\":%.0f", job_key, v->valuedouble);
    return MOEQ_OK;
}

/* A JSON value copied into the job unchanged (its keys are the job's). */
static moeq_err oa_copy(oa *a, const char *job_key, const cJSON *v) {
    char *s = cJSON_PrintUnformatted(v);
    if (!s) return MOEQ_ERR_NOMEM;
    jw_fmt(&a->w, ",\"%s\":", job_key);
    jw_put(&a->w, s);
    free(s);
    return MOEQ_OK;
}

/* {type: text} is the default; json_object and json_schema are the job's response_format as they are. */
static moeq_err oa_response_format(oa *a, const cJSON *v) {
    const cJSON *type = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
    if (!cJSON_IsString(type))
        return oa_fail(a->out, "body.response_format", "body.response_format: must be an object with a type");
    if (!strcmp(type->valuestring, "text")) return MOEQ_OK;
    if (strcmp(type->valuestring, "json_object") && strcmp(type->valuestring, "json_schema"))
        return oa_fail(a->out, "body.response_format.type",
                       "body.response_format.type '%s' is not supported (text, json_object, json_schema)",
                       type->valuestring);
    return oa_copy(a, "response_format", v);
}

static moeq_err oa_logprobs(oa *a, const cJSON *v) {
    if (!cJSON_IsBool(v)) return oa_fail(a->out, "body.logprobs", "body.logprobs: must be true or false");
    if (cJSON_IsTrue(v)) jw_put(&a->w, ",\"logprobs\":true");
    a->out->logprobs = cJSON_IsTrue(v);
    return MOEQ_OK;
}

/* The legacy completions API: logprobs = N alternatives per token (0..5 there; moeq's bound is 20). */
static moeq_err oa_completion_logprobs(oa *a, const cJSON *v) {
    if (!is_int(v, 0, MOEQ_JOB_MAX_TOP_LOGPROBS))
        return oa_fail(a->out, "body.logprobs", "body.logprobs: must be an integer in [0, %d]", MOEQ_JOB_MAX_TOP_LOGPROBS);
    jw_fmt(&a->w, ",\"logprobs\":true,\"top_logprobs\":%.0f", v->valuedouble);
    a->out->logprobs = 1;
    return MOEQ_OK;
}

/* One body key. An explicit null is the key's absence, as in OpenAI's API. */
static moeq_err oa_body_key(oa *a, const cJSON *v) {
    const char *k = v->string;
    int chat = a->out->endpoint == MOEQ_OPENAI_CHAT;
    char param[96];
    snprintf(param, sizeof param, "body.%s", k);
    if (cJSON_IsNull(v)) return MOEQ_OK;
    if (!strcmp(k, "model")) {
        if (!cJSON_IsString(v)) return oa_fail(a->out, "body.model", "body.model: must be a string");
        a->out->model = strdup(v->valuestring);
        return a->out->model ? MOEQ_OK : MOEQ_ERR_NOMEM;
    }
    if (!strcmp(k, "messages") && chat) return oa_messages(a, v);
    if (!strcmp(k, "prompt") && !chat) return oa_prompt(a, v);
    if (!strcmp(k, "max_tokens") || (!strcmp(k, "max_completion_tokens") && chat)) {
        if (a->max_key)
            return oa_fail(a->out, param, "body: max_tokens and max_completion_tokens are both given");
        a->max_key = !strcmp(k, "max_tokens") ? "max_tokens" : "max_completion_tokens"; /* k dies with the tree */
        return oa_integer(a, k, "max_new_tokens", v, 1);
    }
    if (!strcmp(k, "temperature") || !strcmp(k, "top_p")) return oa_number(a, k, k, v);
    if (!strcmp(k, "top_k")) return oa_integer(a, k, k, v, 0); /* vLLM's extension, moeq's field */
    if (!strcmp(k, "seed")) return oa_integer(a, k, k, v, 0);
    if (!strcmp(k, "stop")) return oa_stop(a, v);
    /* moeq's job fields carry OpenAI's names (schemas/job.md): checked by the job codec after the mapping */
    if (!strcmp(k, "presence_penalty") || !strcmp(k, "frequency_penalty") || !strcmp(k, "repetition_penalty"))
        return oa_number(a, k, k, v);
    if (!strcmp(k, "min_tokens")) return oa_integer(a, k, k, v, 0); /* vLLM's extension */
    if (!strcmp(k, "response_format")) return oa_response_format(a, v);
    if (!strcmp(k, "logprobs") && chat) return oa_logprobs(a, v);
    if (!strcmp(k, "top_logprobs") && chat) return oa_integer(a, k, k, v, 0);
    if (!strcmp(k, "logprobs")) /* /v1/completions: an integer count of alternatives */
        return oa_completion_logprobs(a, v);
    if (!strcmp(k, "user")) return MOEQ_OK; /* an end-user tag for OpenAI's abuse monitoring: nothing to do */
    if (!strcmp(k, "metadata")) {
        if (!cJSON_IsObject(v)) return oa_fail(a->out, "body.metadata", "body.metadata: must be an object");
        char *s = cJSON_PrintUnformatted(v);
        if (!s) return MOEQ_ERR_NOMEM;
        jw_put(&a->w, ",\"metadata\":");
        jw_put(&a->w, s);
        free(s);
        return MOEQ_OK;
    }
    if (in_list(default_only_keys, k)) {
        if (default_only(v, k)) return MOEQ_OK;
        return oa_fail(a->out, param, "%s: only its default (n and best_of 1, penalties 0, otherwise false) is "
                       "supported by moeq", param);
    }
    if (!strcmp(k, "messages") || !strcmp(k, "prompt") || !strcmp(k, "max_completion_tokens"))
        return oa_fail(a->out, param, "%s belongs to %s, not this url", param,
                       chat ? "/v1/completions" : "/v1/chat/completions");
    return oa_fail(a->out, param, "%s is not supported by moeq", param);
}

/* Escape-aware: a \u0000 in a string (cJSON would silently cut the string there). */
static int has_nul_escape(const char *s, size_t len) {
    for (size_t i = 0; i + 6 <= len; i++) {
        if (s[i] != '\\') continue;
        if (!memcmp(s + i + 1, "u0000", 5)) return 1;
        i++; /* skip the escaped character: "\\u0000" is a backslash then text */
    }
    return 0;
}

static moeq_err oa_envelope(oa *a, const cJSON *root, const cJSON **body) {
    moeq_submit_line *o = a->out;
    for (const cJSON *k = root->child; k; k = k->next)
        if (strcmp(k->string, "custom_id") && strcmp(k->string, "method") && strcmp(k->string, "url") &&
            strcmp(k->string, "body"))
            return oa_fail(o, k->string, "'%s' is not a field of an OpenAI Batch request "
                           "(custom_id, method, url, body)", k->string);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "custom_id");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(root, "method");
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(root, "url");
    *body = cJSON_GetObjectItemCaseSensitive(root, "body");
    if (!cJSON_IsString(id)) return oa_fail(o, "custom_id", "custom_id: required, a string");
    if (!(o->id = strdup(id->valuestring))) return MOEQ_ERR_NOMEM;
    if (method && (!cJSON_IsString(method) || strcmp(method->valuestring, "POST")))
        return oa_fail(o, "method", "method: only POST is supported");
    if (!cJSON_IsString(url)) return oa_fail(o, "url", "url: required, /v1/chat/completions or /v1/completions");
    if (!strcmp(url->valuestring, "/v1/chat/completions")) o->endpoint = MOEQ_OPENAI_CHAT;
    else if (!strcmp(url->valuestring, "/v1/completions")) o->endpoint = MOEQ_OPENAI_COMPLETIONS;
    else
        return oa_fail(o, "url", "url '%s' is not supported (/v1/chat/completions or /v1/completions)",
                       url->valuestring);
    if (!cJSON_IsObject(*body)) return oa_fail(o, "body", "body: required, an object");
    return MOEQ_OK;
}

/* The job decoder's field, as the OpenAI name it came from. */
static void oa_param(const oa *a, const char *field, char *out, size_t n) {
    if (!field[0]) snprintf(out, n, "body");
    else if (!strcmp(field, "id")) snprintf(out, n, "custom_id");
    else if (!strcmp(field, "max_new_tokens")) snprintf(out, n, "body.%s", a->max_key ? a->max_key : "max_tokens");
    else if (!strncmp(field, "tokens", 6)) snprintf(out, n, "body.prompt%.60s", field + 6);
    else snprintf(out, n, "body.%.80s", field);
}

static moeq_err oa_check(oa *a, const moeq_job_limits *limits) {
    moeq_job job;
    moeq_job_reject rej;
    moeq_submit_line *o = a->out;
    moeq_err e = moeq_job_decode(o->job, o->job_len, "application/json", limits, &job, &rej);
    if (e == MOEQ_OK) return moeq_job_free(&job), MOEQ_OK;
    if (e == MOEQ_ERR_NOMEM) return e;
    char param[96];
    oa_param(a, rej.field, param, sizeof param);
    if (rej.code == MOEQ_JOB_REJECT_MISSING_FIELD && strcmp(rej.field, "v") && strcmp(rej.field, "id") &&
        !strchr(rej.field, '[')) { /* no input: the decoder's prompt/messages/tokens is the url's one field */
        const char *input = o->endpoint == MOEQ_OPENAI_CHAT ? "body.messages" : "body.prompt";
        return oa_fail(o, input, "%s: required", input);
    }
    return oa_fail(o, param, "%s: %s", param, rej.message);
}

static moeq_err openai_parse(const char *line, size_t len, const moeq_job_limits *limits, moeq_submit_line *o) {
    if (has_nul_escape(line, len)) return oa_fail(o, "", "a string holds \\u0000, which a job may not contain");
    cJSON *root = cJSON_ParseWithLength(line, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return oa_fail(o, "", "not a JSON object (an OpenAI Batch request line)");
    }
    moeq_buf job = {0};
    oa a = {.out = o, .w = {&job, MOEQ_OK}};
    const cJSON *body = NULL;
    moeq_err e = oa_envelope(&a, root, &body);
    if (!e) {
        jw_put(&a.w, "{\"v\":1,\"id\":");
        jw_str(&a.w, o->id);
        for (const cJSON *k = body->child; k && !e; k = k->next) e = oa_body_key(&a, k);
        jw_put(&a.w, "}");
    }
    if (!e && a.w.e) e = a.w.e;
    cJSON_Delete(root);
    if (!e) {
        o->job = (char *)job.data; /* NUL-terminated one past len (moeq_buf) */
        o->job_len = job.len;
        job.data = NULL;
        e = oa_check(&a, limits);
    }
    moeq_buf_free(&job);
    if (e) {
        free(o->job);
        o->job = NULL;
        o->job_len = 0;
    }
    return e;
}

/* ---- moeq line ----------------------------------------------------------------------- */

static moeq_err moeq_parse(const char *line, size_t len, const moeq_job_limits *limits, moeq_submit_line *o) {
    moeq_job job;
    moeq_job_reject rej;
    moeq_err e = moeq_job_decode(line, len, "application/json", limits, &job, &rej);
    if (e == MOEQ_ERR_NOMEM) return e;
    if (e) {
        snprintf(o->code, sizeof o->code, "%s", moeq_job_reject_code_name(rej.code));
        snprintf(o->param, sizeof o->param, "%s", rej.field);
        snprintf(o->message, sizeof o->message, "%s", rej.message);
        if (rej.has_id && !(o->id = strdup(rej.id))) return MOEQ_ERR_NOMEM;
        return e;
    }
    o->id = strdup(job.id);
    o->job = malloc(len + 1);
    moeq_job_free(&job);
    if (!o->id || !o->job) return MOEQ_ERR_NOMEM;
    memcpy(o->job, line, len);
    o->job[len] = 0;
    o->job_len = len;
    return MOEQ_OK;
}

moeq_err moeq_submit_line_parse(moeq_dialect dialect, const char *line, size_t len, const moeq_job_limits *limits,
                                moeq_submit_line *out) {
    if (!line || !out) return MOEQ_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    moeq_err e = dialect == MOEQ_DIALECT_OPENAI ? openai_parse(line, len, limits, out)
                                                : moeq_parse(line, len, limits, out);
    if (e == MOEQ_ERR_NOMEM) {
        moeq_submit_line_free(out);
        snprintf(out->message, sizeof out->message, "out of memory");
    }
    return e;
}

/* ---- result -> output line ---------------------------------------------------------- */

static const char *oa_finish(moeq_finish_reason fr) { return fr == MOEQ_FINISH_LENGTH ? "length" : "stop"; }

/* A rejected request is the client's fault (400); the rest are the server's (500). */
static int oa_status_code(const char *code) {
    static const char *const client[] = {MOEQ_CODE_REPLY_TO_NOT_ALLOWED, MOEQ_CODE_PROMPT_TOO_LONG,
                                         MOEQ_CODE_TOKENIZE, NULL};
    if (!code) return 500;
    if (in_list(client, code)) return 400;
    for (int i = 0; i < MOEQ_JOB_REJECT__COUNT; i++)
        if (!strcmp(code, moeq_job_reject_code_name((moeq_job_reject_code)i))) return 400;
    return 500;
}

/*
 * OpenAI's logprobs objects from the result's. Results carry token ids, not
 * strings: a token is written "token_id:<id>" with bytes null, the convention
 * of vLLM's return_tokens_as_token_ids (docs/SUBMIT.md).
 */
static void oa_logprobs_chat(jw *w, const moeq_result *r) {
    jw_put(w, "{\"content\":[");
    for (size_t i = 0; i < r->n_logprobs; i++) {
        const moeq_result_logprob *lp = &r->logprobs[i];
        jw_fmt(w, "%s{\"token\":\"token_id:%d\",\"logprob\":", i ? "," : "", (int)lp->token);
        jw_num(w, lp->logprob);
        jw_put(w, ",\"bytes\":null,\"top_logprobs\":[");
        for (int k = 0; k < lp->n_top; k++) {
            jw_fmt(w, "%s{\"token\":\"token_id:%d\",\"logprob\":", k ? "," : "", (int)lp->top_tokens[k]);
            jw_num(w, lp->top_logprobs[k]);
            jw_put(w, ",\"bytes\":null}");
        }
        jw_put(w, "]}");
    }
    jw_put(w, "]}");
}

static void oa_logprobs_completion(jw *w, const moeq_result *r) {
    jw_put(w, "{\"tokens\":[");
    for (size_t i = 0; i < r->n_logprobs; i++) jw_fmt(w, "%s\"token_id:%d\"", i ? "," : "", (int)r->logprobs[i].token);
    jw_put(w, "],\"token_logprobs\":[");
    for (size_t i = 0; i < r->n_logprobs; i++) {
        if (i) jw_put(w, ",");
        jw_num(w, r->logprobs[i].logprob);
    }
    jw_put(w, "],\"top_logprobs\":[");
    for (size_t i = 0; i < r->n_logprobs; i++) {
        const moeq_result_logprob *lp = &r->logprobs[i];
        jw_put(w, i ? ",{" : "{");
        for (int k = 0; k < lp->n_top; k++) {
            jw_fmt(w, "%s\"token_id:%d\":", k ? "," : "", (int)lp->top_tokens[k]);
            jw_num(w, lp->top_logprobs[k]);
        }
        jw_put(w, "}");
    }
    jw_put(w, "],\"text_offset\":null}");
}

static void oa_ok_body(jw *w, const moeq_submit_line *req, const moeq_result *r, const char *hash, int64_t created) {
    int chat = req->endpoint == MOEQ_OPENAI_CHAT;
    const char *text = r->text ? r->text : "";
    size_t text_len = r->text ? r->text_len : 0;
    jw_fmt(w, "{\"id\":\"%s%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", chat ? "chatcmpl-" : "cmpl-", hash,
           chat ? "chat.completion" : "text_completion", (long long)created);
    jw_str(w, r->model ? r->model : req->model ? req->model : "moeq");
    if (chat) {
        jw_put(w, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
        jw_strn(w, text, text_len);
        jw_put(w, "},\"logprobs\":");
        if (req->logprobs && r->logprobs) oa_logprobs_chat(w, r);
        else jw_put(w, "null");
        jw_put(w, ",\"finish_reason\":");
    } else {
        jw_put(w, ",\"choices\":[{\"text\":");
        jw_strn(w, text, text_len);
        jw_put(w, ",\"index\":0,\"logprobs\":");
        if (req->logprobs && r->logprobs) oa_logprobs_completion(w, r);
        else jw_put(w, "null");
        jw_put(w, ",\"finish_reason\":");
    }
    jw_str(w, oa_finish(r->finish_reason));
    jw_fmt(w, "}],\"usage\":{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"total_tokens\":%lld}}",
           (long long)r->usage.prompt_tokens, (long long)r->usage.completion_tokens,
           (long long)(r->usage.prompt_tokens + r->usage.completion_tokens));
}

static void oa_result(jw *w, const moeq_submit_line *req, const moeq_result *r, const char *hash, int64_t created) {
    jw_fmt(w, "{\"id\":\"batch_req_%s\",\"custom_id\":", hash);
    jw_str(w, r->id);
    const char *msg = r->error.message ? r->error.message : "";
    if (r->status == MOEQ_RESULT_EXPIRED || r->status == MOEQ_RESULT_CANCELLED) {
        int expired = r->status == MOEQ_RESULT_EXPIRED;
        jw_fmt(w, ",\"response\":null,\"error\":{\"code\":\"%s\",\"message\":", expired ? "batch_expired" : "batch_cancelled");
        jw_str(w, msg[0] ? msg : expired ? "the job's deadline passed" : "the job was cancelled");
        jw_put(w, "}}");
        return;
    }
    int status = r->status == MOEQ_RESULT_OK ? 200 : oa_status_code(r->error.code);
    jw_fmt(w, ",\"response\":{\"status_code\":%d,\"request_id\":\"req_%s\",\"body\":", status, hash);
    if (status == 200) {
        oa_ok_body(w, req, r, hash, created);
    } else {
        jw_put(w, "{\"error\":{\"message\":");
        jw_str(w, msg);
        jw_fmt(w, ",\"type\":\"%s\",\"param\":null,\"code\":", status == 400 ? "invalid_request_error" : "server_error");
        jw_str(w, r->error.code ? r->error.code : "internal");
        jw_put(w, "}}");
    }
    jw_put(w, "},\"error\":null}");
}

moeq_err moeq_submit_result_line(moeq_dialect dialect, const moeq_submit_line *req, const moeq_result *r,
                                 const char *job_hash, int64_t created_s, moeq_buf *out, int *to_errors,
                                 char *errstr, size_t errstr_size) {
    if (!req || !r || !out || !to_errors) return MOEQ_ERR_INVALID_ARG;
    *to_errors = 0;
    if (dialect == MOEQ_DIALECT_MOEQ) return moeq_result_encode(r, MOEQ_WIRE_JSON, out, errstr, errstr_size);
    size_t len0 = out->len;
    jw w = {out, MOEQ_OK};
    oa_result(&w, req, r, job_hash && job_hash[0] ? job_hash : "0", created_s);
    if (w.e) out->len = len0;
    *to_errors = r->status != MOEQ_RESULT_OK;
    return w.e;
}

moeq_err moeq_submit_invalid_line(moeq_dialect dialect, size_t lineno, const moeq_submit_line *line, moeq_buf *out) {
    jw w = {out, MOEQ_OK};
    if (dialect == MOEQ_DIALECT_OPENAI) {
        jw_fmt(&w, "{\"id\":\"batch_req_line%zu\",\"custom_id\":", lineno);
        jw_str(&w, line->id);
        jw_put(&w, ",\"response\":null,\"error\":{\"code\":");
        jw_str(&w, line->code);
        jw_put(&w, ",\"message\":");
        jw_str(&w, line->message);
        jw_put(&w, ",\"param\":");
        jw_str(&w, line->param[0] ? line->param : NULL);
        jw_fmt(&w, ",\"line\":%zu}}", lineno);
    } else {
        jw_fmt(&w, "{\"line\":%zu,\"id\":", lineno);
        jw_str(&w, line->id);
        jw_put(&w, ",\"error\":{\"code\":");
        jw_str(&w, line->code);
        jw_put(&w, ",\"field\":");
        jw_str(&w, line->param);
        jw_put(&w, ",\"message\":");
        jw_str(&w, line->message);
        jw_put(&w, "}}");
    }
    return w.e;
}

/* ---- reading back an earlier run's lines (--resume) ---------------------------------- */

static int oa_answer(const char *line, size_t len, char *id, size_t id_size, moeq_result_status *status) {
    cJSON *root = cJSON_ParseWithLength(line, len);
    const cJSON *cid = cJSON_GetObjectItemCaseSensitive(root, "custom_id");
    const cJSON *resp = cJSON_GetObjectItemCaseSensitive(root, "response");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(err, "code");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(resp, "status_code");
    int answer = 1;
    if (!cJSON_IsString(cid) || strlen(cid->valuestring) >= id_size) answer = 0;
    else if (cJSON_IsNumber(sc)) *status = sc->valueint == 200 ? MOEQ_RESULT_OK : MOEQ_RESULT_ERROR;
    else if (cJSON_IsString(code) && !strcmp(code->valuestring, "batch_expired")) *status = MOEQ_RESULT_EXPIRED;
    else if (cJSON_IsString(code) && !strcmp(code->valuestring, "batch_cancelled")) *status = MOEQ_RESULT_CANCELLED;
    else answer = 0; /* a skipped input line (error.line), or not ours */
    if (answer) snprintf(id, id_size, "%s", cid->valuestring);
    cJSON_Delete(root);
    return answer;
}

int moeq_submit_answer_parse(moeq_dialect dialect, const char *line, size_t len, char *id, size_t id_size,
                             moeq_result_status *status) {
    if (!line || !id || !status || id_size == 0) return 0;
    if (dialect == MOEQ_DIALECT_OPENAI) return oa_answer(line, len, id, id_size, status);
    moeq_result r;
    char err[128];
    if (moeq_result_decode(line, len, "application/json", 0, &r, err, sizeof err)) return 0;
    int ok = strlen(r.id) < id_size;
    if (ok) {
        snprintf(id, id_size, "%s", r.id);
        *status = r.status;
    }
    moeq_result_free(&r);
    return ok;
}
