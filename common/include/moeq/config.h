/*
 * moeq/config.h — configuration as a params struct plus `key = value`.
 *
 * Each module describes its params struct with one property table (name,
 * type, bounds, default, doc). That table drives defaults, parsing of config
 * files, MOEQ_* environment overrides, --key=value flags, --help and the
 * generated docs/CONFIGURATION.md, so the four can never disagree.
 *
 * Keys under a pass-through prefix (`kafka.`, `redis.`) are not interpreted
 * here: they are collected into a moeq_kvlist and handed to librdkafka /
 * hiredis unchanged, so SASL/TLS and tuning need no code changes.
 *
 * Not thread-safe: configuration is read once at start-up.
 */
#ifndef MOEQ_CONFIG_H
#define MOEQ_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moeq_prop_type {
    MOEQ_PROP_INT,    /* int64_t field, or int when size == sizeof(int) */
    MOEQ_PROP_DOUBLE, /* double field                          */
    MOEQ_PROP_BOOL,   /* int field, 0/1; true/false/yes/no/on/off */
    MOEQ_PROP_STR,    /* char[size] field, NUL-terminated      */
    MOEQ_PROP_INT_AUTO, /* MOEQ_PROP_INT that also takes `auto`, stored as MOEQ_PROP_AUTO */
} moeq_prop_type;

/* The value `auto` gives a MOEQ_PROP_INT_AUTO field (outside its numeric range, which must not hold it). */
#define MOEQ_PROP_AUTO (-1)

typedef struct moeq_prop {
    const char *name;     /* "max_batch_jobs"                          */
    moeq_prop_type type;
    size_t offset;        /* offsetof(params struct, field)            */
    size_t size;          /* sizeof(field); the buffer size for STR    */
    double min, max;      /* inclusive bounds for INT and DOUBLE       */
    const char *def;      /* default, as text                          */
    const char *doc;      /* one line: meaning, unit                   */
} moeq_prop;

/* Terminate tables with MOEQ_PROP_END. */
#define MOEQ_PROP_END {0}

/* Set every field of params to its table default. */
moeq_err moeq_props_defaults(const moeq_prop *table, void *params, char *errstr, size_t errstr_size);

/*
 * Building a role's whole table from parts (its own keys, then shared tables
 * such as the job limits that live in a nested struct): appends the entries
 * of part (up to its terminator, or n of them when n > 0) to table, which
 * holds *len entries and has room for cap (one more is kept for the
 * terminator, written after each call), each offset moved by base (offsetof
 * the nested struct, 0 for the role's own). Returns table. Entries beyond cap
 * are dropped: size cap for every part.
 */
moeq_prop *moeq_props_append(moeq_prop *table, size_t *len, size_t cap, const moeq_prop *part, size_t n, size_t base);

/*
 * Parse value into the field named key. Returns MOEQ_ERR_NOT_FOUND for a key
 * the table does not have, MOEQ_ERR_INVALID_ARG (message names key, value and
 * bound) for a value of the wrong type or out of range.
 */
moeq_err moeq_props_set(const moeq_prop *table, void *params, const char *key,
                        const char *value, char *errstr, size_t errstr_size);

/* Write the current value of key as text. */
moeq_err moeq_props_get(const moeq_prop *table, const void *params, const char *key,
                        char *out, size_t out_size);

/* --help text: one block per property with type, range, default, doc. */
void moeq_props_print_help(const moeq_prop *table, FILE *out);

/* Markdown table of the properties, for docs/CONFIGURATION.md. */
void moeq_props_print_markdown(const moeq_prop *table, FILE *out);

/* An ordered list of pass-through key/value pairs (kafka.*, redis.*). */
typedef struct moeq_kvlist moeq_kvlist;

moeq_kvlist *moeq_kvlist_new(void);
void moeq_kvlist_destroy(moeq_kvlist *kv); /* NULL is safe */
/* Replaces an existing key. Copies key and value. */
moeq_err moeq_kvlist_set(moeq_kvlist *kv, const char *key, const char *value);
/* Borrowed, valid until the next set or destroy; NULL when absent. */
const char *moeq_kvlist_get(const moeq_kvlist *kv, const char *key);
size_t moeq_kvlist_count(const moeq_kvlist *kv);
/* i-th pair in insertion order; borrowed. */
void moeq_kvlist_at(const moeq_kvlist *kv, size_t i, const char **key, const char **value);

/*
 * A loaded configuration: the module's params plus pass-through lists.
 * Sources apply in order file < environment < flags, each overriding the last.
 */
typedef struct moeq_config_src {
    const moeq_prop *table;  /* the module's property table              */
    void *params;            /* the module's params struct, defaults set */
    moeq_kvlist *kafka;      /* receives kafka.* keys (prefix stripped); may be NULL */
    moeq_kvlist *redis;      /* receives redis.* keys (prefix stripped); may be NULL */
    /*
     * The other roles' tables (NULL-terminated), or NULL. When set, a config
     * file is the one shared file of every role: a key of another role is
     * checked (a malformed value is still an error) and ignored, and a key no
     * role knows is a warning naming it, not an error. When NULL, a key the
     * table lacks is an error (a file for this module alone).
     */
    const moeq_prop *const *others;
} moeq_config_src;

/*
 * Apply one key. Unknown keys are an error naming the key (typos must not
 * pass silently). A deprecated name (allowed_topics, metrics_port, job_ttl_s,
 * job_record_ttl_s) is applied
 * under its new name with a warning.
 */
moeq_err moeq_config_apply(const moeq_config_src *src, const char *key, const char *value,
                           char *errstr, size_t errstr_size);

/*
 * Read a `key = value` file: '#' starts a comment, blank lines skipped,
 * whitespace around key and value trimmed, value may be "double-quoted".
 * Errors name the file and line. Keys the table lacks: see `others` above.
 */
moeq_err moeq_config_load_file(const moeq_config_src *src, const char *path,
                               char *errstr, size_t errstr_size);

/*
 * Apply MOEQ_<KEY> environment variables: key upper-cased with '.' and '-'
 * as '_' (max_batch_jobs <- MOEQ_MAX_BATCH_JOBS). Pass-through keys are read
 * from MOEQ_KAFKA__<rest> / MOEQ_REDIS__<rest> with '__' meaning '.'
 * (kafka.bootstrap.servers <- MOEQ_KAFKA__BOOTSTRAP__SERVERS), and, for the
 * common case, MOEQ_KAFKA_BROKERS / MOEQ_REDIS_URL are table keys.
 */
moeq_err moeq_config_apply_env(const moeq_config_src *src, char *errstr, size_t errstr_size);

/*
 * Apply `--key=value` / `--key value` flags from argv (argv[0] skipped).
 * Arguments that are not flags of the table (and not kafka./redis.) are left
 * for the caller: *argc_out receives the count of the remaining arguments,
 * compacted to the front of argv. `--config FILE` is loaded in place.
 */
moeq_err moeq_config_apply_args(const moeq_config_src *src, int argc, char **argv, int *argc_out,
                                char *errstr, size_t errstr_size);

/*
 * The one precedence every process uses: every `--config FILE` (or
 * --config=FILE) of argv first, then MOEQ_* environment, then the other
 * --key=value flags, each overriding the last. argv and *argc_out as for
 * moeq_config_apply_args.
 */
moeq_err moeq_config_load(const moeq_config_src *src, int argc, char **argv, int *argc_out,
                          char *errstr, size_t errstr_size);

/*
 * The configuration reference: for each table a "## title" section with its
 * Markdown table (docs/CONFIGURATION.md is this output, see `moeq config-docs`).
 */
void moeq_props_print_markdown_section(const char *title, const char *intro, const moeq_prop *table, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
