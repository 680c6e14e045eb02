/* config.c — property tables, key = value files, MOEQ_* env, --flags. */
#define _POSIX_C_SOURCE 200809L
#include "moeq/config.h"
#include "moeq/log.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

extern char **environ;

/* ---- property tables ---------------------------------------------------- */

static const moeq_prop *prop_find(const moeq_prop *table, const char *key) {
    for (const moeq_prop *p = table; p->name; p++)
        if (strcmp(p->name, key) == 0) return p;
    return NULL;
}

static int parse_bool(const char *v, int *out) {
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) { *out = 1; return 1; }
        if (strcasecmp(v, no[i]) == 0) { *out = 0; return 1; }
    }
    return 0;
}

static moeq_err prop_set(const moeq_prop *p, void *params, const char *value, char *errstr, size_t n) {
    char *field = (char *)params + p->offset;
    char *end = NULL;
    errno = 0;
    if (p->type == MOEQ_PROP_INT_AUTO && strcasecmp(value, "auto") == 0) {
        if (p->size == sizeof(int)) *(int *)field = MOEQ_PROP_AUTO;
        else *(int64_t *)field = MOEQ_PROP_AUTO;
        return MOEQ_OK;
    }
    switch (p->type) {
    case MOEQ_PROP_INT_AUTO: /* a number otherwise */
    case MOEQ_PROP_INT: {
        long long v = strtoll(value, &end, 0);
        if (errno || end == value || *end)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "%s: '%s' is not an integer%s", p->name, value,
                             p->type == MOEQ_PROP_INT_AUTO ? " or auto" : "");
        if ((double)v < p->min || (double)v > p->max)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "%s: %lld is outside [%.0f, %.0f]", p->name, v,
                             p->min, p->max);
        if (p->size == sizeof(int)) *(int *)field = (int)v; /* an int field; the bounds keep v in range */
        else if (p->size == sizeof(int64_t)) *(int64_t *)field = v;
        else return moeq_errf(MOEQ_ERR_INTERNAL, errstr, n, "%s: integer field of %zu bytes", p->name, p->size);
        return MOEQ_OK;
    }
    case MOEQ_PROP_DOUBLE: {
        double v = strtod(value, &end);
        if (errno || end == value || *end || isnan(v))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "%s: '%s' is not a number", p->name, value);
        if (v < p->min || v > p->max)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "%s: %g is outside [%g, %g]", p->name, v, p->min,
                             p->max);
        *(double *)field = v;
        return MOEQ_OK;
    }
    case MOEQ_PROP_BOOL: {
        int v;
        if (!parse_bool(value, &v))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "%s: '%s' is not a boolean (true/false)", p->name,
                             value);
        *(int *)field = v;
        return MOEQ_OK;
    }
    case MOEQ_PROP_STR: {
        size_t len = strlen(value);
        if (len + 1 > p->size)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "%s: value of %zu bytes is longer than %zu", p->name,
                             len, p->size - 1);
        memcpy(field, value, len + 1);
        return MOEQ_OK;
    }
    }
    return moeq_errf(MOEQ_ERR_INTERNAL, errstr, n, "%s: unknown property type", p->name);
}

moeq_err moeq_props_defaults(const moeq_prop *table, void *params, char *errstr, size_t n) {
    for (const moeq_prop *p = table; p->name; p++) {
        moeq_err err = prop_set(p, params, p->def ? p->def : "", errstr, n);
        if (err) return err;
    }
    return MOEQ_OK;
}

moeq_err moeq_props_set(const moeq_prop *table, void *params, const char *key, const char *value, char *errstr,
                        size_t n) {
    const moeq_prop *p = prop_find(table, key);
    if (!p) return moeq_errf(MOEQ_ERR_NOT_FOUND, errstr, n, "unknown configuration key '%s'", key);
    return prop_set(p, params, value, errstr, n);
}

moeq_err moeq_props_get(const moeq_prop *table, const void *params, const char *key, char *out, size_t out_size) {
    const moeq_prop *p = prop_find(table, key);
    if (!p) return MOEQ_ERR_NOT_FOUND;
    const char *field = (const char *)params + p->offset;
    switch (p->type) {
    case MOEQ_PROP_INT:
    case MOEQ_PROP_INT_AUTO: {
        long long v = p->size == sizeof(int) ? (long long)*(const int *)field : (long long)*(const int64_t *)field;
        if (p->type == MOEQ_PROP_INT_AUTO && v == MOEQ_PROP_AUTO) snprintf(out, out_size, "auto");
        else snprintf(out, out_size, "%lld", v);
        break;
    }
    case MOEQ_PROP_DOUBLE: snprintf(out, out_size, "%g", *(const double *)field); break;
    case MOEQ_PROP_BOOL: snprintf(out, out_size, "%s", *(const int *)field ? "true" : "false"); break;
    case MOEQ_PROP_STR: snprintf(out, out_size, "%s", field); break;
    }
    return MOEQ_OK;
}

static const char *type_name(moeq_prop_type t) {
    switch (t) {
    case MOEQ_PROP_INT: return "int";
    case MOEQ_PROP_INT_AUTO: return "int or auto";
    case MOEQ_PROP_DOUBLE: return "float";
    case MOEQ_PROP_BOOL: return "bool";
    case MOEQ_PROP_STR: return "string";
    }
    return "?";
}

static void range_text(const moeq_prop *p, char *out, size_t n) {
    if (p->type == MOEQ_PROP_INT) snprintf(out, n, "%.0f .. %.0f", p->min, p->max);
    else if (p->type == MOEQ_PROP_INT_AUTO) snprintf(out, n, "%.0f .. %.0f, auto", p->min, p->max);
    else if (p->type == MOEQ_PROP_DOUBLE) snprintf(out, n, "%g .. %g", p->min, p->max);
    else snprintf(out, n, "-");
}

void moeq_props_print_help(const moeq_prop *table, FILE *out) {
    for (const moeq_prop *p = table; p->name; p++) {
        char range[96];
        range_text(p, range, sizeof range);
        fprintf(out, "  --%s=%s\n      %s (range %s, default '%s')\n", p->name, type_name(p->type), p->doc, range,
                p->def ? p->def : "");
    }
}

void moeq_props_print_markdown(const moeq_prop *table, FILE *out) {
    fprintf(out, "| key | type | range | default | meaning |\n| --- | --- | --- | --- | --- |\n");
    for (const moeq_prop *p = table; p->name; p++) {
        char range[96];
        range_text(p, range, sizeof range);
        fprintf(out, "| `%s` | %s | %s | `%s` | %s |\n", p->name, type_name(p->type), range, p->def ? p->def : "",
                p->doc);
    }
}

/* ---- pass-through key/value lists -------------------------------------- */

struct moeq_kvlist {
    char **keys, **values;
    size_t count, cap;
};

moeq_kvlist *moeq_kvlist_new(void) { return calloc(1, sizeof(moeq_kvlist)); }

void moeq_kvlist_destroy(moeq_kvlist *kv) {
    if (!kv) return;
    for (size_t i = 0; i < kv->count; i++) { free(kv->keys[i]); free(kv->values[i]); }
    free(kv->keys);
    free(kv->values);
    free(kv);
}

moeq_err moeq_kvlist_set(moeq_kvlist *kv, const char *key, const char *value) {
    char *v = strdup(value);
    if (!v) return MOEQ_ERR_NOMEM;
    for (size_t i = 0; i < kv->count; i++)
        if (strcmp(kv->keys[i], key) == 0) { free(kv->values[i]); kv->values[i] = v; return MOEQ_OK; }
    if (kv->count == kv->cap) {
        size_t cap = kv->cap ? kv->cap * 2 : 8;
        char **k = realloc(kv->keys, cap * sizeof *k);
        if (!k) { free(v); return MOEQ_ERR_NOMEM; }
        kv->keys = k;
        char **vs = realloc(kv->values, cap * sizeof *vs);
        if (!vs) { free(v); return MOEQ_ERR_NOMEM; }
        kv->values = vs;
        kv->cap = cap;
    }
    char *k = strdup(key);
    if (!k) { free(v); return MOEQ_ERR_NOMEM; }
    kv->keys[kv->count] = k;
    kv->values[kv->count] = v;
    kv->count++;
    return MOEQ_OK;
}

const char *moeq_kvlist_get(const moeq_kvlist *kv, const char *key) {
    for (size_t i = 0; i < kv->count; i++)
        if (strcmp(kv->keys[i], key) == 0) return kv->values[i];
    return NULL;
}

size_t moeq_kvlist_count(const moeq_kvlist *kv) { return kv ? kv->count : 0; }

void moeq_kvlist_at(const moeq_kvlist *kv, size_t i, const char **key, const char **value) {
    *key = kv->keys[i];
    *value = kv->values[i];
}

/* ---- sources ------------------------------------------------------------ */

/* Old names kept working for one vocabulary: every role now uses the new name. */
static const struct { const char *old, *key; } deprecated[] = {
    {"allowed_topics", "results_allowed_topics"}, /* the worker's name until 0.x */
    {"metrics_port", "http_port"},                /* the worker's name until 0.x */
    {"job_ttl_s", "dedupe_window_s"},             /* the worker's record TTL until 0.x */
    {"job_record_ttl_s", "dedupe_window_s"},      /* the coordinator's record TTL until 0.x */
};

static const char *resolve_alias(const moeq_prop *table, const char *key) {
    for (size_t i = 0; i < sizeof deprecated / sizeof deprecated[0]; i++)
        if (!strcmp(key, deprecated[i].old) && prop_find(table, deprecated[i].key)) {
            moeq_log(MOEQ_LOG_WARN, "config", "deprecated_key", "key=%s use=%s", key, deprecated[i].key);
            return deprecated[i].key;
        }
    return key;
}

static int is_alias(const moeq_prop *table, const char *key) {
    for (size_t i = 0; i < sizeof deprecated / sizeof deprecated[0]; i++)
        if (!strcmp(key, deprecated[i].old) && prop_find(table, deprecated[i].key)) return 1;
    return 0;
}

moeq_err moeq_config_apply(const moeq_config_src *src, const char *key, const char *value, char *errstr, size_t n) {
    key = resolve_alias(src->table, key);
    if (strncmp(key, "kafka.", 6) == 0 && src->kafka) {
        if (!key[6]) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "empty kafka.* key");
        return moeq_kvlist_set(src->kafka, key + 6, value) ? moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "out of memory")
                                                           : MOEQ_OK;
    }
    if (strncmp(key, "redis.", 6) == 0 && src->redis) {
        if (!key[6]) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "empty redis.* key");
        return moeq_kvlist_set(src->redis, key + 6, value) ? moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "out of memory")
                                                           : MOEQ_OK;
    }
    return moeq_props_set(src->table, src->params, key, value, errstr, n);
}

/*
 * A key this role's table lacks, read from a shared file: a key of another
 * role is parsed into scratch space (a malformed value is an error wherever it
 * is read) and ignored; a key no role knows is a warning.
 */
static moeq_err apply_foreign(const moeq_config_src *src, const char *key, const char *value, const char *where,
                              char *errstr, size_t n) {
    if (!strncmp(key, "kafka.", 6) || !strncmp(key, "redis.", 6)) return MOEQ_OK; /* the adapters check them */
    for (const moeq_prop *const *t = src->others; *t; t++) {
        const moeq_prop *p = prop_find(*t, key);
        if (!p) continue;
        char *scratch = calloc(1, p->offset + p->size);
        if (!scratch) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "out of memory");
        moeq_err err = prop_set(p, scratch, value, errstr, n);
        free(scratch);
        if (!err) moeq_log(MOEQ_LOG_DEBUG, "config", "other_role_key", "key=%s at=%s", key, where);
        return err;
    }
    moeq_log(MOEQ_LOG_WARN, "config", "unknown_key", "key=%s at=%s msg=\"no role knows this key; ignored\"", key,
             where);
    return MOEQ_OK;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    return s;
}

moeq_err moeq_config_load_file(const moeq_config_src *src, const char *path, char *errstr, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return moeq_errf(MOEQ_ERR_IO, errstr, n, "config %s: %s", path, strerror(errno));
    char line[4096];
    int lineno = 0;
    moeq_err err = MOEQ_OK;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            err = moeq_errf(MOEQ_ERR_LIMIT, errstr, n, "config %s:%d: line longer than %zu bytes", path, lineno,
                            sizeof line - 2);
            break;
        }
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            err = moeq_errf(MOEQ_ERR_PARSE, errstr, n, "config %s:%d: expected 'key = value'", path, lineno);
            break;
        }
        *eq = 0;
        char *key = trim(s), *value = trim(eq + 1);
        size_t vl = strlen(value);
        if (vl >= 2 && value[0] == '"' && value[vl - 1] == '"') { value[vl - 1] = 0; value++; }
        char sub[512];
        err = moeq_config_apply(src, key, value, sub, sizeof sub);
        if (err == MOEQ_ERR_NOT_FOUND && src->others) {
            char where[300];
            snprintf(where, sizeof where, "%s:%d", path, lineno);
            err = apply_foreign(src, key, value, where, sub, sizeof sub);
        }
        if (err) {
            moeq_errf(err, errstr, n, "config %s:%d: %s", path, lineno, sub);
            break;
        }
    }
    fclose(f);
    return err;
}

/* env name for key: MOEQ_ + upper(key) with '.'/'-' -> '_' */
static void env_name(const char *key, char *out, size_t n) {
    size_t o = (size_t)snprintf(out, n, "MOEQ_");
    for (const char *p = key; *p && o + 1 < n; p++)
        out[o++] = (*p == '.' || *p == '-') ? '_' : (char)toupper((unsigned char)*p);
    out[o] = 0;
}

static moeq_err apply_passthrough_env(moeq_kvlist *kv, const char *prefix, char *errstr, size_t n) {
    size_t plen = strlen(prefix);
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, prefix, plen) != 0) continue;
        const char *eq = strchr(*e, '=');
        if (!eq) continue;
        char key[256];
        size_t o = 0;
        for (const char *p = *e + plen; p < eq && o + 1 < sizeof key; p++) {
            if (p[0] == '_' && p[1] == '_') { key[o++] = '.'; p++; }
            else key[o++] = (char)tolower((unsigned char)*p);
        }
        key[o] = 0;
        if (moeq_kvlist_set(kv, key, eq + 1)) return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "out of memory");
    }
    return MOEQ_OK;
}

moeq_err moeq_config_apply_env(const moeq_config_src *src, char *errstr, size_t n) {
    for (size_t i = 0; i < sizeof deprecated / sizeof deprecated[0]; i++) { /* before the new names: they win */
        char name[256];
        env_name(deprecated[i].old, name, sizeof name);
        const char *v = getenv(name);
        if (!v || !is_alias(src->table, deprecated[i].old)) continue;
        char sub[512];
        moeq_err err = moeq_config_apply(src, deprecated[i].old, v, sub, sizeof sub);
        if (err) return moeq_errf(err, errstr, n, "environment %s: %s", name, sub);
    }
    for (const moeq_prop *p = src->table; p->name; p++) {
        char name[256];
        env_name(p->name, name, sizeof name);
        const char *v = getenv(name);
        if (!v) continue;
        char sub[512];
        moeq_err err = prop_set(p, src->params, v, sub, sizeof sub);
        if (err) return moeq_errf(err, errstr, n, "environment %s: %s", name, sub);
    }
    moeq_err err = MOEQ_OK;
    if (src->kafka) err = apply_passthrough_env(src->kafka, "MOEQ_KAFKA__", errstr, n);
    if (!err && src->redis) err = apply_passthrough_env(src->redis, "MOEQ_REDIS__", errstr, n);
    return err;
}

moeq_err moeq_config_apply_args(const moeq_config_src *src, int argc, char **argv, int *argc_out, char *errstr,
                                size_t n) {
    int out = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || !a[2]) { argv[out++] = argv[i]; continue; }
        char key[256];
        const char *value = NULL;
        const char *eq = strchr(a + 2, '=');
        size_t klen = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (klen >= sizeof key) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "flag %s is too long", a);
        memcpy(key, a + 2, klen);
        key[klen] = 0;
        for (char *p = key; *p; p++)
            if (*p == '-') *p = '_';
        int is_config = strcmp(key, "config") == 0;
        int known = is_config || prop_find(src->table, key) || is_alias(src->table, key) || (src->kafka && strncmp(key, "kafka.", 6) == 0) ||
                    (src->redis && strncmp(key, "redis.", 6) == 0);
        if (!known) { argv[out++] = argv[i]; continue; }
        if (eq) value = eq + 1;
        else if (i + 1 < argc) value = argv[++i];
        else return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "flag --%s needs a value", key);
        moeq_err err = is_config ? moeq_config_load_file(src, value, errstr, n)
                                 : moeq_config_apply(src, key, value, errstr, n);
        if (err) return err;
    }
    argv[out] = NULL;
    *argc_out = out;
    return MOEQ_OK;
}

moeq_err moeq_config_load(const moeq_config_src *src, int argc, char **argv, int *argc_out, char *errstr,
                          size_t n) {
    int m = 1;
    moeq_err err = MOEQ_OK;
    for (int i = 1; i < argc && !err; i++) {
        const char *file = NULL;
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, n, "flag --config needs a value");
            file = argv[++i];
        } else if (!strncmp(argv[i], "--config=", 9)) {
            file = argv[i] + 9;
        } else {
            argv[m++] = argv[i];
            continue;
        }
        err = moeq_config_load_file(src, file, errstr, n);
    }
    if (err) return err;
    argv[m] = NULL;
    if ((err = moeq_config_apply_env(src, errstr, n))) return err;
    return moeq_config_apply_args(src, m, argv, argc_out, errstr, n);
}

void moeq_props_print_markdown_section(const char *title, const char *intro, const moeq_prop *table, FILE *out) {
    fprintf(out, "## %s\n\n", title);
    if (intro && *intro) fprintf(out, "%s\n\n", intro);
    moeq_props_print_markdown(table, out);
    fprintf(out, "\n");
}

moeq_prop *moeq_props_append(moeq_prop *table, size_t *len, size_t cap, const moeq_prop *part, size_t n, size_t base) {
    for (size_t i = 0; (n ? i < n : part[i].name != NULL) && *len < cap; i++) {
        table[*len] = part[i];
        table[(*len)++].offset += base;
    }
    memset(&table[*len], 0, sizeof table[*len]);
    return table;
}
