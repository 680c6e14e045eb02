/*
 * redis.c — the Redis adapter (moeq/redis.h); the only file that includes
 * hiredis.
 *
 * Three parts: pure parsing (URL + redis.* options, RESP bytes, stream reply
 * shapes), the connection (connect, AUTH, SELECT, lazy reconnect), and
 * commands with server and connection errors mapped to moeq_err.
 *
 * Not here: retries of failed commands (whether a lost XADD happened is the
 * caller's question), stream or job policy, RESP3.
 */
#include "moeq/redis.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#ifdef MOEQ_HAVE_HIREDIS_SSL
#include <hiredis/hiredis_ssl.h>
#endif

/* ---- parameters: URL + redis.* keys (pure) ------------------------------ */

#define P(field) offsetof(moeq_redis_params, field), sizeof(((moeq_redis_params *)0)->field)
static const moeq_prop redis_props[] = {
    {"password", MOEQ_PROP_STR, P(password), 0, 0, "", "AUTH password (overrides the URL's)"},
    {"user", MOEQ_PROP_STR, P(user), 0, 0, "", "ACL user for AUTH (overrides the URL's); empty: default user"},
    {"db", MOEQ_PROP_INT, P(db), 0, 65535, "0", "database number to SELECT"},
    {"connect_timeout_ms", MOEQ_PROP_INT, P(connect_timeout_ms), 0, 3600000, "5000",
     "connect timeout, ms; 0: the OS default"},
    {"command_timeout_ms", MOEQ_PROP_INT, P(command_timeout_ms), 0, 3600000, "0",
     "per-command read/write timeout, ms; 0: none (needed for blocking XREADGROUP)"},
    {"tls", MOEQ_PROP_BOOL, P(tls), 0, 1, "false", "use TLS (also set by a rediss:// URL); needs hiredis_ssl"},
    {"tls_ca_file", MOEQ_PROP_STR, P(tls_ca_file), 0, 0, "", "PEM CA bundle to verify the server"},
    {"tls_cert_file", MOEQ_PROP_STR, P(tls_cert_file), 0, 0, "", "client certificate for mutual TLS"},
    {"tls_key_file", MOEQ_PROP_STR, P(tls_key_file), 0, 0, "", "client certificate's private key"},
    {"tls_server_name", MOEQ_PROP_STR, P(tls_server_name), 0, 0, "", "SNI and verification name; empty: host"},
    MOEQ_PROP_END,
};
#undef P

const moeq_prop *moeq_redis_option_table(void) { return redis_props; }

/* Copy s[0..len) into out[size], %-decoding when asked; 0 when it does not fit or is malformed. */
static int copy_part(char *out, size_t size, const char *s, size_t len, int decode) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (decode && c == '%') {
            if (i + 2 >= len) return 0;
            char hex[3] = {s[i + 1], s[i + 2], '\0'}, *end;
            long v = strtol(hex, &end, 16);
            if (end != hex + 2 || v == 0) return 0; /* %00 would cut the string */
            c = (char)v;
            i += 2;
        }
        if (o + 1 >= size) return 0;
        out[o++] = c;
    }
    out[o] = '\0';
    return 1;
}

static int parse_int_range(const char *s, size_t len, long lo, long hi, long *out) {
    if (len == 0 || len > 10) return 0;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* "host", "host:port", "[v6]:port", "[v6]" */
static moeq_err parse_hostport(const char *s, size_t len, moeq_redis_params *params, const char *url, char *errstr,
                               size_t n) {
    const char *host = s, *port = NULL;
    size_t host_len = len;
    if (len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis URL '%s': unclosed '['", url);
        host = s + 1, host_len = (size_t)(close - host);
        if (close + 1 < s + len) {
            if (close[1] != ':') return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis URL '%s': junk after ']'", url);
            port = close + 2;
        }
    } else {
        const char *colon = memchr(s, ':', len);
        if (colon) host_len = (size_t)(colon - s), port = colon + 1;
    }
    if (host_len == 0) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis URL '%s': empty host", url);
    if (!copy_part(params->host, sizeof params->host, host, host_len, 0))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis URL '%s': host too long", url);
    if (port) {
        long v;
        if (!parse_int_range(port, (size_t)(s + len - port), 1, 65535, &v))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis URL '%s': port is not 1..65535", url);
        params->port = (int)v;
    }
    return MOEQ_OK;
}

/* "user:password", ":password", "user" (all %-encoded). */
static moeq_err parse_userinfo(const char *s, size_t len, moeq_redis_params *params, const char *url, char *errstr,
                               size_t n) {
    const char *colon = memchr(s, ':', len);
    size_t user_len = colon ? (size_t)(colon - s) : len;
    if (!copy_part(params->user, sizeof params->user, s, user_len, 1))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis URL '%s': bad or too long user", url);
    if (colon && !copy_part(params->password, sizeof params->password, colon + 1, (size_t)(s + len - colon - 1), 1))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis URL: bad or too long password");
    return MOEQ_OK;
}

/* redis[s]://[userinfo@]hostport[/db]; rest points after "://". */
static moeq_err parse_redis_url(const char *rest, moeq_redis_params *params, const char *url, char *errstr,
                                size_t n) {
    if (strpbrk(rest, "?#"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n,
                         "redis URL '%s': query parameters are not supported (use redis.* keys)", url);
    const char *slash = strchr(rest, '/');
    size_t auth_len = slash ? (size_t)(slash - rest) : strlen(rest);
    const char *at = NULL;
    for (size_t i = 0; i < auth_len; i++)
        if (rest[i] == '@') at = rest + i; /* the last '@': passwords may hold one, encoded or not */
    moeq_err err = MOEQ_OK;
    if (at) err = parse_userinfo(rest, (size_t)(at - rest), params, url, errstr, n);
    const char *hp = at ? at + 1 : rest;
    if (!err) err = parse_hostport(hp, (size_t)(rest + auth_len - hp), params, url, errstr, n);
    if (!err && slash && slash[1]) {
        long db;
        if (!parse_int_range(slash + 1, strlen(slash + 1), 0, 65535, &db))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis URL '%s': db is not 0..65535", url);
        params->db = db;
    }
    return err;
}

static moeq_err parse_url(const char *url, moeq_redis_params *params, char *errstr, size_t n) {
    if (strncmp(url, "unix://", 7) == 0) {
        if (!url[7] || !copy_part(params->unix_path, sizeof params->unix_path, url + 7, strlen(url + 7), 0))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis URL '%s': empty or too long socket path", url);
        return MOEQ_OK;
    }
    if (strncmp(url, "redis://", 8) == 0) return parse_redis_url(url + 8, params, url, errstr, n);
    if (strncmp(url, "rediss://", 9) == 0) {
        params->tls = 1;
        return parse_redis_url(url + 9, params, url, errstr, n);
    }
    if (strstr(url, "://"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis URL '%s': scheme must be redis, rediss or unix",
                         url);
    return parse_hostport(url, strlen(url), params, url, errstr, n);
}

moeq_err moeq_redis_params_parse(const char *url, const moeq_kvlist *redis, moeq_redis_params *params,
                                 char *errstr, size_t n) {
    if (!url || !params) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis params: NULL argument");
    memset(params, 0, sizeof *params);
    moeq_err err = moeq_props_defaults(redis_props, params, errstr, n);
    if (err) return err;
    strcpy(params->host, "127.0.0.1");
    params->port = 6379;
    if (*url && (err = parse_url(url, params, errstr, n))) return err;
    for (size_t i = 0; redis && i < moeq_kvlist_count(redis); i++) {
        const char *key, *value;
        char why[256];
        moeq_kvlist_at(redis, i, &key, &value);
        err = moeq_props_set(redis_props, params, key, value, why, sizeof why);
        if (err == MOEQ_ERR_NOT_FOUND)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis.%s: unknown Redis option", key);
        if (err) return moeq_errf(err, errstr, n, "redis.%s", why);
    }
    return MOEQ_OK;
}

/* ---- replies (pure) ----------------------------------------------------- */

/* A moeq_redis_reply is a hiredis redisReply. */
static const redisReply *R(const moeq_redis_reply *reply) { return (const redisReply *)reply; }

void moeq_redis_reply_free(moeq_redis_reply *reply) {
    if (reply) freeReplyObject(reply);
}

moeq_redis_reply_type moeq_redis_reply_type_of(const moeq_redis_reply *reply) {
    if (!reply) return MOEQ_REDIS_NIL;
    switch (R(reply)->type) {
    case REDIS_REPLY_NIL: return MOEQ_REDIS_NIL;
    case REDIS_REPLY_STRING: return MOEQ_REDIS_STRING;
    case REDIS_REPLY_STATUS: return MOEQ_REDIS_STATUS;
    case REDIS_REPLY_INTEGER: return MOEQ_REDIS_INTEGER;
    case REDIS_REPLY_ARRAY: return MOEQ_REDIS_ARRAY;
    case REDIS_REPLY_ERROR: return MOEQ_REDIS_ERROR;
    default: return MOEQ_REDIS_OTHER;
    }
}

const char *moeq_redis_reply_str(const moeq_redis_reply *reply, size_t *len) {
    moeq_redis_reply_type t = moeq_redis_reply_type_of(reply);
    if (t != MOEQ_REDIS_STRING && t != MOEQ_REDIS_STATUS && t != MOEQ_REDIS_ERROR) return NULL;
    if (len) *len = R(reply)->len;
    return R(reply)->str;
}

long long moeq_redis_reply_int(const moeq_redis_reply *reply) {
    moeq_redis_reply_type t = moeq_redis_reply_type_of(reply);
    if (t == MOEQ_REDIS_INTEGER) return R(reply)->integer;
    if (t != MOEQ_REDIS_STRING || R(reply)->len == 0) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(R(reply)->str, &end, 10);
    return (errno || *end) ? 0 : v;
}

size_t moeq_redis_reply_len(const moeq_redis_reply *reply) {
    return moeq_redis_reply_type_of(reply) == MOEQ_REDIS_ARRAY ? R(reply)->elements : 0;
}

const moeq_redis_reply *moeq_redis_reply_at(const moeq_redis_reply *reply, size_t i) {
    if (i >= moeq_redis_reply_len(reply)) return NULL;
    return (const moeq_redis_reply *)R(reply)->element[i];
}

int moeq_redis_reply_is_error(const moeq_redis_reply *reply, const char *code) {
    if (moeq_redis_reply_type_of(reply) != MOEQ_REDIS_ERROR || !code) return 0;
    size_t len = strlen(code);
    return R(reply)->len >= len && memcmp(R(reply)->str, code, len) == 0 &&
           (R(reply)->len == len || R(reply)->str[len] == ' ');
}

moeq_err moeq_redis_reply_parse(const char *resp, size_t len, moeq_redis_reply **reply, char *errstr, size_t n) {
    if (!resp || !reply) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis parse: NULL argument");
    *reply = NULL;
    redisReader *reader = redisReaderCreate();
    if (!reader) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "redis parse: out of memory");
    void *first = NULL, *second = NULL;
    moeq_err err = MOEQ_OK;
    if (redisReaderFeed(reader, resp, len) != REDIS_OK || redisReaderGetReply(reader, &first) != REDIS_OK)
        err = moeq_errf(MOEQ_ERR_PARSE, errstr, n, "redis parse: %s", reader->errstr);
    else if (!first)
        err = moeq_errf(MOEQ_ERR_PARSE, errstr, n, "redis parse: incomplete reply");
    else if (redisReaderGetReply(reader, &second) != REDIS_OK || second || reader->pos < reader->len)
        err = moeq_errf(MOEQ_ERR_PARSE, errstr, n, "redis parse: bytes after the reply");
    if (second) freeReplyObject(second);
    if (err && first) freeReplyObject(first);
    if (!err) *reply = first;
    redisReaderFree(reader);
    return err;
}

/* ---- stream replies (pure) ---------------------------------------------- */

static int is_type(const redisReply *r, int type) { return r && r->type == type; }

/* An even-sized array of strings: name, value, ... */
static int is_field_list(const redisReply *r) {
    if (!is_type(r, REDIS_REPLY_ARRAY) || r->elements % 2) return 0;
    for (size_t i = 0; i < r->elements; i++)
        if (!is_type(r->element[i], REDIS_REPLY_STRING)) return 0;
    return 1;
}

/* [[id, fields|nil], ...]; a nil element or nil fields is a deleted entry. */
static moeq_err walk_entries(const redisReply *list, const char *stream, moeq_redis_entry_fn fn, void *opaque,
                             int *stop, char *errstr, size_t n) {
    if (is_type(list, REDIS_REPLY_NIL)) return MOEQ_OK;
    if (!is_type(list, REDIS_REPLY_ARRAY))
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "stream reply: entry list is not an array");
    for (size_t i = 0; i < list->elements && !*stop; i++) {
        const redisReply *e = list->element[i];
        if (is_type(e, REDIS_REPLY_NIL)) continue;
        if (!is_type(e, REDIS_REPLY_ARRAY) || e->elements < 2 || !is_type(e->element[0], REDIS_REPLY_STRING))
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "stream reply: entry %zu is not [id, fields]", i);
        const redisReply *fields = e->element[1];
        if (!is_type(fields, REDIS_REPLY_NIL) && !is_field_list(fields))
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "stream reply: entry %s fields are not name/value pairs",
                             e->element[0]->str);
        moeq_redis_entry entry = {
            .stream = stream,
            .id = e->element[0]->str,
            .fields = is_type(fields, REDIS_REPLY_ARRAY) ? (const moeq_redis_reply *)fields : NULL,
        };
        *stop = fn(&entry, opaque) != 0;
    }
    return MOEQ_OK;
}

/* [[stream, entries], ...] or nil (a blocking read that timed out). */
static moeq_err walk_xread(const redisReply *r, moeq_redis_entry_fn fn, void *opaque, char *errstr, size_t n) {
    if (is_type(r, REDIS_REPLY_NIL)) return MOEQ_OK;
    if (!is_type(r, REDIS_REPLY_ARRAY)) return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "XREAD reply: not an array");
    int stop = 0;
    for (size_t i = 0; i < r->elements && !stop; i++) {
        const redisReply *s = r->element[i];
        if (!is_type(s, REDIS_REPLY_ARRAY) || s->elements != 2 || !is_type(s->element[0], REDIS_REPLY_STRING))
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "XREAD reply: element %zu is not [stream, entries]", i);
        moeq_err err = walk_entries(s->element[1], s->element[0]->str, fn, opaque, &stop, errstr, n);
        if (err) return err;
    }
    return MOEQ_OK;
}

moeq_err moeq_redis_entries_foreach(const moeq_redis_reply *reply, moeq_redis_entries_shape shape,
                                    moeq_redis_entry_fn fn, void *opaque, char *errstr, size_t n) {
    if (!fn) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "stream reply: NULL callback");
    const redisReply *r = R(reply);
    int stop = 0;
    switch (shape) {
    case MOEQ_REDIS_XREAD: return walk_xread(r, fn, opaque, errstr, n);
    case MOEQ_REDIS_XRANGE: return walk_entries(r, NULL, fn, opaque, &stop, errstr, n);
    case MOEQ_REDIS_XAUTOCLAIM:
        if (!moeq_redis_autoclaim_cursor(reply))
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, n, "XAUTOCLAIM reply: not [cursor, entries, ...]");
        return walk_entries(r->element[1], NULL, fn, opaque, &stop, errstr, n);
    }
    return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "stream reply: unknown shape %d", (int)shape);
}

const char *moeq_redis_entry_get(const moeq_redis_entry *entry, const char *name, size_t *len) {
    if (!entry || !entry->fields || !name) return NULL;
    const redisReply *f = R(entry->fields);
    size_t name_len = strlen(name);
    for (size_t i = 0; i + 1 < f->elements; i += 2) {
        const redisReply *k = f->element[i], *v = f->element[i + 1];
        if (is_type(k, REDIS_REPLY_STRING) && k->len == name_len && memcmp(k->str, name, name_len) == 0 &&
            is_type(v, REDIS_REPLY_STRING)) {
            if (len) *len = v->len;
            return v->str;
        }
    }
    return NULL;
}

const char *moeq_redis_autoclaim_cursor(const moeq_redis_reply *reply) {
    const redisReply *r = R(reply);
    if (!is_type(r, REDIS_REPLY_ARRAY) || r->elements < 2 || !is_type(r->element[0], REDIS_REPLY_STRING))
        return NULL;
    return r->element[0]->str;
}

/* ---- the connection ----------------------------------------------------- */

struct moeq_redis {
    redisContext *c;      /* NULL or broken: the next command reconnects */
    int broken;
    size_t pending;       /* pipelined commands whose replies are unread */
    moeq_redis_params params;
#ifdef MOEQ_HAVE_HIREDIS_SSL
    redisSSLContext *ssl;
#endif
};

static struct timeval ms_tv(int64_t ms) { return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000}; }

static const char *where(const moeq_redis *redis, char *buf, size_t size) {
    if (redis->params.unix_path[0]) snprintf(buf, size, "unix:%s", redis->params.unix_path);
    else snprintf(buf, size, "%s:%d", redis->params.host, redis->params.port);
    return buf;
}

/* A context-level failure (no reply): the connection is unusable from now on. */
static moeq_err ctx_err(moeq_redis *redis, const char *what, char *errstr, size_t n) {
    char at[300];
    int saved_errno = errno;
    moeq_err err = MOEQ_ERR_TRANSIENT;
    redisContext *c = redis->c;
    redis->broken = 1;
    if (!c) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "redis %s %s: out of memory", where(redis, at, sizeof at), what);
#ifdef REDIS_ERR_TIMEOUT
    if (c->err == REDIS_ERR_TIMEOUT) err = MOEQ_ERR_TIMEOUT;
#endif
    if (c->err == REDIS_ERR_IO && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK)) err = MOEQ_ERR_TIMEOUT;
    if (c->err == REDIS_ERR_PROTOCOL) err = MOEQ_ERR_PARSE;
    if (c->err == REDIS_ERR_OOM) err = MOEQ_ERR_NOMEM;
    return moeq_errf(err, errstr, n, "redis %s %s: %s", where(redis, at, sizeof at), what,
                     c->errstr[0] ? c->errstr : "connection lost");
}

/* The moeq_err for an error reply, by its first word. */
static moeq_err reply_err(const redisReply *r) {
    static const struct { const char *code; moeq_err err; } map[] = {
        {"LOADING", MOEQ_ERR_TRANSIENT}, {"BUSY", MOEQ_ERR_TRANSIENT},     {"TRYAGAIN", MOEQ_ERR_TRANSIENT},
        {"MASTERDOWN", MOEQ_ERR_TRANSIENT}, {"READONLY", MOEQ_ERR_TRANSIENT}, {"CLUSTERDOWN", MOEQ_ERR_TRANSIENT},
        {"NOGROUP", MOEQ_ERR_NOT_FOUND}, {"NOSCRIPT", MOEQ_ERR_NOT_FOUND}, {"OOM", MOEQ_ERR_LIMIT},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (moeq_redis_reply_is_error((const moeq_redis_reply *)r, map[i].code)) return map[i].err;
    return MOEQ_ERR_INVALID_ARG;
}

/* Hand over a reply: error replies map to a code and a message naming the command. */
static moeq_err finish_reply(redisReply *r, const char *cmd, size_t cmd_len, moeq_redis_reply **reply, char *errstr,
                             size_t n) {
    moeq_err err = MOEQ_OK;
    if (r->type == REDIS_REPLY_ERROR)
        err = moeq_errf(reply_err(r), errstr, n, "redis %.*s: %s", (int)(cmd_len > 32 ? 32 : cmd_len), cmd, r->str);
    if (reply) *reply = (moeq_redis_reply *)r;
    else freeReplyObject(r);
    return err;
}

static moeq_err tls_setup(moeq_redis *redis, char *errstr, size_t n) {
#ifdef MOEQ_HAVE_HIREDIS_SSL
    const moeq_redis_params *p = &redis->params;
    if (!redis->ssl) {
        redisSSLContextError ssl_err = REDIS_SSL_CTX_NONE;
        redisInitOpenSSL();
        redis->ssl = redisCreateSSLContext(p->tls_ca_file[0] ? p->tls_ca_file : NULL, NULL,
                                           p->tls_cert_file[0] ? p->tls_cert_file : NULL,
                                           p->tls_key_file[0] ? p->tls_key_file : NULL,
                                           p->tls_server_name[0] ? p->tls_server_name : p->host, &ssl_err);
        if (!redis->ssl)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis TLS: %s", redisSSLContextGetError(ssl_err));
    }
    if (redisInitiateSSLWithContext(redis->c, redis->ssl) != REDIS_OK)
        return ctx_err(redis, "TLS handshake", errstr, n);
    return MOEQ_OK;
#else
    (void)redis;
    return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, n,
                     "redis.tls / rediss://: this build has no TLS for Redis (hiredis %d.%d without hiredis_ssl; "
                     "install hiredis >= 1.0 with its SSL library and rebuild)", HIREDIS_MAJOR, HIREDIS_MINOR);
#endif
}

/* AUTH and SELECT on a fresh connection; the password never appears in a message. */
static moeq_err handshake(moeq_redis *redis, char *errstr, size_t n) {
    const moeq_redis_params *p = &redis->params;
    redisReply *r = NULL;
    if (p->password[0]) {
        r = p->user[0] ? redisCommand(redis->c, "AUTH %s %s", p->user, p->password)
                       : redisCommand(redis->c, "AUTH %s", p->password);
        if (!r) return ctx_err(redis, "AUTH", errstr, n);
        moeq_err err = r->type == REDIS_REPLY_ERROR
            ? moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis AUTH (user '%s'): %s", p->user[0] ? p->user : "default", r->str)
            : MOEQ_OK;
        freeReplyObject(r);
        if (err) return err;
    }
    if (p->db != 0) {
        r = redisCommand(redis->c, "SELECT %lld", (long long)p->db);
        if (!r) return ctx_err(redis, "SELECT", errstr, n);
        moeq_err err = r->type == REDIS_REPLY_ERROR
            ? moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis.db %lld: %s", (long long)p->db, r->str) : MOEQ_OK;
        freeReplyObject(r);
        if (err) return err;
    }
    return MOEQ_OK;
}

static moeq_err connect_ctx(moeq_redis *redis, char *errstr, size_t n) {
    const moeq_redis_params *p = &redis->params;
    if (redis->c) redisFree(redis->c);
    redis->c = NULL, redis->broken = 1, redis->pending = 0;
    struct timeval tv = ms_tv(p->connect_timeout_ms);
    if (p->unix_path[0])
        redis->c = p->connect_timeout_ms ? redisConnectUnixWithTimeout(p->unix_path, tv) : redisConnectUnix(p->unix_path);
    else
        redis->c = p->connect_timeout_ms ? redisConnectWithTimeout(p->host, p->port, tv) : redisConnect(p->host, p->port);
    if (!redis->c || redis->c->err) return ctx_err(redis, "connect", errstr, n);
    if (p->command_timeout_ms > 0 && redisSetTimeout(redis->c, ms_tv(p->command_timeout_ms)) != REDIS_OK)
        return ctx_err(redis, "set timeout", errstr, n);
    if (!p->unix_path[0]) redisEnableKeepAlive(redis->c);
    moeq_err err = p->tls ? tls_setup(redis, errstr, n) : MOEQ_OK;
    if (!err) err = handshake(redis, errstr, n);
    if (!err) redis->broken = 0;
    return err;
}

moeq_err moeq_redis_new(const moeq_redis_params *params, moeq_redis **out, char *errstr, size_t n) {
    if (!params || !out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis: NULL argument");
    *out = NULL;
    moeq_redis *redis = calloc(1, sizeof *redis);
    if (!redis) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "redis: out of memory");
    redis->params = *params;
    moeq_err err = connect_ctx(redis, errstr, n);
    if (err) {
        moeq_redis_destroy(redis);
        return err;
    }
    *out = redis;
    return MOEQ_OK;
}

void moeq_redis_destroy(moeq_redis *redis) {
    if (!redis) return;
    if (redis->c) redisFree(redis->c);
#ifdef MOEQ_HAVE_HIREDIS_SSL
    if (redis->ssl) redisFreeSSLContext(redis->ssl);
#endif
    free(redis);
}

moeq_err moeq_redis_reconnect(moeq_redis *redis, char *errstr, size_t n) {
    if (!redis) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis reconnect: NULL handle");
    return connect_ctx(redis, errstr, n);
}

/* Before a command: re-make a connection that failed, unless replies are still owed on it. */
static moeq_err ensure_connected(moeq_redis *redis, char *errstr, size_t n) {
    if (!redis->broken) return MOEQ_OK;
    return connect_ctx(redis, errstr, n);
}

static size_t arg_len(const char *const *argv, const size_t *argv_len, int i) {
    return argv_len ? argv_len[i] : strlen(argv[i]);
}

moeq_err moeq_redis_command_argv(moeq_redis *redis, int argc, const char *const *argv, const size_t *argv_len,
                                 moeq_redis_reply **reply, char *errstr, size_t n) {
    if (reply) *reply = NULL;
    if (!redis || argc < 1 || !argv) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis command: no command");
    if (redis->pending)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis command: %zu pipelined replies unread", redis->pending);
    moeq_err err = ensure_connected(redis, errstr, n);
    if (err) return err;
    errno = 0;
    redisReply *r = redisCommandArgv(redis->c, argc, (const char **)argv, argv_len);
    if (!r) return ctx_err(redis, argv[0], errstr, n);
    return finish_reply(r, argv[0], arg_len(argv, argv_len, 0), reply, errstr, n);
}

moeq_err moeq_redis_command(moeq_redis *redis, moeq_redis_reply **reply, char *errstr, size_t n, const char *fmt,
                            ...) {
    if (reply) *reply = NULL;
    if (!redis || !fmt) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis command: no command");
    if (redis->pending)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis command: %zu pipelined replies unread", redis->pending);
    moeq_err err = ensure_connected(redis, errstr, n);
    if (err) return err;
    size_t cmd_len = strcspn(fmt, " ");
    va_list ap;
    va_start(ap, fmt);
    errno = 0;
    redisReply *r = redisvCommand(redis->c, fmt, ap);
    va_end(ap);
    if (!r) {
        char cmd[33];
        snprintf(cmd, sizeof cmd, "%.*s", (int)(cmd_len > 32 ? 32 : cmd_len), fmt);
        return ctx_err(redis, cmd, errstr, n);
    }
    return finish_reply(r, fmt, cmd_len, reply, errstr, n);
}

moeq_err moeq_redis_append_argv(moeq_redis *redis, int argc, const char *const *argv, const size_t *argv_len,
                                char *errstr, size_t n) {
    if (!redis || argc < 1 || !argv) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis append: no command");
    if (redis->broken && redis->pending)
        return moeq_errf(MOEQ_ERR_TRANSIENT, errstr, n, "redis append: connection lost with %zu replies unread",
                         redis->pending);
    moeq_err err = ensure_connected(redis, errstr, n);
    if (err) return err;
    if (redisAppendCommandArgv(redis->c, argc, (const char **)argv, argv_len) != REDIS_OK)
        return ctx_err(redis, argv[0], errstr, n);
    redis->pending++;
    return MOEQ_OK;
}

moeq_err moeq_redis_get_reply(moeq_redis *redis, moeq_redis_reply **reply, char *errstr, size_t n) {
    if (reply) *reply = NULL;
    if (!redis || !redis->pending)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "redis get_reply: no pipelined command pending");
    redis->pending--;
    if (redis->broken)
        return moeq_errf(MOEQ_ERR_TRANSIENT, errstr, n, "redis get_reply: connection lost before the reply");
    void *r = NULL;
    errno = 0;
    if (redisGetReply(redis->c, &r) != REDIS_OK || !r) return ctx_err(redis, "pipelined reply", errstr, n);
    return finish_reply(r, "pipelined command", 17, reply, errstr, n);
}

/* ---- readiness probe -------------------------------------------------------- */

struct moeq_redis_probe {
    moeq_redis_params params;
    moeq_redis *conn;
};

moeq_err moeq_redis_probe_new(const moeq_redis_params *params, moeq_redis_probe **out) {
    moeq_redis_probe *p = calloc(1, sizeof *p);
    if (!p) return MOEQ_ERR_NOMEM;
    p->params = *params;
    if (!p->params.connect_timeout_ms || p->params.connect_timeout_ms > 1000) p->params.connect_timeout_ms = 1000;
    if (!p->params.command_timeout_ms || p->params.command_timeout_ms > 1000) p->params.command_timeout_ms = 1000;
    *out = p;
    return MOEQ_OK;
}

moeq_err moeq_redis_probe_check(void *opaque, char *errstr, size_t n) {
    moeq_redis_probe *p = opaque;
    moeq_err err = p->conn ? MOEQ_OK : moeq_redis_new(&p->params, &p->conn, errstr, n);
    if (err) return err;
    const char *argv[] = {"PING"};
    moeq_redis_reply *reply = NULL;
    err = moeq_redis_command_argv(p->conn, 1, argv, NULL, &reply, errstr, n);
    moeq_redis_reply_free(reply);
    if (err) {
        moeq_redis_destroy(p->conn);
        p->conn = NULL;
    }
    return err;
}

void moeq_redis_probe_destroy(moeq_redis_probe *p) {
    if (!p) return;
    moeq_redis_destroy(p->conn);
    free(p);
}
