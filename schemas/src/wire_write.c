/*
 * wire_write.c — the writer behind the result, job and batch encoders:
 * msgpack (smallest encoding of each integer, str8/16/32, float64) or
 * compact JSON, appended to a moeq_buf. Errors are sticky in w->err so
 * encoders check once at the end.
 *
 * It does not validate structure: the encoders call it in a valid order and
 * the tests decode what it wrote with independent decoders.
 */
#include "wire_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/util.h"

void ww_init(ww *w, moeq_buf *out, moeq_wire_format fmt) {
    memset(w, 0, sizeof *w);
    w->out = out;
    w->fmt = fmt;
}

static void put(ww *w, const void *bytes, size_t n) {
    if (w->err == MOEQ_OK) w->err = moeq_buf_append(w->out, bytes, n);
}

static void put_be(ww *w, uint8_t tag, uint64_t x, int n) {
    uint8_t b[9];
    b[0] = tag;
    for (int i = 0; i < n; i++) b[1 + i] = (uint8_t)(x >> (8 * (n - 1 - i)));
    put(w, b, 1 + (size_t)n);
}

/* JSON: a ',' before every entry but the first of its container (keys count; values after ':' do not). */
static void js_sep(ww *w) {
    if (w->fmt != MOEQ_WIRE_JSON) return;
    if (w->depth < 0 || w->depth > MOEQ_JOB_DEPTH_HARD_MAX) return;
    if (w->comma[w->depth] == 2) { /* value after a key */
        w->comma[w->depth] = 1;
        return;
    }
    if (w->comma[w->depth]) put(w, ",", 1);
    w->comma[w->depth] = 1;
}

static void mp_len(ww *w, uint64_t n, uint8_t fix, uint8_t fix_max, uint8_t t8, uint8_t t16, uint8_t t32) {
    if (n <= fix_max) { uint8_t b = (uint8_t)(fix | n); put(w, &b, 1); }
    else if (t8 && n <= 0xff) put_be(w, t8, n, 1);
    else if (n <= 0xffff) put_be(w, t16, n, 2);
    else put_be(w, t32, n, 4);
}

static void open_container(ww *w, uint32_t n, int map) {
    js_sep(w);
    if (w->fmt == MOEQ_WIRE_JSON) {
        put(w, map ? "{" : "[", 1);
        if (w->depth >= MOEQ_JOB_DEPTH_HARD_MAX) { w->err = MOEQ_ERR_LIMIT; return; }
        w->comma[++w->depth] = 0;
        return;
    }
    if (map) mp_len(w, n, 0x80, 0x0f, 0, 0xde, 0xdf);
    else mp_len(w, n, 0x90, 0x0f, 0, 0xdc, 0xdd);
}

void ww_map(ww *w, uint32_t n) { open_container(w, n, 1); }
void ww_array(ww *w, uint32_t n) { open_container(w, n, 0); }

static void close_container(ww *w, const char *c) {
    if (w->fmt != MOEQ_WIRE_JSON) return;
    put(w, c, 1);
    if (w->depth > 0) w->depth--;
}

void ww_end_map(ww *w) { close_container(w, "}"); }
void ww_end_array(ww *w) { close_container(w, "]"); }

static void js_string(ww *w, const char *s, size_t len) {
    static const char hex[] = "0123456789abcdef";
    put(w, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        put(w, s + run, i - run);
        run = i + 1;
        char e[7] = {'\\', 0};
        size_t n = 2;
        switch (c) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        default:
            memcpy(e + 1, "u00", 3);
            e[4] = hex[c >> 4];
            e[5] = hex[c & 15];
            n = 6;
        }
        put(w, e, n);
    }
    put(w, s + run, len - run);
    put(w, "\"", 1);
}

void ww_key(ww *w, const char *key) {
    ww_str(w, key, strlen(key));
    if (w->fmt == MOEQ_WIRE_JSON) {
        put(w, ":", 1);
        if (w->depth <= MOEQ_JOB_DEPTH_HARD_MAX) w->comma[w->depth] = 2;
    }
}

void ww_str(ww *w, const char *s, size_t len) {
    js_sep(w);
    if (w->fmt == MOEQ_WIRE_JSON) {
        js_string(w, s, len);
        return;
    }
    mp_len(w, len, 0xa0, 0x1f, 0xd9, 0xda, 0xdb);
    put(w, s, len);
}

/* Bytes of s once every invalid sequence became U+FFFD (3 bytes); copy into dst when not NULL. */
static size_t lossy(const char *s, size_t len, char *dst) {
    size_t o = 0, i = 0;
    while (i < len) {
        size_t bad = len - i;
        int ok = moeq_utf8_valid(s + i, len - i, &bad);
        if (dst) memcpy(dst + o, s + i, bad);
        o += bad;
        i += bad;
        if (ok) break;
        if (dst) memcpy(dst + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += 1;
    }
    return o;
}

void ww_str_lossy(ww *w, const char *s) { ww_str_lossy_n(w, s, strlen(s)); }

void ww_str_lossy_n(ww *w, const char *s, size_t len) {
    if (moeq_utf8_valid(s, len, NULL)) {
        ww_str(w, s, len);
        return;
    }
    size_t n = lossy(s, len, NULL);
    char *tmp = malloc(n + 1);
    if (!tmp) {
        if (w->err == MOEQ_OK) w->err = MOEQ_ERR_NOMEM;
        return;
    }
    lossy(s, len, tmp);
    ww_str(w, tmp, n);
    free(tmp);
}

void ww_int(ww *w, int64_t x) {
    js_sep(w);
    if (w->fmt == MOEQ_WIRE_JSON) {
        char b[24];
        int n = snprintf(b, sizeof b, "%" PRId64, x);
        put(w, b, (size_t)n);
        return;
    }
    if (x >= 0) {
        if (x <= 0x7f) { uint8_t b = (uint8_t)x; put(w, &b, 1); }
        else if (x <= 0xff) put_be(w, 0xcc, (uint64_t)x, 1);
        else if (x <= 0xffff) put_be(w, 0xcd, (uint64_t)x, 2);
        else if (x <= 0xffffffffLL) put_be(w, 0xce, (uint64_t)x, 4);
        else put_be(w, 0xcf, (uint64_t)x, 8);
        return;
    }
    if (x >= -32) { uint8_t b = (uint8_t)(int8_t)x; put(w, &b, 1); }
    else if (x >= INT8_MIN) put_be(w, 0xd0, (uint64_t)x & 0xff, 1);
    else if (x >= INT16_MIN) put_be(w, 0xd1, (uint64_t)x & 0xffff, 2);
    else if (x >= INT32_MIN) put_be(w, 0xd2, (uint64_t)x & 0xffffffff, 4);
    else put_be(w, 0xd3, (uint64_t)x, 8);
}

void ww_uint(ww *w, uint64_t x) {
    if (x <= INT64_MAX) {
        ww_int(w, (int64_t)x);
        return;
    }
    js_sep(w);
    if (w->fmt == MOEQ_WIRE_JSON) {
        char b[24];
        int n = snprintf(b, sizeof b, "%" PRIu64, x);
        put(w, b, (size_t)n);
        return;
    }
    put_be(w, 0xcf, x, 8);
}

void ww_double(ww *w, double x) {
    if (!isfinite(x)) { /* neither format's consumers agree on these; callers never write them */
        if (w->err == MOEQ_OK) w->err = MOEQ_ERR_INVALID_ARG;
        return;
    }
    js_sep(w);
    if (w->fmt == MOEQ_WIRE_JSON) {
        char b[32];
        int n = snprintf(b, sizeof b, "%.15g", x); /* shortest form that reads back exactly */
        if (strtod(b, NULL) != x) n = snprintf(b, sizeof b, "%.17g", x);
        /* keep it a JSON float so a reader sees the intended type */
        if (!strpbrk(b, ".eE") && (size_t)n + 2 < sizeof b) {
            memcpy(b + n, ".0", 3);
            n += 2;
        }
        put(w, b, (size_t)n);
        return;
    }
    uint64_t bits;
    memcpy(&bits, &x, 8);
    put_be(w, 0xcb, bits, 8);
}

void ww_bool(ww *w, int b) {
    js_sep(w);
    if (w->fmt == MOEQ_WIRE_JSON) put(w, b ? "true" : "false", b ? 4 : 5);
    else put(w, b ? "\xc3" : "\xc2", 1);
}

void ww_nil(ww *w) {
    js_sep(w);
    if (w->fmt == MOEQ_WIRE_JSON) put(w, "null", 4);
    else put(w, "\xc0", 1);
}

void ww_bin(ww *w, const void *bytes, size_t len) {
    js_sep(w);
    if (w->fmt == MOEQ_WIRE_JSON) {
        if (w->err == MOEQ_OK) w->err = MOEQ_ERR_INVALID_ARG;
        return;
    }
    mp_len(w, len, 0, 0, 0xc4, 0xc5, 0xc6);
    put(w, bytes, len);
}

void ww_raw(ww *w, const void *bytes, size_t len) {
    js_sep(w);
    put(w, bytes, len);
}

/* ---- transcoding one value -------------------------------------------- */

/* Entries of the container whose head was just read (JSON needs a counting pass; msgpack declares it). */
static int count_entries(wrd *r, const wval *c, int depth, uint64_t *n) {
    if (r->fmt != MOEQ_WIRE_JSON) {
        *n = c->count;
        return 0;
    }
    /* A probe walks the container once (validating it) to count its entries. */
    wrd probe = *r;
    witer it;
    uint64_t k = 0;
    if (wrd_iter_begin(&probe, c, depth, &it) < 0) {
        *r = probe;
        return -1;
    }
    int more;
    while ((more = wrd_iter_next(&probe, &it)) == 1) {
        wval x;
        if (c->type == WV_MAP && (wrd_key(&probe, &x) < 0 || wrd_skip(&probe, &x, depth + 1) < 0)) break;
        if (wrd_head(&probe, &x) < 0 || wrd_skip(&probe, &x, depth + 1) < 0) break;
        k++;
    }
    if (more != 0) {
        *r = probe;
        return -1;
    }
    *n = k;
    return 0;
}

static int transcode(ww *w, wrd *r, const wval *v, int depth) {
    switch (v->type) {
    case WV_NIL: ww_nil(w); return 0;
    case WV_BOOL: ww_bool(w, v->b); return 0;
    case WV_INT: ww_int(w, v->i); return 0;
    case WV_UINT: ww_uint(w, v->u); return 0;
    case WV_FLOAT:
        if (!isfinite(v->f)) return wrd_fail(r, MOEQ_JOB_REJECT_OUT_OF_RANGE, "a NaN or infinite float has no JSON form");
        ww_double(w, v->f);
        return 0;
    case WV_STR: {
        char *s = wrd_strdup(r, v);
        if (!s) return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED, "out of memory");
        ww_str(w, s, v->dec_len);
        free(s);
        return 0;
    }
    case WV_BIN:
    case WV_EXT:
        if (w->fmt == MOEQ_WIRE_JSON)
            return wrd_fail(r, MOEQ_JOB_REJECT_WRONG_TYPE, "msgpack %s has no JSON form", wval_type_name(v));
        ww_raw(w, v->start, (size_t)(r->p - v->start));
        return 0;
    case WV_ARRAY:
    case WV_MAP: break;
    }
    uint64_t n;
    if (count_entries(r, v, depth, &n) < 0) return -1;
    if (n > UINT32_MAX) return wrd_fail(r, MOEQ_JOB_REJECT_TOO_LARGE, "container of %llu entries", (unsigned long long)n);
    witer it;
    if (wrd_iter_begin(r, v, depth, &it) < 0) return -1;
    if (v->type == WV_MAP) ww_map(w, (uint32_t)n);
    else ww_array(w, (uint32_t)n);
    int more;
    while ((more = wrd_iter_next(r, &it)) == 1) {
        wval x;
        if (v->type == WV_MAP) {
            if (wrd_key(r, &x) < 0) return -1;
            if (x.type != WV_STR && w->fmt == MOEQ_WIRE_JSON)
                return wrd_fail(r, MOEQ_JOB_REJECT_WRONG_TYPE, "a map key is %s; JSON keys are strings",
                                wval_type_name(&x));
            if (transcode(w, r, &x, depth + 1) < 0) return -1;
            if (w->fmt == MOEQ_WIRE_JSON) {
                put(w, ":", 1);
                w->comma[w->depth] = 2;
            }
        }
        if (wrd_head(r, &x) < 0 || transcode(w, r, &x, depth + 1) < 0) return -1;
    }
    if (more < 0) return -1;
    if (v->type == WV_MAP) ww_end_map(w);
    else ww_end_array(w);
    return 0;
}

int ww_value_from(ww *w, const void *bytes, size_t len, moeq_wire_format from_fmt, int max_depth, wrd *r) {
    wrd_init(r, bytes, len, from_fmt, max_depth);
    wval v;
    if (w->fmt == from_fmt) { /* verbatim, after checking it is one well-formed value */
        const uint8_t *s, *e;
        if (wrd_value_span(r, 1, &v, &s, &e) < 0 || wrd_finish(r) < 0) return -1;
        ww_raw(w, bytes, len);
        return 0;
    }
    if (wrd_head(r, &v) < 0 || transcode(w, r, &v, 1) < 0 || wrd_finish(r) < 0) return -1;
    return 0;
}
