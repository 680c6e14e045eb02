/*
 * regex.c — regular expressions (the ECMA-262 subset JSON Schema's
 * `pattern` uses in practice, and response_format regex) into NFA fragments.
 *
 * Supported: literals (UTF-8), `.`, classes `[a-z\d]` and `[^...]`, escapes
 * \d \w \s \D \W \S \n \t \r \f \v \xHH \uHHHH and escaped punctuation,
 * groups `( )`, `(?: )`, `(?<name> )`, alternation, quantifiers * + ? {n}
 * {n,} {n,m} (lazy forms match the same language), ^ at the start and $ at
 * the end. Refused, by name: backreferences, lookaround, word boundaries,
 * anchors elsewhere, possessive quantifiers. The parser builds a small AST
 * so that a repeated part is rebuilt, not copied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

typedef enum rx_type { RX_CLASS, RX_CONCAT, RX_ALT, RX_REPEAT } rx_type;

typedef struct rx {
    rx_type t;
    cp_set set;      /* RX_CLASS                         */
    struct rx **kids;
    int n, cap;
    int min, max;    /* RX_REPEAT; max -1 = unbounded     */
    int literal;     /* RX_CLASS from one literal char    */
} rx;

typedef struct rp {
    const char *p, *end;
    int max_repeat, json_string;
    char *errstr;
    size_t errstr_size;
    moeq_err err;
    int depth;
    int in_negated; /* inside [^...]: a class escape adds what it may match, not what it surely matches */
} rp;

static void *rfail(rp *r, moeq_err err, const char *fmt, const char *what) {
    if (!r->err) {
        char msg[160];
        snprintf(msg, sizeof msg, fmt, what);
        moeq_errf(err, r->errstr, r->errstr_size, "pattern: %s", msg);
        r->err = err;
    }
    return NULL;
}

static void rx_free(rx *x) {
    if (!x) return;
    for (int i = 0; i < x->n; i++) rx_free(x->kids[i]);
    free(x->kids);
    cp_set_free(&x->set);
    free(x);
}

static rx *rx_new(rp *r, rx_type t) {
    rx *x = calloc(1, sizeof *x);
    if (!x) return rfail(r, MOEQ_ERR_NOMEM, "%s", "out of memory");
    x->t = t;
    return x;
}

static int rx_add(rp *r, rx *x, rx *kid) {
    if (x->n == x->cap) {
        int cap = x->cap ? x->cap * 2 : 4;
        rx **k = realloc(x->kids, (size_t)cap * sizeof *k);
        if (!k) return rfail(r, MOEQ_ERR_NOMEM, "%s", "out of memory"), -1;
        x->kids = k, x->cap = cap;
    }
    x->kids[x->n++] = kid;
    return 0;
}

/* The next UTF-8 code point (the job decoder validated the text). */
static uint32_t next_cp(rp *r) {
    const unsigned char *s = (const unsigned char *)r->p;
    uint32_t c = s[0];
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (r->end - r->p < n) n = 1;
    if (n > 1) c &= 0x3F >> (n - 1);
    for (int i = 1; i < n; i++) c = (c << 6) | (s[i] & 0x3F);
    r->p += n;
    return c;
}

/*
 * \d \w \s mean different sets to the readers that check a pattern: ECMA-262 (JSON Schema's dialect; ASCII
 * digits and word characters, its own list of spaces) and Python's re (jsonschema's: Unicode digits, word
 * characters and spaces). An output must match under both, so each escape has a narrow set (surely in it,
 * both ways) and a wide one (in it either way): \d \w \s and, inside [^...], \D \W \S add the narrow set of
 * what they match, the others the wide one (a negated bracket then leaves out everything either may
 * count). Wide \w is ASCII's plus every non-ASCII character (Python's Unicode word characters, without their
 * table); wide \d adds Unicode's decimal digits in the BMP (Python 3.11's, below) and every character past it.
 */
static const uint32_t unicode_nd_bmp[][2] = {
    {0x660, 0x669},   {0x6F0, 0x6F9},   {0x7C0, 0x7C9},   {0x966, 0x96F},   {0x9E6, 0x9EF},   {0xA66, 0xA6F},
    {0xAE6, 0xAEF},   {0xB66, 0xB6F},   {0xBE6, 0xBEF},   {0xC66, 0xC6F},   {0xCE6, 0xCEF},   {0xD66, 0xD6F},
    {0xDE6, 0xDEF},   {0xE50, 0xE59},   {0xED0, 0xED9},   {0xF20, 0xF29},   {0x1040, 0x1049}, {0x1090, 0x1099},
    {0x17E0, 0x17E9}, {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19D9}, {0x1A80, 0x1A89}, {0x1A90, 0x1A99},
    {0x1B50, 0x1B59}, {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59}, {0xA620, 0xA629}, {0xA8D0, 0xA8D9},
    {0xA900, 0xA909}, {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59}, {0xABF0, 0xABF9}, {0xFF10, 0xFF19}};

static int class_set(cp_set *t, char c, int wide) {
    int rc = 0;
    switch (c) {
    case 'd':
        rc = cp_set_add(t, '0', '9');
        for (size_t i = 0; wide && !rc && i < sizeof unicode_nd_bmp / sizeof unicode_nd_bmp[0]; i++)
            rc = cp_set_add(t, unicode_nd_bmp[i][0], unicode_nd_bmp[i][1]);
        if (wide && !rc) rc = cp_set_add(t, 0x10000, 0x10FFFF);
        break;
    case 'w':
        rc = cp_set_add(t, '0', '9') || cp_set_add(t, 'A', 'Z') || cp_set_add(t, 'a', 'z') || cp_set_add(t, '_', '_');
        if (wide && !rc) rc = cp_set_add(t, 0x80, 0x10FFFF);
        break;
    case 's': /* both: \t-\r, space, NBSP, Ogham, U+2000-200A, line/paragraph separators, narrow NBSP, MMSP,
                 ideographic space; ECMA alone: U+FEFF; Python alone: U+001C-001F, U+0085 */
        rc = cp_set_add(t, '\t', '\r') || cp_set_add(t, ' ', ' ') || cp_set_add(t, 0xA0, 0xA0) ||
             cp_set_add(t, 0x1680, 0x1680) || cp_set_add(t, 0x2000, 0x200A) || cp_set_add(t, 0x2028, 0x2029) ||
             cp_set_add(t, 0x202F, 0x202F) || cp_set_add(t, 0x205F, 0x205F) || cp_set_add(t, 0x3000, 0x3000);
        if (wide && !rc)
            rc = cp_set_add(t, 0xFEFF, 0xFEFF) || cp_set_add(t, 0x1C, 0x1F) || cp_set_add(t, 0x85, 0x85);
        break;
    }
    return rc;
}

static int add_class_escape(cp_set *s, char c, int in_negated) {
    cp_set t = {0};
    int upper = c == 'D' || c == 'W' || c == 'S';
    /* lower case: narrow, wide inside [^...]; upper case: the complement of wide, of narrow inside [^...] */
    int rc = class_set(&t, (char)(c | 0x20), upper != in_negated);
    if (!rc && upper) rc = cp_set_negate(&t);
    for (int i = 0; !rc && i < t.n; i++) rc = cp_set_add(s, t.r[i].lo, t.r[i].hi);
    cp_set_free(&t);
    return rc;
}

static int hexval(rp *r, int digits, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        if (r->p >= r->end) return -1;
        char c = *r->p++;
        v = v * 16 + (uint32_t)(c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : 99);
        if (v > 0x10FFFF * 16) return -1;
    }
    *out = v;
    return v <= 0x10FFFF ? 0 : -1;
}

/* After a backslash: a class escape into s (returns 1; s NULL where no class may stand: adds nothing), or one code
 * point in *cp (returns 0); -1 error. */
static int escape(rp *r, cp_set *s, uint32_t *cp) {
    if (r->p >= r->end) return rfail(r, MOEQ_ERR_PARSE, "%s", "trailing backslash"), -1;
    char c = *r->p++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': /* s NULL: no class allowed here, say 1 only */
        return s && add_class_escape(s, c, r->in_negated) ? (rfail(r, MOEQ_ERR_NOMEM, "%s", "out of memory"), -1) : 1;
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'x':
        if (hexval(r, 2, cp)) return rfail(r, MOEQ_ERR_PARSE, "%s", "bad \\x escape"), -1;
        return 0;
    case 'u':
        if (hexval(r, 4, cp)) return rfail(r, MOEQ_ERR_PARSE, "%s", "bad \\u escape"), -1;
        return 0;
    case 'b': case 'B': return rfail(r, MOEQ_ERR_UNSUPPORTED, "%s", "word boundaries (\\b, \\B) are not supported"), -1;
    default:
        if ((c >= '0' && c <= '9') || c == 'k')
            return rfail(r, MOEQ_ERR_UNSUPPORTED, "%s", "backreferences are not supported"), -1;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return rfail(r, MOEQ_ERR_UNSUPPORTED, "escape \\%s is not supported", (char[]){c, 0}), -1;
        *cp = (unsigned char)c;
        return 0;
    }
}

static rx *class_node(rp *r, cp_set *s, int literal) {
    rx *x = rx_new(r, RX_CLASS);
    if (!x) return cp_set_free(s), NULL;
    x->set = *s;
    x->literal = literal;
    cp_set_normalize(&x->set);
    return x;
}

static rx *bracket(rp *r) {
    cp_set s = {0};
    int neg = r->p < r->end && *r->p == '^';
    if (neg) r->p++;
    r->in_negated = neg;
    int first = 1;
    while (r->p < r->end && (*r->p != ']' || first)) {
        first = 0;
        uint32_t lo, hi;
        if (*r->p == '\\') {
            r->p++;
            int k = escape(r, &s, &lo);
            if (k < 0) return cp_set_free(&s), NULL;
            if (k == 1) continue;
        } else if (*r->p == '[' && r->end - r->p > 1 && r->p[1] == ':') {
            return cp_set_free(&s), rfail(r, MOEQ_ERR_UNSUPPORTED, "%s", "POSIX classes [:name:] are not supported");
        } else {
            lo = next_cp(r);
        }
        hi = lo;
        if (r->end - r->p > 1 && *r->p == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                int k = escape(r, NULL, &hi); /* a class (\d) cannot end a range */
                if (k != 0) return cp_set_free(&s), k < 0 ? NULL : rfail(r, MOEQ_ERR_PARSE, "%s", "bad class range");
            } else {
                hi = next_cp(r);
            }
            if (hi < lo) return cp_set_free(&s), rfail(r, MOEQ_ERR_PARSE, "%s", "class range out of order");
        }
        if (cp_set_add(&s, lo, hi)) return cp_set_free(&s), rfail(r, MOEQ_ERR_NOMEM, "%s", "out of memory");
    }
    r->in_negated = 0;
    if (r->p >= r->end) return cp_set_free(&s), rfail(r, MOEQ_ERR_PARSE, "%s", "unterminated [");
    r->p++;
    if (neg && cp_set_negate(&s)) return cp_set_free(&s), rfail(r, MOEQ_ERR_NOMEM, "%s", "out of memory");
    return class_node(r, &s, 0);
}

static rx *alternation(rp *r);

static rx *group(rp *r) {
    if (r->end - r->p >= 2 && r->p[0] == '?') {
        char c = r->p[1];
        if (c == ':') r->p += 2;
        else if (c == '=' || c == '!' || (c == '<' && r->end - r->p > 2 && (r->p[2] == '=' || r->p[2] == '!')))
            return rfail(r, MOEQ_ERR_UNSUPPORTED, "%s", "lookaround (?= (?! (?<= (?<! is not supported");
        else if (c == '<' || c == 'P') { /* named group: the name does not change the language */
            while (r->p < r->end && *r->p != '>') r->p++;
            if (r->p < r->end) r->p++;
        } else
            return rfail(r, MOEQ_ERR_UNSUPPORTED, "group (?%s is not supported", (char[]){c, 0});
    }
    if (++r->depth > 64) return rfail(r, MOEQ_ERR_LIMIT, "%s", "groups nested deeper than 64");
    rx *x = alternation(r);
    r->depth--;
    if (!x) return NULL;
    if (r->p >= r->end || *r->p != ')') return rx_free(x), rfail(r, MOEQ_ERR_PARSE, "%s", "missing )");
    r->p++;
    return x;
}

static rx *atom(rp *r) {
    cp_set s = {0};
    uint32_t cp;
    char c = *r->p;
    if (c == '(') return r->p++, group(r);
    if (c == '[') return r->p++, bracket(r);
    if (c == '.') {
        r->p++;
        if (cp_set_add(&s, '\n', '\n') || cp_set_add(&s, '\r', '\r') || cp_set_add(&s, 0x2028, 0x2029) ||
            cp_set_negate(&s))
            return cp_set_free(&s), rfail(r, MOEQ_ERR_NOMEM, "%s", "out of memory");
        return class_node(r, &s, 0);
    }
    if (c == '^' || c == '$') return rfail(r, MOEQ_ERR_UNSUPPORTED, "anchor %s is supported only at the start/end", (char[]){c, 0});
    if (c == '*' || c == '+' || c == '?' || c == '{') return rfail(r, MOEQ_ERR_PARSE, "%s", "nothing to repeat");
    if (c == '\\') {
        r->p++;
        int k = escape(r, &s, &cp);
        if (k < 0) return cp_set_free(&s), NULL;
        if (k == 1) return class_node(r, &s, 0);
    } else {
        cp = next_cp(r);
    }
    if (cp_set_add(&s, cp, cp)) return rfail(r, MOEQ_ERR_NOMEM, "%s", "out of memory");
    return class_node(r, &s, 1);
}

static int number(rp *r, int *out) {
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return -1;
    long v = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        v = v * 10 + (*r->p++ - '0');
        if (v > 1000000) v = 1000000;
    }
    *out = (int)v;
    return 0;
}

/* A quantifier after an atom, if any: wraps x. */
static rx *quantified(rp *r, rx *x) {
    while (r->p < r->end && x) {
        int min, max;
        char c = *r->p;
        const char *save = r->p;
        if (c == '*') min = 0, max = -1, r->p++;
        else if (c == '+') min = 1, max = -1, r->p++;
        else if (c == '?') min = 0, max = 1, r->p++;
        else if (c == '{') {
            r->p++;
            if (number(r, &min)) { /* a literal '{' (ECMA-262 Annex B) */
                r->p = save;
                return x;
            }
            max = min;
            if (r->p < r->end && *r->p == ',') {
                r->p++;
                max = -1;
                if (r->p < r->end && *r->p != '}' && number(r, &max)) return rx_free(x), rfail(r, MOEQ_ERR_PARSE, "%s", "bad {n,m}");
            }
            if (r->p >= r->end || *r->p != '}') return rx_free(x), rfail(r, MOEQ_ERR_PARSE, "%s", "bad {n,m}");
            r->p++;
            if (max >= 0 && max < min) return rx_free(x), rfail(r, MOEQ_ERR_PARSE, "%s", "{n,m} with m < n");
            if (min > r->max_repeat || max > r->max_repeat)
                return rx_free(x), rfail(r, MOEQ_ERR_LIMIT, "%s", "a {n,m} bound is above max_repeat");
        } else
            return x;
        if (r->p < r->end && *r->p == '?') r->p++; /* lazy: same language */
        else if (r->p < r->end && *r->p == '+')
            return rx_free(x), rfail(r, MOEQ_ERR_UNSUPPORTED, "%s", "possessive quantifiers are not supported");
        rx *q = rx_new(r, RX_REPEAT);
        if (!q || rx_add(r, q, x)) return rx_free(q), rx_free(x), NULL;
        q->min = min, q->max = max;
        x = q;
    }
    return x;
}

static rx *concatenation(rp *r) {
    rx *x = rx_new(r, RX_CONCAT);
    while (x && r->p < r->end && *r->p != '|' && *r->p != ')') {
        rx *a = atom(r);
        if (a) a = quantified(r, a);
        if (!a || rx_add(r, x, a)) return rx_free(a), rx_free(x), NULL;
    }
    return x;
}

static rx *alternation(rp *r) {
    rx *x = rx_new(r, RX_ALT);
    for (;;) {
        rx *c = x ? concatenation(r) : NULL;
        if (!c || rx_add(r, x, c)) return rx_free(c), rx_free(x), NULL;
        if (r->p >= r->end || *r->p != '|') return x;
        r->p++;
    }
}

/* ---- AST -> NFA ----------------------------------------------------------------------- */

static int build(rp *r, nfa *n, const rx *x, const cp_set *allowed, frag *out);

static int build_class(rp *r, nfa *n, const rx *x, const cp_set *allowed, frag *out) {
    cp_set s = {0};
    for (int i = 0; i < x->set.n; i++)
        if (cp_set_add(&s, x->set.r[i].lo, x->set.r[i].hi)) return cp_set_free(&s), rfail(r, MOEQ_ERR_NOMEM, "%s", "oom"), -1;
    if (allowed && cp_set_intersect(&s, allowed)) return cp_set_free(&s), rfail(r, MOEQ_ERR_NOMEM, "%s", "oom"), -1;
    if (x->literal && s.n == 0) {
        cp_set_free(&s);
        rfail(r, MOEQ_ERR_UNSUPPORTED, "%s",
              "a character that JSON must escape (\", \\, a control) in a string pattern is not supported");
        return -1;
    }
    *out = frag_class(n, &s);
    cp_set_free(&s);
    return 0;
}

static int build(rp *r, nfa *n, const rx *x, const cp_set *allowed, frag *out) {
    frag f = {0, 0}, g;
    if (n->failed) { /* over the state limit: stop here, or nested repeats would still cost m^depth calls */
        rfail(r, n->nomem ? MOEQ_ERR_NOMEM : MOEQ_ERR_LIMIT, "%s", "the automaton is over max_nfa_states");
        return -1;
    }
    switch (x->t) {
    case RX_CLASS: return build_class(r, n, x, allowed, out);
    case RX_CONCAT:
        f = frag_empty(n);
        for (int i = 0; i < x->n; i++) {
            if (build(r, n, x->kids[i], allowed, &g)) return -1;
            f = frag_seq(n, f, g);
        }
        return *out = f, 0;
    case RX_ALT: {
        frag parts[64];
        if (x->n > 64) {
            for (int i = 0; i < x->n; i++) { /* wide alternations: nest in groups of 64 */
                if (build(r, n, x->kids[i], allowed, &g)) return -1;
                parts[i % 64] = g;
                if (i % 64 == 63 || i == x->n - 1) {
                    frag a = frag_alt(n, parts, i % 64 + 1);
                    f = i < 64 ? a : frag_alt(n, (frag[]){f, a}, 2);
                }
            }
            return *out = f, 0;
        }
        for (int i = 0; i < x->n; i++)
            if (build(r, n, x->kids[i], allowed, &parts[i])) return -1;
        return *out = x->n == 1 ? parts[0] : frag_alt(n, parts, x->n), 0;
    }
    case RX_REPEAT:
        f = frag_empty(n);
        for (int i = 0; i < x->min; i++) {
            if (build(r, n, x->kids[0], allowed, &g)) return -1;
            f = frag_seq(n, f, g);
        }
        if (x->max < 0) {
            if (build(r, n, x->kids[0], allowed, &g)) return -1;
            return *out = frag_seq(n, f, frag_star(n, g)), 0;
        }
        for (int i = x->min; i < x->max; i++) {
            if (build(r, n, x->kids[0], allowed, &g)) return -1;
            f = frag_seq(n, f, frag_opt(n, g));
        }
        return *out = f, 0;
    }
    return -1;
}

/* Characters a JSON string may hold unescaped. */
static int json_chars(cp_set *s) {
    return cp_set_add(s, 0x20, 0x21) || cp_set_add(s, 0x23, 0x5B) || cp_set_add(s, 0x5D, 0x10FFFF);
}

int regex_compile(nfa *n, const char *pattern, size_t len, int json_string, int anchored, int max_repeat, frag *out,
                  char *errstr, size_t errstr_size) {
    rp r = {pattern, pattern + len, max_repeat, json_string, errstr, errstr_size, MOEQ_OK, 0, 0};
    int head = len > 0 && pattern[0] == '^';
    int tail = len > (size_t)head && pattern[len - 1] == '$' && (len < 2 || pattern[len - 2] != '\\');
    r.p += head;
    r.end -= tail;
    rx *x = alternation(&r);
    if (x && r.p != r.end) rfail(&r, MOEQ_ERR_PARSE, "%s", "unbalanced )");
    cp_set allowed = {0}, any = {0};
    if (!r.err && json_string && json_chars(&allowed)) rfail(&r, MOEQ_ERR_NOMEM, "%s", "oom");
    frag f;
    if (!r.err && build(&r, n, x, json_string ? &allowed : NULL, &f) == 0 && !anchored) {
        if (json_string ? json_chars(&any) : cp_set_add(&any, 0, 0x10FFFF)) rfail(&r, MOEQ_ERR_NOMEM, "%s", "oom");
        if (!head) f = frag_seq(n, frag_star(n, frag_class(n, &any)), f);
        if (!tail) f = frag_seq(n, f, frag_star(n, frag_class(n, &any)));
    }
    cp_set_free(&allowed);
    cp_set_free(&any);
    rx_free(x);
    if (r.err) return (int)r.err;
    *out = f;
    return 0;
}
