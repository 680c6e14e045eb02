/*
 * moeq/redis.h — the Redis adapter: one blocking connection, commands with
 * errors mapped to moeq_err, replies read through accessors, and parsers for
 * the stream replies the coordinator and workers live on (XREADGROUP,
 * XRANGE, XAUTOCLAIM). common/redis.c is the only file that includes hiredis.
 *
 * Connection loss is MOEQ_ERR_TRANSIENT. The failed command is NOT retried
 * here (an XADD whose reply was lost may or may not have happened: the
 * caller's dedupe guard decides); the next command reconnects first,
 * re-authenticates and re-selects the database.
 *
 * Deliberately not here: stream or job policy (coordinator/, worker/),
 * pub/sub, cluster mode, RESP3.
 *
 * Thread-safety: a moeq_redis handle is used by one thread at a time; use one
 * handle per thread.
 */
#ifndef MOEQ_REDIS_H
#define MOEQ_REDIS_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/config.h"
#include "moeq/err.h"

/* Every role's default redis_url: the private stack of scripts/services.sh (6380, not the system 6379). */
#define MOEQ_REDIS_URL_DEFAULT "127.0.0.1:6380"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Where and how to connect: plain data, filled by moeq_redis_params_parse
 * from a URL plus the `redis.*` keys, or by hand.
 */
typedef struct moeq_redis_params {
    char host[256];             /* name or address; IPv6 without brackets            */
    int port;                   /* 1..65535; default 6379                            */
    char unix_path[256];        /* non-empty: connect to this Unix socket instead    */
    char user[128];             /* ACL user; empty: AUTH with the password only      */
    char password[256];         /* empty: no AUTH                                    */
    int64_t db;                 /* SELECT db; 0..65535, default 0                    */
    int64_t connect_timeout_ms; /* default 5000; 0 = the OS default                  */
    int64_t command_timeout_ms; /* per command; default 0 = none (blocking reads)    */
    int tls;                    /* 1: TLS (rediss://); needs hiredis_ssl             */
    char tls_ca_file[256];      /* PEM bundle to verify the server; empty: system    */
    char tls_cert_file[256];    /* client certificate (mutual TLS), optional         */
    char tls_key_file[256];     /* its key                                           */
    char tls_server_name[256];  /* SNI / verification name; empty: host              */
} moeq_redis_params;

/*
 * Parse a URL into params (defaults first), then apply the redis.* list.
 * URL forms: "host", "host:port", "[v6addr]:port",
 * "redis://[[user][:password]@]host[:port][/db]", "rediss://..." (TLS),
 * "unix:///path/to/socket". user and password may be %-encoded.
 * redis.* keys (prefix stripped): password, user, db, connect_timeout_ms,
 * command_timeout_ms, tls (true/false), tls_ca_file, tls_cert_file,
 * tls_key_file, tls_server_name. An unknown key or bad value is
 * MOEQ_ERR_INVALID_ARG naming `redis.<key>` (or the URL part).
 * Pure (no I/O); redis may be NULL.
 */
moeq_err moeq_redis_params_parse(const char *url, const moeq_kvlist *redis, moeq_redis_params *params,
                                 char *errstr, size_t errstr_size);

/* The redis.* keys as a property table (for --help and docs/CONFIGURATION.md). */
const moeq_prop *moeq_redis_option_table(void);

typedef struct moeq_redis moeq_redis;

/*
 * Connect, AUTH, SELECT. MOEQ_ERR_TRANSIENT when the server cannot be
 * reached, MOEQ_ERR_INVALID_ARG for rejected credentials or a bad db,
 * MOEQ_ERR_UNSUPPORTED for TLS without hiredis_ssl. params is copied.
 */
moeq_err moeq_redis_new(const moeq_redis_params *params, moeq_redis **out, char *errstr, size_t errstr_size);

/* NULL is safe. Frees the connection; replies already returned stay valid. */
void moeq_redis_destroy(moeq_redis *redis);

/*
 * A readiness probe with its own connection (hiredis handles are not
 * thread-safe, so the HTTP thread must not borrow the loop's): check connects
 * when needed (connect and command timeouts capped at 1 s) and PINGs; a
 * failure drops the connection so the next check connects again. params is
 * copied; new does no I/O.
 */
typedef struct moeq_redis_probe moeq_redis_probe;
moeq_err moeq_redis_probe_new(const moeq_redis_params *params, moeq_redis_probe **out);
/* A moeq_health_probe_fn: opaque is a moeq_redis_probe. */
moeq_err moeq_redis_probe_check(void *probe, char *errstr, size_t errstr_size);
void moeq_redis_probe_destroy(moeq_redis_probe *probe); /* NULL is safe */

/* Reconnect now (done lazily by the next command after a connection error). */
moeq_err moeq_redis_reconnect(moeq_redis *redis, char *errstr, size_t errstr_size);

/* A reply (or one element of one). Opaque; freed with moeq_redis_reply_free on the top-level reply. */
typedef struct moeq_redis_reply moeq_redis_reply;

typedef enum moeq_redis_reply_type {
    MOEQ_REDIS_NIL,
    MOEQ_REDIS_STRING,  /* bulk string                 */
    MOEQ_REDIS_STATUS,  /* +OK                         */
    MOEQ_REDIS_INTEGER,
    MOEQ_REDIS_ARRAY,
    MOEQ_REDIS_ERROR,   /* -ERR ..., -BUSYGROUP ...   */
    MOEQ_REDIS_OTHER,   /* a RESP3 type (not requested by moeq) */
} moeq_redis_reply_type;

/*
 * Run one command given as argv (binary-safe; argv_len NULL means every
 * argument is a C string). On return *reply (when reply is not NULL) holds
 * whatever the server answered — error replies too, so callers can match a
 * prefix such as BUSYGROUP — or NULL when nothing was read. The caller frees it.
 *
 * Returns MOEQ_OK for any non-error reply; for an error reply the code mapped
 * from its prefix (LOADING, BUSY, TRYAGAIN, MASTERDOWN, READONLY -> TRANSIENT;
 * NOGROUP, NOSCRIPT -> NOT_FOUND; OOM -> LIMIT; others -> INVALID_ARG) with
 * errstr "redis <CMD>: <server message>"; MOEQ_ERR_TRANSIENT on connection
 * loss, MOEQ_ERR_TIMEOUT when command_timeout_ms passed (the connection is
 * dropped either way and re-made by the next command).
 */
moeq_err moeq_redis_command_argv(moeq_redis *redis, int argc, const char *const *argv, const size_t *argv_len,
                                 moeq_redis_reply **reply, char *errstr, size_t errstr_size);

/* printf-like convenience over hiredis's format ("%s", "%b" data+len). Same contract as _argv. */
moeq_err moeq_redis_command(moeq_redis *redis, moeq_redis_reply **reply, char *errstr, size_t errstr_size,
                            const char *fmt, ...);

/*
 * Pipelining: queue commands (no I/O), then read their replies in order with
 * moeq_redis_get_reply, one call per queued command. For batches of XACKs and
 * job-record updates in one round trip.
 */
moeq_err moeq_redis_append_argv(moeq_redis *redis, int argc, const char *const *argv, const size_t *argv_len,
                                char *errstr, size_t errstr_size);
moeq_err moeq_redis_get_reply(moeq_redis *redis, moeq_redis_reply **reply, char *errstr, size_t errstr_size);

/* Parse raw RESP bytes into a reply (a whole reply, nothing after it). Pure; for tests and tools. */
moeq_err moeq_redis_reply_parse(const char *resp, size_t len, moeq_redis_reply **reply, char *errstr,
                                size_t errstr_size);

void moeq_redis_reply_free(moeq_redis_reply *reply); /* top-level replies only; NULL is safe */

/* Accessors; returned pointers are borrowed from the reply. */
moeq_redis_reply_type moeq_redis_reply_type_of(const moeq_redis_reply *reply);
/* Bytes of a STRING, STATUS or ERROR reply (NUL-terminated); NULL otherwise. */
const char *moeq_redis_reply_str(const moeq_redis_reply *reply, size_t *len);
/* INTEGER value; for a STRING holding a decimal integer, its value; else 0. */
long long moeq_redis_reply_int(const moeq_redis_reply *reply);
size_t moeq_redis_reply_len(const moeq_redis_reply *reply);                         /* ARRAY size, else 0 */
const moeq_redis_reply *moeq_redis_reply_at(const moeq_redis_reply *reply, size_t i); /* NULL when out of range */
/* 1 when reply is an ERROR whose first word is code ("BUSYGROUP"). */
int moeq_redis_reply_is_error(const moeq_redis_reply *reply, const char *code);

/* ---- streams ------------------------------------------------------------ */

/* One stream entry, borrowed from the reply it came from. */
typedef struct moeq_redis_entry {
    const char *stream;              /* stream key (XREAD/XREADGROUP shape); NULL otherwise */
    const char *id;                  /* "1700000000000-0"                                   */
    const moeq_redis_reply *fields;  /* flat ARRAY name, value, ...; NULL: entry was deleted */
} moeq_redis_entry;

typedef enum moeq_redis_entries_shape {
    MOEQ_REDIS_XREAD,      /* XREAD/XREADGROUP: [[stream, [[id, fields], ...]], ...] or nil */
    MOEQ_REDIS_XRANGE,     /* XRANGE/XREVRANGE/XCLAIM: [[id, fields], ...]                  */
    MOEQ_REDIS_XAUTOCLAIM, /* XAUTOCLAIM: [next-cursor, [[id, fields], ...], [deleted ids]]   */
} moeq_redis_entries_shape;

/* Return nonzero to stop the walk early. */
typedef int (*moeq_redis_entry_fn)(const moeq_redis_entry *entry, void *opaque);

/*
 * Call fn for each entry of a stream reply of the given shape, in order.
 * MOEQ_ERR_FORMAT (naming the element) when the reply does not have that
 * shape. Pure.
 */
moeq_err moeq_redis_entries_foreach(const moeq_redis_reply *reply, moeq_redis_entries_shape shape,
                                    moeq_redis_entry_fn fn, void *opaque, char *errstr, size_t errstr_size);

/* The value of field name in an entry (the first match); NULL when absent. */
const char *moeq_redis_entry_get(const moeq_redis_entry *entry, const char *name, size_t *len);

/* XAUTOCLAIM's next cursor ("0-0" when the scan is complete); NULL when not that shape. */
const char *moeq_redis_autoclaim_cursor(const moeq_redis_reply *reply);

#ifdef __cplusplus
}
#endif
#endif
