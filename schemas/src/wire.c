/*
 * wire.c — format detection, the growable buffer, and the in-place pull
 * reader for msgpack and JSON (see wire_internal.h for why it exists).
 *
 * The reader does not build a tree and never allocates; wrd_strdup is the
 * only function here that does, and only for a string whose bytes were seen.
 */
#include "wire_internal.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "moeq/util.h"

/* ---- names, detection, buffer ---------------------------------------- */

const char *moeq_wire_format_name(moeq_wire_format format) {
    switch (format) {
    case MOEQ_WIRE_MSGPACK: return "msgpack";
    case MOEQ_WIRE_JSON: return "json";
    default: return "unknown";
    }
}

const char *moeq_wire_content_type(moeq_wire_format format) {
    switch (format) {
    case MOEQ_WIRE_MSGPACK: return "application/msgpack";
    case MOEQ_WIRE_JSON: return "application/json";
    default: return "application/octet-stream";
    }
}

static int is_json_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Compare the media type of a header (before any ';', trimmed) with name, case-insensitively. */
static int media_type_is(const char *ct, const char *name) {
    while (*ct == ' ' || *ct == '\t') ct++;
    size_t n = strcspn(ct, ";");
    while (n > 0 && (ct[n - 1] == ' ' || ct[n - 1] == '\t')) n--;
    return n == strlen(name) && strncasecmp(ct, name, n) == 0;
}

moeq_wire_format moeq_wire_detect(const void *bytes, size_t len, const char *content_type) {
    if (content_type) {
        if (media_type_is(content_type, "application/msgpack") || media_type_is(content_type, "application/x-msgpack") ||
            media_type_is(content_type, "application/vnd.msgpack"))
            return MOEQ_WIRE_MSGPACK;
        if (media_type_is(content_type, "application/json")) return MOEQ_WIRE_JSON;
    }
    const uint8_t *p = bytes;
    if (!p || len == 0) return MOEQ_WIRE_UNKNOWN;
    if ((p[0] >= 0x80 && p[0] <= 0x8f) || p[0] == 0xde || p[0] == 0xdf) return MOEQ_WIRE_MSGPACK;
    size_t i = 0;
    while (i < len && is_json_ws(p[i])) i++;
    if (i < len && p[i] == '{') return MOEQ_WIRE_JSON;
    return MOEQ_WIRE_UNKNOWN;
}

void moeq_buf_reset(moeq_buf *buf) {
    if (!buf) return;
    buf->len = 0;
    if (buf->data) buf->data[0] = 0;
}

void moeq_buf_free(moeq_buf *buf) {
    if (!buf) return;
    free(buf->data);
    memset(buf, 0, sizeof *buf);
}

moeq_err moeq_buf_append(moeq_buf *buf, const void *bytes, size_t n) {
    if (!buf || (!bytes && n)) return MOEQ_ERR_INVALID_ARG;
    if (n >= SIZE_MAX - buf->len - 1) return MOEQ_ERR_NOMEM;
    size_t need = buf->len + n + 1; /* + the terminator */
    if (need > buf->cap) {
        size_t cap = buf->cap ? buf->cap : 256;
        while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        uint8_t *data = realloc(buf->data, cap);
        if (!data) return MOEQ_ERR_NOMEM;
        buf->data = data;
        buf->cap = cap;
    }
    if (n) memcpy(buf->data + buf->len, bytes, n);
    buf->len += n;
    buf->data[buf->len] = 0;
    return MOEQ_OK;
}

/* ---- reader: common ---------------------------------------------------- */

void wrd_init(wrd *r, const void *bytes, size_t len, moeq_wire_format fmt, int max_depth) {
    memset(r, 0, sizeof *r);
    r->base = r->p = bytes;
    r->end = r->base + len;
    r->fmt = fmt;
    r->max_depth = max_depth;
}

int wrd_fail(wrd *r, moeq_job_reject_code code, const char *fmt, ...) {
    if (r->code != MOEQ_JOB_REJECT_NONE) return -1;
    r->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* "field 'x': " or "" when no field is being read. */
#define FIELD_FMT "%s%s%s"
#define FIELD_ARGS(r) ((r)->path[0] ? "field '" : ""), (r)->path, ((r)->path[0] ? "': " : "")

static size_t left(const wrd *r) { return (size_t)(r->end - r->p); }
static size_t offset(const wrd *r) { return (size_t)(r->p - r->base); }

const char *wval_type_name(const wval *v) {
    switch (v->type) {
    case WV_NIL: return "nil";
    case WV_BOOL: return "a boolean";
    case WV_INT:
    case WV_UINT: return "an integer";
    case WV_FLOAT: return "a float";
    case WV_STR: return "a string";
    case WV_BIN: return "binary";
    case WV_EXT: return "an extension value";
    case WV_ARRAY: return "an array";
    case WV_MAP: return "a map";
    }
    return "?";
}

/* Text rule shared by both formats: valid UTF-8 (no surrogates) and no U+0000. */
static int check_text(wrd *r, const uint8_t *s, size_t n, size_t at) {
    size_t bad = 0;
    if (!moeq_utf8_valid((const char *)s, n, &bad))
        return wrd_fail(r, MOEQ_JOB_REJECT_INVALID_UTF8, FIELD_FMT "invalid UTF-8 at byte %zu", FIELD_ARGS(r),
                        at + bad);
    const void *nul = r->allow_nul ? NULL : memchr(s, 0, n);
    if (nul)
        return wrd_fail(r, MOEQ_JOB_REJECT_INVALID_UTF8, FIELD_FMT "U+0000 (NUL) at byte %zu is not allowed in text",
                        FIELD_ARGS(r), at + (size_t)((const uint8_t *)nul - s));
    return 0;
}

/* ---- reader: msgpack --------------------------------------------------- */

static uint64_t be(const uint8_t *p, int n) {
    uint64_t x = 0;
    for (int i = 0; i < n; i++) x = (x << 8) | p[i];
    return x;
}

/* Take n bytes after a header of h bytes; fails when the input is shorter than declared. */
static int mp_take(wrd *r, wval *v, size_t h, uint64_t n, const char *what) {
    if (left(r) < h || n > left(r) - h)
        return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED,
                        FIELD_FMT "msgpack %s at byte %zu declares %llu bytes but only %zu remain", FIELD_ARGS(r),
                        what, offset(r), (unsigned long long)n, left(r) > h ? left(r) - h : 0);
    v->s = r->p + h;
    v->n = (size_t)n;
    r->p += h + n;
    return 0;
}

/* A container header: every entry takes at least one byte, so a count beyond what remains is a lie. */
static int mp_container(wrd *r, wval *v, wval_type type, size_t h, uint64_t count) {
    uint64_t min_bytes = type == WV_MAP ? count * 2 : count;
    if (left(r) < h || min_bytes > left(r) - h)
        return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED,
                        FIELD_FMT "msgpack %s at byte %zu declares %llu entries but only %zu bytes remain",
                        FIELD_ARGS(r), type == WV_MAP ? "map" : "array", offset(r), (unsigned long long)count,
                        left(r) > h ? left(r) - h : 0);
    v->type = type;
    v->count = count;
    r->p += h;
    return 0;
}

static int mp_need(wrd *r, size_t n) {
    if (left(r) < n)
        return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED, FIELD_FMT "msgpack value truncated at byte %zu", FIELD_ARGS(r),
                        offset(r));
    return 0;
}

static int mp_int(wrd *r, wval *v, uint8_t c) {
    static const int widths[8] = {1, 2, 4, 8, 1, 2, 4, 8}; /* 0xcc..0xcf unsigned, 0xd0..0xd3 signed */
    int w = widths[c - 0xcc];
    if (mp_need(r, 1 + (size_t)w) < 0) return -1;
    uint64_t x = be(r->p + 1, w);
    r->p += 1 + w;
    if (c <= 0xcf) {
        if (x > INT64_MAX) {
            v->type = WV_UINT;
            v->u = x;
        } else {
            v->type = WV_INT;
            v->i = (int64_t)x;
        }
        return 0;
    }
    int bits = 8 * w; /* sign-extend */
    v->type = WV_INT;
    if (bits == 64) v->i = (int64_t)x;
    else v->i = (x & (1ULL << (bits - 1))) ? (int64_t)(x | ~((1ULL << bits) - 1)) : (int64_t)x;
    return 0;
}

static int mp_float(wrd *r, wval *v, uint8_t c) {
    size_t w = c == 0xca ? 4 : 8;
    if (mp_need(r, 1 + w) < 0) return -1;
    uint64_t x = be(r->p + 1, (int)w);
    r->p += 1 + w;
    v->type = WV_FLOAT;
    if (w == 4) {
        uint32_t x32 = (uint32_t)x;
        float f;
        memcpy(&f, &x32, 4);
        v->f = f;
    } else {
        memcpy(&v->f, &x, 8);
    }
    return 0;
}

static int mp_str(wrd *r, wval *v, size_t h, uint64_t n) {
    size_t at = offset(r) + h;
    if (mp_take(r, v, h, n, "string") < 0) return -1;
    v->type = WV_STR;
    v->dec_len = v->n;
    return check_text(r, v->s, v->n, at);
}

static int mp_head(wrd *r, wval *v) {
    if (mp_need(r, 1) < 0) return -1;
    const uint8_t *p = r->p;
    uint8_t c = p[0];
    if (c <= 0x7f) { v->type = WV_INT; v->i = c; r->p++; return 0; }
    if (c >= 0xe0) { v->type = WV_INT; v->i = (int8_t)c; r->p++; return 0; }
    if (c <= 0x8f) return mp_container(r, v, WV_MAP, 1, c & 0x0f);
    if (c <= 0x9f) return mp_container(r, v, WV_ARRAY, 1, c & 0x0f);
    if (c <= 0xbf) return mp_str(r, v, 1, c & 0x1f);
    switch (c) {
    case 0xc0: v->type = WV_NIL; r->p++; return 0;
    case 0xc2:
    case 0xc3: v->type = WV_BOOL; v->b = c == 0xc3; r->p++; return 0;
    case 0xc4: case 0xc5: case 0xc6: {
        size_t w = (size_t)1 << (c - 0xc4);
        if (mp_need(r, 1 + w) < 0) return -1;
        v->type = WV_BIN;
        return mp_take(r, v, 1 + w, be(p + 1, (int)w), "bin");
    }
    case 0xc7: case 0xc8: case 0xc9: {
        size_t w = (size_t)1 << (c - 0xc7);
        if (mp_need(r, 2 + w) < 0) return -1;
        v->type = WV_EXT;
        return mp_take(r, v, 2 + w, be(p + 1, (int)w), "ext");
    }
    case 0xca: case 0xcb: return mp_float(r, v, c);
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: return mp_int(r, v, c);
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        v->type = WV_EXT;
        return mp_take(r, v, 2, (uint64_t)1 << (c - 0xd4), "fixext");
    case 0xd9: case 0xda: case 0xdb: {
        size_t w = (size_t)1 << (c - 0xd9);
        if (mp_need(r, 1 + w) < 0) return -1;
        return mp_str(r, v, 1 + w, be(p + 1, (int)w));
    }
    case 0xdc: case 0xdd: {
        size_t w = c == 0xdc ? 2 : 4;
        if (mp_need(r, 1 + w) < 0) return -1;
        return mp_container(r, v, WV_ARRAY, 1 + w, be(p + 1, (int)w));
    }
    case 0xde: case 0xdf: {
        size_t w = c == 0xde ? 2 : 4;
        if (mp_need(r, 1 + w) < 0) return -1;
        return mp_container(r, v, WV_MAP, 1 + w, be(p + 1, (int)w));
    }
    default: /* 0xc1 is never used */
        return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED, FIELD_FMT "byte 0x%02x at %zu is not a msgpack type",
                        FIELD_ARGS(r), c, offset(r));
    }
}

/* ---- reader: JSON ------------------------------------------------------ */

static void js_ws(wrd *r) {
    while (r->p < r->end && is_json_ws(*r->p)) r->p++;
}

static int js_malformed(wrd *r, const char *what) {
    if (r->p >= r->end)
        return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED, FIELD_FMT "JSON ends early: %s expected", FIELD_ARGS(r), what);
    return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED, FIELD_FMT "JSON: %s expected at byte %zu, found '%c'", FIELD_ARGS(r),
                    what, offset(r), isprint(*r->p) ? *r->p : '?');
}

static int hex4(const uint8_t *p, unsigned *out) {
    unsigned x = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        x = x * 16 + d;
    }
    *out = x;
    return 0;
}

static size_t utf8_len_of(unsigned cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

/*
 * One escape at p (p[0] == '\\'), at most `avail` bytes. Sets *cp and *used.
 * \u escapes: a high surrogate must be followed by a \u low surrogate; a lone
 * surrogate or \u0000 is text we refuse (invalid_utf8), not a syntax error.
 */
static int js_escape(wrd *r, const uint8_t *p, size_t avail, unsigned *cp, size_t *used) {
    size_t at = (size_t)(p - r->base);
    if (avail < 2) return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED, FIELD_FMT "JSON string ends early", FIELD_ARGS(r));
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *e = p[1] ? strchr(from, p[1]) : NULL;
    if (e) { *cp = (unsigned char)to[e - from]; *used = 2; return 0; }
    unsigned hi, lo;
    if (p[1] != 'u' || avail < 6 || hex4(p + 2, &hi) < 0)
        return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED, FIELD_FMT "invalid JSON escape at byte %zu", FIELD_ARGS(r), at);
    if (hi == 0 && !r->allow_nul)
        return wrd_fail(r, MOEQ_JOB_REJECT_INVALID_UTF8, FIELD_FMT "\\u0000 (NUL) at byte %zu is not allowed in text",
                        FIELD_ARGS(r), at);
    if (hi >= 0xDC00 && hi <= 0xDFFF)
        return wrd_fail(r, MOEQ_JOB_REJECT_INVALID_UTF8, FIELD_FMT "lone low surrogate \\u%04X at byte %zu",
                        FIELD_ARGS(r), hi, at);
    if (hi < 0xD800 || hi > 0xDBFF) { *cp = hi; *used = 6; return 0; }
    if (avail < 12 || p[6] != '\\' || p[7] != 'u' || hex4(p + 8, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF)
        return wrd_fail(r, MOEQ_JOB_REJECT_INVALID_UTF8, FIELD_FMT "lone high surrogate \\u%04X at byte %zu",
                        FIELD_ARGS(r), hi, at);
    *cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
    *used = 12;
    return 0;
}

/* r->p is just past the opening quote. Validates the string and finds its end and decoded length. */
static int js_str(wrd *r, wval *v) {
    const uint8_t *p = r->p, *run = p;
    size_t dec = 0;
    v->type = WV_STR;
    v->s = p;
    v->escaped = 0;
    for (;;) {
        while (p < r->end && *p != '"' && *p != '\\' && *p >= 0x20) p++;
        if (check_text(r, run, (size_t)(p - run), (size_t)(run - r->base)) < 0) return -1;
        dec += (size_t)(p - run);
        if (p >= r->end) return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED, FIELD_FMT "unterminated JSON string", FIELD_ARGS(r));
        if (*p == '"') break;
        if (*p < 0x20)
            return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED, FIELD_FMT "control character 0x%02x in a JSON string at byte %zu",
                            FIELD_ARGS(r), *p, (size_t)(p - r->base));
        unsigned cp;
        size_t used;
        if (js_escape(r, p, (size_t)(r->end - p), &cp, &used) < 0) return -1;
        v->escaped = 1;
        dec += utf8_len_of(cp);
        p += used;
        run = p;
    }
    v->n = (size_t)(p - v->s);
    v->dec_len = dec;
    r->p = p + 1;
    return 0;
}

/* Strict RFC 8259 number grammar; integers without fraction/exponent stay exact. */
static int js_number(wrd *r, wval *v) {
    const uint8_t *p = r->p, *s = p;
    int neg = 0, is_float = 0;
    if (p < r->end && *p == '-') { neg = 1; p++; }
    if (p >= r->end || !isdigit(*p)) return js_malformed(r, "a value");
    if (*p == '0') p++;
    else while (p < r->end && isdigit(*p)) p++;
    const uint8_t *int_end = p;
    if (p < r->end && *p == '.') {
        p++;
        if (p >= r->end || !isdigit(*p)) { r->p = p; return js_malformed(r, "a digit"); }
        while (p < r->end && isdigit(*p)) p++;
        is_float = 1;
    }
    if (p < r->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < r->end && (*p == '+' || *p == '-')) p++;
        if (p >= r->end || !isdigit(*p)) { r->p = p; return js_malformed(r, "a digit"); }
        while (p < r->end && isdigit(*p)) p++;
        is_float = 1;
    }
    r->p = p;
    if (!is_float) {
        uint64_t x = 0;
        int overflow = 0;
        for (const uint8_t *d = s + neg; d < int_end; d++) {
            unsigned dig = (unsigned)(*d - '0');
            if (x > (UINT64_MAX - dig) / 10) { overflow = 1; break; }
            x = x * 10 + dig;
        }
        if (!overflow && !neg && x > INT64_MAX) { v->type = WV_UINT; v->u = x; return 0; }
        if (!overflow && !neg) { v->type = WV_INT; v->i = (int64_t)x; return 0; }
        if (!overflow && x <= (uint64_t)INT64_MAX + 1) {
            v->type = WV_INT;
            v->i = x == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)x;
            return 0;
        }
    }
    /* A float (or an integer too big for 64 bits): strtod on a NUL-terminated copy. */
    size_t n = (size_t)(p - s);
    char small[64], *tmp = n < sizeof small ? small : malloc(n + 1);
    if (!tmp) { r->nomem = 1; return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED, "out of memory"); }
    memcpy(tmp, s, n);
    tmp[n] = 0;
    v->type = WV_FLOAT;
    v->f = strtod(tmp, NULL);
    if (tmp != small) free(tmp);
    return 0;
}

static int js_literal(wrd *r, const char *lit) {
    size_t n = strlen(lit);
    if (left(r) < n || memcmp(r->p, lit, n) != 0) return js_malformed(r, "a value");
    r->p += n;
    return 0;
}

static int js_head(wrd *r, wval *v) {
    js_ws(r);
    v->start = r->p;
    if (r->p >= r->end) return js_malformed(r, "a value");
    switch (*r->p) {
    case '{': r->p++; v->type = WV_MAP; return 0;
    case '[': r->p++; v->type = WV_ARRAY; return 0;
    case '"': r->p++; return js_str(r, v);
    case 't': v->type = WV_BOOL; v->b = 1; return js_literal(r, "true");
    case 'f': v->type = WV_BOOL; v->b = 0; return js_literal(r, "false");
    case 'n': v->type = WV_NIL; return js_literal(r, "null");
    default: return js_number(r, v);
    }
}

/* ---- reader: the format-neutral surface -------------------------------- */

int wrd_head(wrd *r, wval *v) {
    memset(v, 0, sizeof *v);
    if (r->code != MOEQ_JOB_REJECT_NONE) return -1;
    if (r->fmt == MOEQ_WIRE_JSON) return js_head(r, v);
    v->start = r->p;
    return mp_head(r, v);
}

int wrd_iter_begin(wrd *r, const wval *c, int depth, witer *it) {
    if (depth > r->max_depth)
        return wrd_fail(r, MOEQ_JOB_REJECT_TOO_DEEP, FIELD_FMT "nesting deeper than %d levels at byte %zu",
                        FIELD_ARGS(r), r->max_depth, (size_t)(c->start - r->base));
    it->left = c->count; /* msgpack; JSON finds the end by its ']' or '}' */
    it->first = 1;
    it->close = c->type == WV_MAP ? '}' : ']';
    return 0;
}

int wrd_iter_next(wrd *r, witer *it) {
    if (r->code != MOEQ_JOB_REJECT_NONE) return -1;
    if (r->fmt != MOEQ_WIRE_JSON) {
        if (it->left == 0) return 0;
        it->left--;
        return 1;
    }
    js_ws(r);
    if (r->p < r->end && *r->p == it->close) { /* "[1,]" never gets here: after ',' a value is read */
        r->p++;
        return 0;
    }
    if (!it->first) {
        if (r->p >= r->end || *r->p != ',') return js_malformed(r, it->close == '}' ? "',' or '}'" : "',' or ']'");
        r->p++;
    }
    it->first = 0;
    return 1;
}

int wrd_key(wrd *r, wval *key) {
    if (wrd_head(r, key) < 0) return -1;
    if (r->fmt != MOEQ_WIRE_JSON) return 0;
    if (key->type != WV_STR) {
        r->p = key->start;
        return js_malformed(r, "a string key");
    }
    js_ws(r);
    if (r->p >= r->end || *r->p != ':') return js_malformed(r, "':'");
    r->p++;
    return 0;
}

int wrd_skip(wrd *r, const wval *v, int depth) {
    if (v->type != WV_MAP && v->type != WV_ARRAY) return r->code ? -1 : 0;
    witer it;
    if (wrd_iter_begin(r, v, depth, &it) < 0) return -1;
    int more;
    while ((more = wrd_iter_next(r, &it)) == 1) {
        wval x;
        if (v->type == WV_MAP) {
            if (wrd_key(r, &x) < 0 || wrd_skip(r, &x, depth + 1) < 0) return -1;
        }
        if (wrd_head(r, &x) < 0 || wrd_skip(r, &x, depth + 1) < 0) return -1;
    }
    return more;
}

int wrd_value_span(wrd *r, int depth, wval *head, const uint8_t **start, const uint8_t **end) {
    if (wrd_head(r, head) < 0 || wrd_skip(r, head, depth) < 0) return -1;
    *start = head->start;
    *end = r->p;
    return 0;
}

int wrd_finish(wrd *r) {
    if (r->code != MOEQ_JOB_REJECT_NONE) return -1;
    if (r->fmt == MOEQ_WIRE_JSON) js_ws(r);
    if (r->p != r->end)
        return wrd_fail(r, MOEQ_JOB_REJECT_MALFORMED, "%zu trailing bytes after the document at byte %zu", left(r),
                        offset(r));
    return 0;
}

/* ---- strings ----------------------------------------------------------- */

static size_t put_utf8(char *d, unsigned cp) {
    if (cp < 0x80) { d[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | (cp >> 6));
        d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12));
        d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18));
    d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

void wval_str_copy(const wval *v, char *dst) {
    if (!v->escaped) {
        if (v->n) memcpy(dst, v->s, v->n);
        dst[v->n] = 0;
        return;
    }
    /* Already validated by js_str: re-walk without checks. */
    wrd scratch;
    wrd_init(&scratch, v->s, v->n, MOEQ_WIRE_JSON, 0);
    scratch.allow_nul = 1; /* whatever the reader allowed, it checked */
    const uint8_t *p = v->s, *end = v->s + v->n;
    size_t o = 0;
    while (p < end) {
        if (*p != '\\') { dst[o++] = (char)*p++; continue; }
        unsigned cp = 0;
        size_t used = 2;
        if (js_escape(&scratch, p, (size_t)(end - p), &cp, &used) < 0) break; /* cannot happen */
        o += put_utf8(dst + o, cp);
        p += used;
    }
    dst[o] = 0;
}

int wval_str_is(const wval *v, const char *lit) {
    if (v->type != WV_STR) return 0;
    size_t n = strlen(lit);
    if (v->dec_len != n) return 0;
    if (!v->escaped) return memcmp(v->s, lit, n) == 0;
    char tmp[128];
    if (n >= sizeof tmp) return 0;
    wval_str_copy(v, tmp);
    return memcmp(tmp, lit, n) == 0;
}

char *wrd_strdup(wrd *r, const wval *v) {
    char *s = malloc(v->dec_len + 1);
    if (!s) {
        r->nomem = 1;
        return NULL;
    }
    wval_str_copy(v, s);
    return s;
}
