/*
 * gjson.c — a small JSON reader for schemas: a tree of gj values with keys
 * in document order (properties are generated in that order) and numbers
 * that remember whether they were written as integers. The job decoder has
 * already validated the bytes (UTF-8, duplicates in the job map); this only
 * has to build the tree, strictly and with bounded depth.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

typedef struct rd {
    const char *p, *end;
    int max_depth;
    char *errstr;
    size_t errstr_size;
    int failed;
} rd;

static void *fail(rd *r, const char *what) {
    if (!r->failed) moeq_errf(MOEQ_ERR_PARSE, r->errstr, r->errstr_size, "schema JSON: %s", what);
    r->failed = 1;
    return NULL;
}

static void ws(rd *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static int hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *d, unsigned cp) {
    if (cp < 0x80) return d[0] = (char)cp, 1;
    if (cp < 0x800) return d[0] = (char)(0xC0 | (cp >> 6)), d[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12)), d[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18)), d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string starting at the quote; decoded into a malloc'd buffer. */
static char *string(rd *r, size_t *len) {
    r->p++;
    const char *s = r->p;
    while (r->p < r->end && *r->p != '"') r->p += *r->p == '\\' ? 2 : 1;
    if (r->p >= r->end) return fail(r, "unterminated string");
    char *out = malloc((size_t)(r->p - s) + 1), *o = out;
    if (!out) return fail(r, "out of memory");
    for (const char *q = s; q < r->p; q++) {
        if ((unsigned char)*q < 0x20) return free(out), fail(r, "control character in a string");
        if (*q != '\\') {
            *o++ = *q;
            continue;
        }
        char c = *++q;
        unsigned cp;
        switch (c) {
        case '"': case '\\': case '/': *o++ = c; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u':
            if (r->p - q < 5 || hex4(q + 1, &cp)) return free(out), fail(r, "bad \\u escape");
            q += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && r->p - q >= 7 && q[1] == '\\' && q[2] == 'u') {
                unsigned lo;
                if (!hex4(q + 3, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    q += 6;
                }
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) return free(out), fail(r, "lone surrogate escape");
            o += put_utf8(o, cp);
            break;
        default: return free(out), fail(r, "bad escape");
        }
    }
    r->p++;
    *o = 0;
    *len = (size_t)(o - out);
    return out;
}

static gj *value(rd *r, int depth);

static int push(gj *v, gj *item, char *key) {
    if ((v->n & (v->n - 1)) == 0 || v->n == 0) { /* grow at powers of two */
        size_t cap = v->n ? v->n * 2 : 4;
        gj **items = realloc(v->items, cap * sizeof *items);
        if (!items) return -1;
        v->items = items;
        if (v->type == GJ_OBJ) {
            char **keys = realloc(v->keys, cap * sizeof *keys);
            if (!keys) return -1;
            v->keys = keys;
        }
    }
    v->items[v->n] = item;
    if (v->type == GJ_OBJ) v->keys[v->n] = key;
    v->n++;
    return 0;
}

static gj *container(rd *r, gj *v, int depth) {
    char close = v->type == GJ_OBJ ? '}' : ']';
    r->p++;
    ws(r);
    if (r->p < r->end && *r->p == close) return r->p++, v;
    for (;;) {
        char *key = NULL;
        size_t klen;
        ws(r);
        if (v->type == GJ_OBJ) {
            if (r->p >= r->end || *r->p != '"') return fail(r, "expected a key");
            if (!(key = string(r, &klen))) return NULL;
            ws(r);
            if (r->p >= r->end || *r->p != ':') return free(key), fail(r, "expected ':'");
            r->p++;
        }
        gj *item = value(r, depth + 1);
        if (!item || push(v, item, key) < 0) {
            free(key);
            gj_free(item);
            return item ? fail(r, "out of memory") : NULL;
        }
        ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == close) return r->p++, v;
        return fail(r, v->type == GJ_OBJ ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static gj *number(rd *r, gj *v) {
    const char *s = r->p;
    if (r->p < r->end && *r->p == '-') r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return fail(r, "bad value");
    if (*r->p == '0') r->p++;
    else while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    v->is_int = 1;
    if (r->p < r->end && *r->p == '.') {
        v->is_int = 0, r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return fail(r, "bad number");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        v->is_int = 0, r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return fail(r, "bad number");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    char tmp[64];
    size_t n = (size_t)(r->p - s);
    if (n >= sizeof tmp) n = sizeof tmp - 1;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    v->num = strtod(tmp, NULL);
    if (!isfinite(v->num)) return fail(r, "number out of range");
    return v;
}

static int word(rd *r, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, w, n)) return 0;
    r->p += n;
    return 1;
}

static gj *value(rd *r, int depth) {
    if (depth > r->max_depth) return fail(r, "nested too deeply");
    ws(r);
    if (r->p >= r->end) return fail(r, "unexpected end");
    gj *v = calloc(1, sizeof *v);
    if (!v) return fail(r, "out of memory");
    v->raw = r->p;
    gj *ok = NULL;
    char c = *r->p;
    if (c == '{' || c == '[') {
        v->type = c == '{' ? GJ_OBJ : GJ_ARR;
        ok = container(r, v, depth);
    } else if (c == '"') {
        v->type = GJ_STR;
        ok = (v->str = string(r, &v->len)) ? v : NULL;
    } else if (word(r, "true") || word(r, "false")) {
        v->type = GJ_BOOL, v->b = c == 't', ok = v;
    } else if (word(r, "null")) {
        v->type = GJ_NULL, ok = v;
    } else {
        v->type = GJ_NUM;
        ok = number(r, v);
    }
    if (!ok) return gj_free(v), NULL;
    v->raw_len = (size_t)(r->p - v->raw);
    return v;
}

gj *gj_parse(const char *text, size_t len, int max_depth, char *errstr, size_t errstr_size) {
    rd r = {text, text + len, max_depth, errstr, errstr_size, 0};
    gj *v = value(&r, 1);
    if (!v) return NULL;
    ws(&r);
    if (r.p != r.end) return gj_free(v), fail(&r, "trailing bytes");
    return v;
}

void gj_free(gj *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        gj_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

const gj *gj_get(const gj *obj, const char *key) {
    if (!obj || obj->type != GJ_OBJ) return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (!strcmp(obj->keys[i], key)) return obj->items[i];
    return NULL;
}

static int put(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return -1;
        *buf = b, *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

static int put_str(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (put(buf, len, cap, "\"", 1)) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            if (put(buf, len, cap, esc, 2)) return -1;
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            if (put(buf, len, cap, esc, 6)) return -1;
        } else if (put(buf, len, cap, (const char *)&s[i], 1)) {
            return -1;
        }
    }
    return put(buf, len, cap, "\"", 1);
}

int gj_write(const gj *v, char **buf, size_t *len, size_t *cap) {
    switch (v->type) {
    case GJ_NULL: return put(buf, len, cap, "null", 4);
    case GJ_BOOL: return v->b ? put(buf, len, cap, "true", 4) : put(buf, len, cap, "false", 5);
    case GJ_NUM: return put(buf, len, cap, v->raw, v->raw_len); /* as written: 1.50 stays 1.50 */
    case GJ_STR: return put_str(buf, len, cap, v->str, v->len);
    case GJ_ARR:
    case GJ_OBJ:
        if (put(buf, len, cap, v->type == GJ_ARR ? "[" : "{", 1)) return -1;
        for (size_t i = 0; i < v->n; i++) {
            if (i && put(buf, len, cap, ",", 1)) return -1;
            if (v->type == GJ_OBJ &&
                (put_str(buf, len, cap, v->keys[i], strlen(v->keys[i])) || put(buf, len, cap, ":", 1)))
                return -1;
            if (gj_write(v->items[i], buf, len, cap)) return -1;
        }
        return put(buf, len, cap, v->type == GJ_ARR ? "]" : "}", 1);
    }
    return -1;
}
