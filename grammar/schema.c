/*
 * schema.c — a JSON Schema (the subset in docs/STRUCTURED_OUTPUT.md) into
 * an NFA fragment that accepts exactly the compact JSON texts valid against
 * it.
 *
 * Output shape: compact JSON (no whitespace), object properties in the
 * schema's `properties` order, optional ones may be left out, no properties
 * beyond `properties` (additionalProperties absent or false; OpenAI's
 * strict mode). Every keyword is either compiled, an annotation that does
 * not constrain (title, description, default, ...), or refused with its
 * name and JSON pointer — never silently ignored.
 *
 * Lists (object members, array items, string characters) are loops with a
 * single copy of their element (state -> element -> state), so untyped
 * values nested d levels cost O(d), not 2^d.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

static int sfail(schema_ctx *c, moeq_err err, const char *fmt, const char *a) {
    if (!c->err) {
        char msg[256];
        snprintf(msg, sizeof msg, fmt, a);
        moeq_errf(err, c->errstr, c->errstr_size, "%s at %s", msg, c->path[0] ? c->path : "/");
        c->err = err;
    }
    return -1;
}

/* ---- generic JSON ------------------------------------------------------------------ */

static int json_chars(cp_set *s) {
    return cp_set_add(s, 0x20, 0x21) || cp_set_add(s, 0x23, 0x5B) || cp_set_add(s, 0x5D, 0x10FFFF);
}

/* One JSON string character: unescaped, or an escape. */
static frag json_char(nfa *n) {
    cp_set s = {0}, hex = {0};
    if (json_chars(&s)) n->failed = n->nomem = 1;
    frag plain = frag_class(n, &s);
    cp_set_free(&s);
    frag simple = frag_seq(n, frag_bytes(n, "\\", 1), frag_empty(n));
    int32_t after = nfa_state(n);
    static const char esc[] = "\"\\/bfnrt";
    for (const char *e = esc; *e; e++) nfa_range(n, simple.end, after, (uint8_t)*e, (uint8_t)*e);
    if (cp_set_add(&hex, '0', '9') || cp_set_add(&hex, 'a', 'f') || cp_set_add(&hex, 'A', 'F')) n->failed = 1;
    frag u = frag_bytes(n, "u", 1);
    for (int i = 0; i < 4; i++) u = frag_seq(n, u, frag_class(n, &hex));
    cp_set_free(&hex);
    nfa_eps(n, simple.end, u.start);
    nfa_eps(n, u.end, after);
    frag parts[2] = {plain, {simple.start, after}};
    return frag_alt(n, parts, 2);
}

/*
 * One JSON string character from state `from` to state `to`, with the fewest states in between (12): the
 * unescaped characters as UTF-8 (no overlong forms, no surrogates: what json_char's class gives), then the
 * escapes. A length-bounded string is a chain of these, one per position, so its size is 13 states a
 * character (json_char's fragments took 38).
 */
static void json_char_into(nfa *n, int32_t from, int32_t to) {
    int32_t y = nfa_state(n), x_e0 = nfa_state(n), x_ed = nfa_state(n), x = nfa_state(n), z_f0 = nfa_state(n);
    int32_t z = nfa_state(n), z_f4 = nfa_state(n), esc = nfa_state(n), h1 = nfa_state(n), h2 = nfa_state(n);
    int32_t h3 = nfa_state(n), h4 = nfa_state(n);
    nfa_range(n, from, to, 0x20, 0x21), nfa_range(n, from, to, 0x23, 0x5B), nfa_range(n, from, to, 0x5D, 0x7F);
    nfa_range(n, from, y, 0xC2, 0xDF);                                      /* 2 bytes */
    nfa_range(n, from, x_e0, 0xE0, 0xE0), nfa_range(n, x_e0, y, 0xA0, 0xBF); /* 3 bytes */
    nfa_range(n, from, x, 0xE1, 0xEC), nfa_range(n, from, x, 0xEE, 0xEF);
    nfa_range(n, from, x_ed, 0xED, 0xED), nfa_range(n, x_ed, y, 0x80, 0x9F); /* no surrogates */
    nfa_range(n, x, y, 0x80, 0xBF), nfa_range(n, y, to, 0x80, 0xBF);
    nfa_range(n, from, z_f0, 0xF0, 0xF0), nfa_range(n, z_f0, x, 0x90, 0xBF); /* 4 bytes, to U+10FFFF */
    nfa_range(n, from, z, 0xF1, 0xF3), nfa_range(n, z, x, 0x80, 0xBF);
    nfa_range(n, from, z_f4, 0xF4, 0xF4), nfa_range(n, z_f4, x, 0x80, 0x8F);
    nfa_range(n, from, esc, '\\', '\\');
    static const char simple[] = "\"\\/bfnrt";
    for (const char *e = simple; *e; e++) nfa_range(n, esc, to, (uint8_t)*e, (uint8_t)*e);
    nfa_range(n, esc, h1, 'u', 'u');
    int32_t hs[5] = {h1, h2, h3, h4, to};
    for (int i = 0; i < 4; i++)
        nfa_range(n, hs[i], hs[i + 1], '0', '9'), nfa_range(n, hs[i], hs[i + 1], 'a', 'f'),
            nfa_range(n, hs[i], hs[i + 1], 'A', 'F');
}

frag json_string_frag(nfa *n, int min_chars, int max_chars) {
    frag open = frag_bytes(n, "\"", 1);
    if (max_chars < 0) {
        frag f = open;
        for (int i = 0; i < min_chars; i++) f = frag_seq(n, f, json_char(n));
        f = frag_seq(n, f, frag_star(n, json_char(n)));
        return frag_seq(n, f, frag_bytes(n, "\"", 1));
    }
    frag close = frag_bytes(n, "\"", 1);
    int32_t at = open.end, first = n->n_states;
    for (int i = 0; i < max_chars && !n->failed; i++) { /* position i: end here (i >= min), or one more character */
        int32_t next = nfa_state(n);
        if (i >= min_chars) nfa_eps(n, at, close.start);
        json_char_into(n, at, next);
        at = next;
    }
    /* copy i: P(i+1), then character i's 12 states (json_char_into's layout) */
    if (max_chars > 0) nfa_add_run(n, (nfa_run){first, 13, max_chars, min_chars, max_chars, 1});
    nfa_eps(n, at, close.start);
    return (frag){open.start, close.end};
}

static frag digit_run(nfa *n, int at_least) { /* [0-9]{at_least,} */
    frag f = frag_empty(n);
    for (int i = 0; i < at_least; i++) {
        frag d = frag_empty(n);
        int32_t t = nfa_state(n);
        nfa_range(n, d.end, t, '0', '9');
        f = frag_seq(n, f, (frag){d.start, t});
    }
    frag d = frag_empty(n);
    int32_t t = nfa_state(n);
    nfa_range(n, d.end, t, '0', '9');
    return frag_seq(n, f, frag_star(n, (frag){d.start, t}));
}

static frag byte_range(nfa *n, char lo, char hi) {
    frag f = frag_empty(n);
    int32_t t = nfa_state(n);
    nfa_range(n, f.start, t, (uint8_t)lo, (uint8_t)hi);
    return (frag){f.start, t};
}

/* -?(0|[1-9][0-9]*)  */
static frag json_integer(nfa *n) {
    frag parts[2] = {frag_bytes(n, "0", 1), frag_seq(n, byte_range(n, '1', '9'), digit_run(n, 0))};
    return frag_seq(n, frag_opt(n, frag_bytes(n, "-", 1)), frag_alt(n, parts, 2));
}

static frag fraction(nfa *n) { return frag_seq(n, frag_bytes(n, ".", 1), digit_run(n, 1)); }

/* integer (\.[0-9]+)? ([eE][+-]?[0-9]{1,2})? — two exponent digits keep every value a finite double */
static frag json_number(nfa *n) {
    frag e = frag_seq(n, byte_range(n, 'E', 'E'), frag_empty(n));
    nfa_range(n, e.start, e.end, 'e', 'e');
    frag sign[2] = {frag_bytes(n, "+", 1), frag_bytes(n, "-", 1)};
    e = frag_seq(n, e, frag_opt(n, frag_alt(n, sign, 2)));
    e = frag_seq(n, frag_seq(n, e, byte_range(n, '0', '9')), frag_opt(n, byte_range(n, '0', '9')));
    return frag_seq(n, frag_seq(n, json_integer(n), frag_opt(n, fraction(n))), frag_opt(n, e));
}

static frag literal(nfa *n, const char *s) { return frag_bytes(n, s, strlen(s)); }

/* open elem (sep elem)* close, or open close: one copy of elem, looped. */
static frag loop_list(nfa *n, const char *open, frag elem, const char *close) {
    frag o = literal(n, open), cl = literal(n, close);
    int32_t after = nfa_state(n);
    nfa_eps(n, o.end, elem.start);
    nfa_eps(n, o.end, cl.start);
    nfa_eps(n, elem.end, after);
    frag sep = literal(n, ",");
    nfa_eps(n, after, sep.start);
    nfa_eps(n, sep.end, elem.start);
    nfa_eps(n, after, cl.start);
    return (frag){o.start, cl.end};
}

frag json_any_value(nfa *n, int depth) {
    frag parts[7];
    int k = 0;
    parts[k++] = json_string_frag(n, 0, -1);
    parts[k++] = json_number(n);
    parts[k++] = literal(n, "true");
    parts[k++] = literal(n, "false");
    parts[k++] = literal(n, "null");
    if (depth > 0) {
        parts[k++] = json_any_object(n, depth - 1);
        parts[k++] = loop_list(n, "[", json_any_value(n, depth - 1), "]");
    }
    return frag_alt(n, parts, k);
}

frag json_any_object(nfa *n, int depth) {
    frag kv = frag_seq(n, frag_seq(n, json_string_frag(n, 0, -1), literal(n, ":")), json_any_value(n, depth));
    return loop_list(n, "{", kv, "}");
}

/* ---- integer ranges ------------------------------------------------------------------ */

/* Digit strings of one length between a and b (same length, a <= b). */
static frag digits_between(nfa *n, const char *a, const char *b, int len) {
    if (len == 0) return frag_empty(n);
    int every = 1; /* a = 00..0 and b = 99..9: every string, built linearly (the split below would be 2^len) */
    for (int i = 0; i < len && every; i++) every = a[i] == '0' && b[i] == '9';
    if (every) {
        frag any = byte_range(n, '0', '9');
        for (int i = 1; i < len; i++) any = frag_seq(n, any, byte_range(n, '0', '9'));
        return any;
    }
    if (a[0] == b[0]) return frag_seq(n, frag_bytes(n, a, 1), digits_between(n, a + 1, b + 1, len - 1));
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)len), memset(zeros, '0', (size_t)len);
    frag parts[3];
    int k = 0;
    parts[k++] = frag_seq(n, frag_bytes(n, a, 1), digits_between(n, a + 1, nines, len - 1));
    if (a[0] + 1 <= b[0] - 1) {
        frag mid = byte_range(n, (char)(a[0] + 1), (char)(b[0] - 1));
        for (int i = 1; i < len; i++) mid = frag_seq(n, mid, byte_range(n, '0', '9'));
        parts[k++] = mid;
    }
    parts[k++] = frag_seq(n, frag_bytes(n, b, 1), digits_between(n, zeros, b + 1, len - 1));
    return frag_alt(n, parts, k);
}

static int ndigits(long long x) {
    int d = 1;
    while (x >= 10) x /= 10, d++;
    return d;
}

static long long pow10ll(int e) {
    long long p = 1;
    while (e-- > 0) p *= 10;
    return p;
}

/* Decimal integers in [lo, hi] without sign or leading zeros, 0 <= lo; hi < 0: unbounded. */
static frag nonneg_range(nfa *n, long long lo, long long hi) {
    int la = ndigits(lo), lb = hi < 0 ? la : ndigits(hi);
    frag parts[24];
    int k = 0;
    for (int len = la; len <= lb && k < 22; len++) {
        long long a = len == la ? lo : pow10ll(len - 1), b = (hi >= 0 && len == lb) ? hi : pow10ll(len) - 1;
        char sa[24], sb[24];
        snprintf(sa, sizeof sa, "%lld", a);
        snprintf(sb, sizeof sb, "%lld", b);
        parts[k++] = digits_between(n, sa, sb, len);
    }
    if (hi < 0) parts[k++] = frag_seq(n, byte_range(n, '1', '9'), digit_run(n, la)); /* every longer number */
    return k == 1 ? parts[0] : frag_alt(n, parts, k);
}

/* Integers in [lo, hi]; has_lo/has_hi 0: unbounded on that side. */
static frag int_range(nfa *n, int has_lo, long long lo, int has_hi, long long hi) {
    frag parts[2];
    int k = 0;
    if (!has_hi || hi >= 0) parts[k++] = nonneg_range(n, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    if (!has_lo || lo < 0) {
        long long nlo = has_hi && hi < 0 ? -hi : 1, nhi = has_lo ? -lo : -1;
        parts[k++] = frag_seq(n, literal(n, "-"), nonneg_range(n, nlo, nhi));
    }
    return k == 1 ? parts[0] : frag_alt(n, parts, k);
}

/* ---- number bounds ------------------------------------------------------------------- */

/*
 * A bound as the schema wrote it, exactly: |value| = ip.frac (frac's digits
 * without trailing zeros). Bounds are compared as decimals, not doubles, so
 * "maximum": 0.1 admits "0.1" and refuses "0.10001" whatever 0.1's binary
 * value is.
 */
#define MAX_BOUND_FRAC 40
typedef struct decimal {
    int neg;
    long long ip;
    char frac[MAX_BOUND_FRAC + 1];
} decimal;

typedef struct bound {
    int has, strict;
    decimal v;
} bound;

/* A JSON number's text (already valid: gjson parsed it) into a decimal; -1 when it has too many fraction digits. */
static int decimal_parse(const char *s, size_t len, decimal *d) {
    char digits[64];
    int nd = 0, point = 0, exp = 0, esign = 1, neg = 0, seen_point = 0, too_long = 0;
    size_t i = 0;
    if (i < len && s[i] == '-') neg = 1, i++;
    for (; i < len && s[i] != 'e' && s[i] != 'E'; i++) {
        if (s[i] == '.') {
            seen_point = 1;
            continue;
        }
        if (nd == 0 && s[i] == '0') { /* a leading zero: moves the point, not the digits */
            if (seen_point) point--;
            continue;
        }
        if (nd < (int)sizeof digits) digits[nd++] = s[i];
        else too_long = 1;
        if (!seen_point) point++;
    }
    if (i < len) {
        i++;
        if (s[i] == '+' || s[i] == '-') esign = s[i++] == '-' ? -1 : 1;
        for (; i < len && exp < 100000; i++) exp = exp * 10 + (s[i] - '0');
    }
    while (nd > 0 && digits[nd - 1] == '0') nd--;
    memset(d, 0, sizeof *d);
    if (nd == 0) return 0; /* zero, -0 included */
    if (too_long) return -1;
    point += esign * exp; /* value = 0.digits * 10^point */
    if (point > 18) return -1; /* callers refuse |value| > 1e15 before this matters */
    d->neg = neg;
    for (int k = 0; k < point; k++) d->ip = d->ip * 10 + (k < nd ? digits[k] - '0' : 0);
    int lead = point < 0 ? -point : 0, from = point > 0 ? point : 0;
    if (nd > from && lead + nd - from > MAX_BOUND_FRAC) return -1;
    for (int k = 0; k < lead && nd > from; k++) d->frac[k] = '0';
    for (int k = from; k < nd; k++) d->frac[lead + k - from] = digits[k];
    return 0;
}

static int decimal_cmp_abs(const decimal *a, const decimal *b) {
    if (a->ip != b->ip) return a->ip < b->ip ? -1 : 1;
    int c = strcmp(a->frac, b->frac); /* no trailing zeros: a prefix is the smaller */
    return c < 0 ? -1 : c > 0;
}

static int decimal_cmp(const decimal *a, const decimal *b) {
    if (a->neg != b->neg) return a->neg ? -1 : 1;
    return a->neg ? -decimal_cmp_abs(a, b) : decimal_cmp_abs(a, b);
}

/* The tighter of two bounds on one side (upper: the smaller); at equal values the exclusive one. */
static void bound_tighten(bound *b, const decimal *v, int strict, int upper) {
    int c = b->has ? decimal_cmp(v, &b->v) : 0;
    if (!b->has || (upper ? c < 0 : c > 0)) *b = (bound){1, strict, *v};
    else if (c == 0 && strict) b->strict = 1;
}

/*
 * minimum / maximum / exclusiveMinimum / exclusiveMaximum into a lower and an
 * upper bound. Draft 4's boolean exclusiveMinimum/exclusiveMaximum (which make
 * minimum/maximum exclusive) are read too, as older generators still write them.
 */
static int read_bounds(schema_ctx *c, const gj *s, bound *lo, bound *hi) {
    static const char *const kw[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    *lo = *hi = (bound){0};
    int draft4_strict[2] = {0, 0};
    for (int i = 0; i < 4; i++) {
        const gj *v = gj_get(s, kw[i]);
        if (!v) continue;
        if (v->type == GJ_BOOL && i % 2 == 1) {
            if (v->b && !gj_get(s, kw[i - 1]))
                return sfail(c, MOEQ_ERR_FORMAT, "'%s': true without the bound it makes exclusive", kw[i]);
            draft4_strict[i / 2] = v->b;
            continue;
        }
        if (v->type != GJ_NUM) return sfail(c, MOEQ_ERR_FORMAT, "'%s' must be a number", kw[i]);
        if (fabs(v->num) > 1e15) return sfail(c, MOEQ_ERR_UNSUPPORTED, "'%s' beyond 1e15 is not supported", kw[i]);
        decimal d;
        if (decimal_parse(v->raw, v->raw_len, &d))
            return sfail(c, MOEQ_ERR_UNSUPPORTED, "'%s' with more than 40 digits after the point is not supported",
                         kw[i]);
        bound_tighten(i < 2 ? lo : hi, &d, i % 2, i >= 2);
    }
    if (draft4_strict[0]) lo->strict = 1; /* draft 4: minimum/maximum is then the side's only bound */
    if (draft4_strict[1]) hi->strict = 1;
    if (lo->has && hi->has) {
        int cmp = decimal_cmp(&lo->v, &hi->v);
        if (cmp > 0 || (cmp == 0 && (lo->strict || hi->strict)))
            return sfail(c, MOEQ_ERR_FORMAT, "%s", "minimum is above maximum (no value is within the bounds)");
    }
    return 0;
}

/* The least integer within a lower bound (upper: the greatest). */
static long long bound_integer(const bound *b, int upper) {
    long long m = b->v.ip;
    int whole = !b->v.frac[0];
    /* |v| = m.frac; toward +inf for a lower bound, toward -inf for an upper one */
    if (!upper) {
        if (b->v.neg) return whole ? -m + b->strict : -m;
        return whole ? m + b->strict : m + 1;
    }
    if (b->v.neg) return whole ? -m - b->strict : -m - 1;
    return whole ? m - b->strict : m;
}

/*
 * The optional fraction (".digits") after an integer part, as the digits
 * automaton of a comparison: state (p digits read, still equal to lo's
 * fraction, still equal to hi's). Leaving the equality with lo by a larger
 * digit, or with hi by a smaller one, frees that side; the other ways out are
 * dead. An output may end where the value so far is within the bounds. Past
 * both fractions' digits every position behaves alike (both compare against
 * 0), so positions are counted up to that and then loop; max_digits >= 0
 * stops them there instead. *empty: no fraction (nor its absence) fits.
 */
static frag fraction_between(nfa *n, const char *a, int a_strict, int tight_lo, const char *b, int b_strict,
                             int tight_hi, int max_digits, int *empty) {
    int la = tight_lo ? (int)strlen(a) : 0, lb = tight_hi ? (int)strlen(b) : 0;
    int cap = la > lb ? la : lb;
    if (cap < 1) cap = 1; /* position 0 (a digit must follow the point) is never an end */
    if (max_digits >= 0) cap = max_digits;
    int32_t st[MAX_BOUND_FRAC + 2][2][2];
    for (int p = 0; p <= cap; p++)
        for (int x = 0; x < 2; x++) st[p][x][0] = st[p][x][1] = -1;
    frag f = frag_empty(n);
    int32_t end = nfa_state(n);
    *empty = 1;
    /* the value as it stands ends within the bounds? */
#define ENDS_WITHIN(p, tl, th) (!((tl) && ((p) < la || a_strict)) && !((th) && (p) >= lb && b_strict))
    if (ENDS_WITHIN(0, tight_lo, tight_hi)) nfa_eps(n, f.start, end), *empty = 0; /* no fraction */
    if (cap == 0) return (frag){f.start, end};
    int32_t work[(MAX_BOUND_FRAC + 2) * 4][3];
    int nt = 0;
    st[0][tight_lo][tight_hi] = nfa_state(n);
    nfa_range(n, f.start, st[0][tight_lo][tight_hi], '.', '.');
    work[nt][0] = 0, work[nt][1] = tight_lo, work[nt++][2] = tight_hi;
    while (nt > 0) {
        nt--;
        int p = work[nt][0], tl = work[nt][1], th = work[nt][2];
        int32_t from = st[p][tl][th];
        if (p > 0 && ENDS_WITHIN(p, tl, th)) nfa_eps(n, from, end), *empty = 0;
        if (max_digits >= 0 && p == cap) continue;
        int da = tl && p < la ? a[p] - '0' : 0, db = th && p < lb ? b[p] - '0' : 9;
        if (th && p >= lb) db = 0;
        int np = p + 1 < cap ? p + 1 : cap;
        for (int dig = tl ? da : 0; dig <= db;) { /* runs of digits with one target */
            int ntl = tl && dig == da, nth = th && dig == db;
            int last = dig;
            while (last + 1 <= db && (tl && last + 1 == da) == ntl && (th && last + 1 == db) == nth) last++;
            if (st[np][ntl][nth] < 0) {
                st[np][ntl][nth] = nfa_state(n);
                work[nt][0] = np, work[nt][1] = ntl, work[nt++][2] = nth;
            }
            nfa_range(n, from, st[np][ntl][nth], (uint8_t)('0' + dig), (uint8_t)('0' + last));
            dig = last + 1;
        }
    }
#undef ENDS_WITHIN
    return (frag){f.start, end};
}

/* (\.[0-9]{1,k})? */
static frag fraction_upto(nfa *n, int k) {
    if (k == 0) return frag_empty(n);
    frag f = frag_seq(n, literal(n, "."), byte_range(n, '0', '9'));
    for (int i = 1; i < k; i++) f = frag_seq(n, f, frag_opt(n, byte_range(n, '0', '9')));
    return frag_opt(n, f);
}

/* The digits a magnitude's integer part counts against a digit budget: a lone 0 counts none. */
static int int_digits(long long ip) { return ip ? ndigits(ip) : 0; }

/*
 * Unsigned decimals (0|[1-9][0-9]*)(\.[0-9]+)? with a value in [lo, hi] (hi
 * NULL: unbounded); max_digits >= 0 bounds the digits written (a lone integer
 * 0 not counted). *empty: none fits.
 */
static frag magnitude_between(nfa *n, const decimal *lo, int lo_strict, const decimal *hi, int hi_strict,
                              int max_digits, int *empty) {
    char text[24];
    frag parts[24];
    int k = 0, none;
    int lo_room = max_digits < 0 ? -1 : max_digits - int_digits(lo->ip);
    snprintf(text, sizeof text, "%lld", lo->ip);
    frag dead = {nfa_state(n), nfa_state(n)};
    if (hi && hi->ip == lo->ip) {
        if (max_digits >= 0 && lo_room < 0) return *empty = 1, dead;
        frag f = fraction_between(n, lo->frac, lo_strict, 1, hi->frac, hi_strict, 1, lo_room, &none);
        *empty = none;
        return frag_seq(n, literal(n, text), f);
    }
    if (max_digits < 0 || lo_room >= 0) {
        frag f = fraction_between(n, lo->frac, lo_strict, 1, "", 0, 0, lo_room, &none);
        if (!none) parts[k++] = frag_seq(n, literal(n, text), f);
    }
    long long from = lo->ip + 1, to = hi ? hi->ip - 1 : -1;
    if (max_digits < 0) {
        if (to < 0 || to >= from) parts[k++] = frag_seq(n, nonneg_range(n, from, to), frag_opt(n, fraction(n)));
    } else { /* one integer length at a time: each leaves its own room for the fraction */
        for (int len = ndigits(from); len <= max_digits && (to < 0 || len <= ndigits(to)) && k < 22; len++) {
            long long a = len == ndigits(from) ? from : pow10ll(len - 1), z = pow10ll(len) - 1;
            if (to >= 0 && to < z) z = to;
            if (a > z) break;
            parts[k++] = frag_seq(n, nonneg_range(n, a, z), fraction_upto(n, max_digits - len));
        }
    }
    int hi_room = hi && max_digits >= 0 ? max_digits - int_digits(hi->ip) : -1;
    if (hi && (max_digits < 0 || hi_room >= 0)) {
        snprintf(text, sizeof text, "%lld", hi->ip);
        frag f = fraction_between(n, "", 0, 0, hi->frac, hi_strict, 1, hi_room, &none);
        if (!none) parts[k++] = frag_seq(n, literal(n, text), f);
    }
    *empty = k == 0;
    return k == 0 ? dead : k == 1 ? parts[0] : frag_alt(n, parts, k);
}

/* ---- keywords ------------------------------------------------------------------------- */

static const char *const annotations[] = {"title", "description", "$schema", "$id", "$comment", "default",
                                          "examples", "deprecated", "readOnly", "writeOnly", "$defs",
                                          "definitions", "name", "strict", "discriminator", NULL};
static const char *const keywords[] = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                       "items", "minItems", "maxItems", "anyOf", "minLength", "maxLength",
                                       "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                                       "exclusiveMaximum", "uniqueItems", "$ref", "allOf", "oneOf", "prefixItems",
                                       "additionalItems", "minProperties", "maxProperties", "propertyNames", NULL};

static int in_list(const char *k, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(k, *list)) return 1;
    return 0;
}

static int check_keywords(schema_ctx *c, const gj *s) {
    for (size_t i = 0; i < s->n; i++) {
        const char *k = s->keys[i];
        if (in_list(k, annotations)) continue;
        if (!in_list(k, keywords)) return sfail(c, MOEQ_ERR_UNSUPPORTED, "schema keyword '%s' is not supported", k);
    }
    return 0;
}

/* A non-negative integer keyword at most limit (named limit_name in the error); -1 when absent. */
static int count_kw_at_most(schema_ctx *c, const gj *s, const char *kw, int limit, const char *limit_name,
                            long long *out) {
    const gj *v = gj_get(s, kw);
    *out = -1;
    if (!v) return 0;
    if (v->type != GJ_NUM || v->num < 0 || v->num != floor(v->num))
        return sfail(c, MOEQ_ERR_FORMAT, "'%s' must be a non-negative integer", kw);
    if (v->num > limit) {
        char what[96];
        snprintf(what, sizeof what, "'%s' is above the grammar's %s (%d)", kw, limit_name, limit);
        return sfail(c, MOEQ_ERR_LIMIT, "%s", what);
    }
    *out = (long long)v->num;
    return 0;
}

/* minItems/maxItems: each item is a copy of its schema's automaton, so they stay within max_repeat. */
static int count_kw(schema_ctx *c, const gj *s, const char *kw, long long *out) {
    return count_kw_at_most(c, s, kw, c->limits->max_repeat, "max_repeat", out);
}

static void path_push(schema_ctx *c, size_t *mark, const char *a, const char *b) {
    *mark = strlen(c->path);
    snprintf(c->path + *mark, sizeof c->path - *mark, "/%s%s%s", a, b ? "/" : "", b ? b : "");
}

static void path_pop(schema_ctx *c, size_t mark) { c->path[mark] = 0; }

static int sub(schema_ctx *c, const gj *s, int depth, const char *a, const char *b, frag *out) {
    size_t mark;
    path_push(c, &mark, a, b);
    int rc = schema_compile(c, s, depth + 1, out);
    if (rc == 0) path_pop(c, mark);
    return rc;
}

/* ---- types ---------------------------------------------------------------------------- */

/* Formats as regular expressions. date is exact (month lengths, leap years; year 0001..9999), as Python's
 * date.fromisoformat, which jsonschema's format checker uses. */
#define YEAR "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
#define LEAP "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
#define DATE "(" YEAR "-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|" YEAR "-(0[13-9]|1[0-2])-(29|30)|" YEAR \
             "-(0[13578]|1[02])-31|" LEAP "-02-29)"
#define TIME "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define URI_CH "-A-Za-z0-9._~!$&'()*+,;=" /* unreserved and sub-delims ('-' first: a literal) */
#define URI_PCT "%[0-9A-Fa-f][0-9A-Fa-f]"
#define URI_PCHAR "([" URI_CH ":@]|" URI_PCT ")"
#define URI_SEGMENTS "(/" URI_PCHAR "*)*"
#define URI "[A-Za-z][A-Za-z0-9+.-]*:(//(([" URI_CH ":]|" URI_PCT ")*@)?([" URI_CH "]|" URI_PCT ")*(:[0-9]*)?" \
            URI_SEGMENTS "|/(" URI_PCHAR "+" URI_SEGMENTS ")?|" URI_PCHAR "+" URI_SEGMENTS ")?(\\?(" URI_PCHAR \
            "|[/?])*)?(#(" URI_PCHAR "|[/?])*)?"
static const char *const formats[][2] = {
    {"date", DATE},
    {"time", TIME},
    {"date-time", DATE "T" TIME},
    {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
    {"ipv4", "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}"},
    /* unbounded parts: bounded repeats ({1,64}) would give a DFA state per position, each a vocabulary walk */
    {"email", "[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*\\.[A-Za-z]{2,}"},
    /* RFC 3986's URI: scheme ":" hier-part ["?" query] ["#" fragment], every character of its sets */
    {"uri", URI},
    {NULL, NULL},
};

/* ---- a pattern's automaton made deterministic (for the length product) ---------------------------------- */

#define PATTERN_DFA_MAX 4096

typedef struct subset_dfa {
    int32_t *pool;    /* every state's sorted member list, back to back */
    int64_t *off;     /* [n + 1] its start in pool                     */
    int n, cap, pool_len, pool_cap;
    int32_t *next;    /* [n][256] the state a byte leads to, -1 none     */
} subset_dfa;

/* The eps-closure of set[0..k) in NFA n (states inside [s0, s1)), sorted, into set; returns its size. */
static int closure(const nfa *n, int32_t s0, int32_t s1, int32_t *set, int k, uint8_t *seen) {
    memset(seen, 0, (size_t)(s1 - s0));
    for (int i = 0; i < k; i++) seen[set[i] - s0] = 1;
    for (int i = 0; i < k; i++) /* set grows as the stack */
        for (int32_t e = n->head[set[i]]; e >= 0; e = n->edges[e].next)
            if (n->edges[e].is_eps && !seen[n->edges[e].to - s0])
                seen[n->edges[e].to - s0] = 1, set[k++] = n->edges[e].to;
    k = 0;
    for (int32_t u = s0; u < s1; u++)
        if (seen[u - s0]) set[k++] = u;
    return k;
}

static int subset_find_or_add(subset_dfa *d, const int32_t *set, int k) {
    for (int i = 0; i < d->n; i++)
        if (d->off[i + 1] - d->off[i] == k && !memcmp(d->pool + d->off[i], set, (size_t)k * sizeof *set)) return i;
    if (d->n == PATTERN_DFA_MAX) return -2;
    if (d->n + 1 >= d->cap) {
        int cap = d->cap ? d->cap * 2 : 64;
        int64_t *off = realloc(d->off, (size_t)(cap + 1) * sizeof *off);
        if (!off) return -3;
        d->off = off;
        int32_t *next = realloc(d->next, (size_t)cap * 256 * sizeof *next);
        if (!next) return -3;
        d->next = next, d->cap = cap;
    }
    if (d->pool_len + k > d->pool_cap) {
        int cap = (d->pool_len + k) * 2 + 64;
        int32_t *pool = realloc(d->pool, (size_t)cap * sizeof *pool);
        if (!pool) return -3;
        d->pool = pool, d->pool_cap = cap;
    }
    if (d->n == 0) d->off[0] = 0;
    memcpy(d->pool + d->pool_len, set, (size_t)k * sizeof *set);
    d->pool_len += k;
    d->off[d->n + 1] = d->pool_len;
    return d->n++;
}

/*
 * The pattern's automaton (states [s0, s1) entered at body.start, final body.end) as a DFA written into n
 * after them: *out and its states [*d0, *d1). A regex's NFA has several states per character class and
 * group; its DFA far fewer (format uri: 248 NFA states), which is what the length product multiplies.
 * Returns 0, 1 when the DFA would pass PATTERN_DFA_MAX states (the caller keeps the NFA), -1 on NOMEM.
 */
static int pattern_dfa(nfa *n, frag body, int32_t s0, int32_t s1, frag *out, int32_t *d0, int32_t *d1) {
    int W = s1 - s0, rc = -1;
    subset_dfa d = {0};
    int32_t *set = malloc((size_t)W * sizeof *set);
    uint8_t *seen = malloc((size_t)W), *hit = malloc((size_t)W);
    if (!set || !seen || !hit) goto done;
    set[0] = body.start;
    int k = closure(n, s0, s1, set, 1, seen);
    if (subset_find_or_add(&d, set, k) < 0) goto done;
    for (int i = 0; i < d.n; i++) {
        for (int b = 0; b < 256; b++) {
            memset(hit, 0, (size_t)W);
            int m = 0;
            for (int64_t j = d.off[i]; j < d.off[i + 1]; j++)
                for (int32_t e = n->head[d.pool[j]]; e >= 0; e = n->edges[e].next) {
                    const nfa_edge *ed = &n->edges[e];
                    if (!ed->is_eps && ed->lo <= b && b <= ed->hi && !hit[ed->to - s0])
                        hit[ed->to - s0] = 1, set[m++] = ed->to;
                }
            int t = -1;
            if (m) {
                t = subset_find_or_add(&d, set, closure(n, s0, s1, set, m, seen));
                if (t == -2) {
                    rc = 1;
                    goto done;
                }
                if (t < 0) goto done;
            }
            d.next[(size_t)i * 256 + b] = t;
        }
    }
    /* Moore's minimisation: classes split by (class, each byte's target class) until stable; state 0's class
     * is numbered 0, so the start stays the first */
    int *cls = malloc((size_t)d.n * sizeof *cls), *ncls = malloc((size_t)d.n * sizeof *ncls), nc = d.n > 512 ? d.n : 0;
    if (!cls || !ncls) {
        free(cls), free(ncls);
        goto done;
    }
    for (int i = 0; i < d.n; i++) {
        int acc = 0;
        for (int64_t j = d.off[i]; j < d.off[i + 1]; j++) acc |= d.pool[j] == body.end;
        cls[i] = d.n > 512 ? i : acc; /* past 512 states the quadratic refinement costs more than it saves */
    }
    for (int changed = d.n <= 512; changed;) {
        int m = 0;
        for (int i = 0; i < d.n; i++) {
            ncls[i] = -1;
            for (int j = 0; j < i && ncls[i] < 0; j++) { /* the first earlier state with the same signature */
                int same = cls[i] == cls[j];
                for (int b = 0; b < 256 && same; b++) {
                    int ti = d.next[(size_t)i * 256 + b], tj = d.next[(size_t)j * 256 + b];
                    same = (ti < 0 ? -1 : cls[ti]) == (tj < 0 ? -1 : cls[tj]);
                }
                if (same) ncls[i] = ncls[j];
            }
            if (ncls[i] < 0) ncls[i] = m++;
        }
        changed = m != nc;
        nc = m;
        memcpy(cls, ncls, (size_t)d.n * sizeof *cls);
    }
    *d0 = n->n_states;
    for (int i = 0; i < nc; i++) nfa_state(n);
    int32_t end = nfa_state(n);
    *d1 = n->n_states;
    for (int c = 0; c < nc; c++) {
        int i = 0;
        while (cls[i] != c) i++; /* a representative */
        const int32_t *row = d.next + (size_t)i * 256;
        for (int b = 0; b < 256;) { /* runs of bytes with one target class */
            int tc = row[b] < 0 ? -1 : cls[row[b]], e = b;
            while (e + 1 < 256 && (row[e + 1] < 0 ? -1 : cls[row[e + 1]]) == tc) e++;
            if (tc >= 0) nfa_range(n, *d0 + c, *d0 + tc, (uint8_t)b, (uint8_t)e);
            b = e + 1;
        }
        for (int64_t j = d.off[i]; j < d.off[i + 1]; j++)
            if (d.pool[j] == body.end) nfa_eps(n, *d0 + c, end);
    }
    free(cls), free(ncls);
    *out = (frag){*d0 + 0, end};
    rc = 0;
done:
    free(set), free(seen), free(hit), free(d.pool), free(d.off), free(d.next);
    return rc;
}

/*
 * The strings of a pattern's automaton (NFA states [s0, s1), built by regex_compile, entered at body.start)
 * that have between minl and maxl characters (maxl -1: no bound): the product with a character count, one
 * copy of the pattern's states per count 0..K (K = maxl, or minl where only that bounds, the count then
 * saturating). A character is one UTF-8 lead or ASCII byte (a pattern writes no JSON escapes), so a byte
 * range is split at the continuation bytes 0x80-0xBF, which do not count.
 */
static int length_bounded(schema_ctx *c, frag body, int32_t s0, int32_t s1, long long minl, long long maxl,
                          frag *out) {
    nfa *n = c->n;
    int32_t W = s1 - s0;
    long long K = maxl >= 0 ? maxl : minl;
    if (minl < 0) minl = 0;
    for (int32_t u = s0; u < s1; u++)
        for (int32_t e = n->head[u]; e >= 0; e = n->edges[e].next)
            if (n->edges[e].to < s0 || n->edges[e].to >= s1)
                return sfail(c, MOEQ_ERR_INTERNAL, "%s", "a pattern's automaton reaches outside itself");
    if ((K + 1) * (long long)W > (long long)n->max_states)
        return sfail(c, MOEQ_ERR_LIMIT, "%s", "grammar_too_large: minLength/maxLength with this pattern needs more "
                     "than max_nfa_states (the pattern's states once per length)");
    int32_t base = n->n_states;
    for (long long i = 0; i < (K + 1) * W; i++) nfa_state(n);
    if (n->failed) return sfail(c, n->nomem ? MOEQ_ERR_NOMEM : MOEQ_ERR_LIMIT, "%s", "grammar_too_large");
#define AT(u, k) (base + (int32_t)(k) * W + ((u) - s0))
    for (int32_t u = s0; u < s1; u++)
        for (int32_t e = n->head[u]; e >= 0; e = n->edges[e].next) {
            nfa_edge ed = n->edges[e]; /* a copy: adding edges may move the array */
            for (long long k = 0; k <= K; k++) {
                long long up = k < K ? k + 1 : (maxl >= 0 ? -1 : K); /* past maxl: none; past minl alone: stays */
                if (ed.is_eps) {
                    nfa_eps(n, AT(u, k), AT(ed.to, k));
                    continue;
                }
                int lo = ed.lo, hi = ed.hi;
                int32_t from = AT(u, k);
                uint8_t a7 = (uint8_t)(hi < 0x7f ? hi : 0x7f), c0 = (uint8_t)(lo > 0x80 ? lo : 0x80);
                uint8_t c1 = (uint8_t)(hi < 0xbf ? hi : 0xbf), l0 = (uint8_t)(lo > 0xc0 ? lo : 0xc0);
                if (lo < 0x80 && up >= 0) nfa_range(n, from, AT(ed.to, up), (uint8_t)lo, a7);
                if (hi >= 0x80 && lo <= 0xbf) nfa_range(n, from, AT(ed.to, k), c0, c1); /* continuations: no count */
                if (hi >= 0xc0 && up >= 0) nfa_range(n, from, AT(ed.to, up), l0, (uint8_t)hi);
            }
        }
    int32_t end = nfa_state(n);
    for (long long k = minl; k <= K; k++) nfa_eps(n, AT(body.end, k), end);
    *out = (frag){AT(body.start, 0), end};
    if (maxl >= 0) nfa_add_run(n, (nfa_run){base, W, (int32_t)K + 1, (int32_t)minl, (int32_t)K, 0});
#undef AT
    return 0;
}

static int string_pattern(schema_ctx *c, const char *pattern, int anchored, long long minl, long long maxl,
                          frag *out) {
    char err[200] = "";
    frag body;
    int32_t s0 = c->n->n_states;
    int e = regex_compile(c->n, pattern, strlen(pattern), 1, anchored, c->limits->max_repeat, &body, err, sizeof err);
    if (e) return sfail(c, (moeq_err)e, "%s", err);
    if (minl > 0 || maxl >= 0) {
        int32_t s1 = c->n->n_states, d0, d1;
        frag d;
        int rc = pattern_dfa(c->n, body, s0, s1, &d, &d0, &d1);
        if (rc < 0) return sfail(c, MOEQ_ERR_NOMEM, "%s", "a pattern's DFA");
        if (rc == 0) body = d, s0 = d0, s1 = d1; /* else the NFA itself, larger */
        if (length_bounded(c, body, s0, s1, minl, maxl, &body)) return -1;
    }
    *out = frag_seq(c->n, frag_seq(c->n, literal(c->n, "\""), body), literal(c->n, "\""));
    return 0;
}

static int type_string(schema_ctx *c, const gj *s, frag *out) {
    const gj *pattern = gj_get(s, "pattern"), *format = gj_get(s, "format");
    long long minl, maxl;
    int limit = c->limits->max_string_chars;
    if (count_kw_at_most(c, s, "minLength", limit, "max_string_chars", &minl) ||
        count_kw_at_most(c, s, "maxLength", limit, "max_string_chars", &maxl))
        return -1;
    if (maxl >= 0 && minl > maxl) return sfail(c, MOEQ_ERR_FORMAT, "%s", "minLength is above maxLength");
    if (pattern && format) return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "pattern together with format is not supported");
    if (pattern) {
        if (pattern->type != GJ_STR) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'pattern' must be a string");
        return string_pattern(c, pattern->str, 0, minl, maxl, out);
    }
    if (format) {
        if (format->type != GJ_STR) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'format' must be a string");
        for (int i = 0; formats[i][0]; i++)
            if (!strcmp(format->str, formats[i][0])) return string_pattern(c, formats[i][1], 1, minl, maxl, out);
        return sfail(c, MOEQ_ERR_UNSUPPORTED, "string format '%s' is not supported", format->str);
    }
    *out = json_string_frag(c->n, minl < 0 ? 0 : (int)minl, (int)maxl);
    return 0;
}

static int type_integer(schema_ctx *c, const gj *s, frag *out) {
    bound lo, hi;
    if (read_bounds(c, s, &lo, &hi)) return -1;
    long long ilo = lo.has ? bound_integer(&lo, 0) : 0, ihi = hi.has ? bound_integer(&hi, 1) : 0;
    if (lo.has && hi.has && ilo > ihi) return sfail(c, MOEQ_ERR_FORMAT, "%s", "no integer is within the bounds");
    *out = lo.has || hi.has ? int_range(c->n, lo.has, ilo, hi.has, ihi) : json_integer(c->n);
    return 0;
}

/* Significant digits of a decimal (1000 and 0.001: one). */
static int significant_digits(const decimal *d) {
    char t[24 + MAX_BOUND_FRAC];
    snprintf(t, sizeof t, "%lld%s", d->ip, d->frac);
    size_t i = 0, e = strlen(t);
    while (i < e && t[i] == '0') i++;
    while (e > i && t[e - 1] == '0') e--;
    return (int)(e - i);
}

/*
 * A bounded number is written without an exponent (as xgrammar does), so the
 * bounds compare digit by digit: the non-negative values, then "-" and the
 * negative ones' magnitudes (never "-0").
 *
 * Readers hold numbers as doubles, which round: a value just inside an
 * exclusive bound can read as the bound itself (99.9999999999999999 is 100.0).
 * Rounding keeps order, so inclusive bounds are safe; beside an exclusive one
 * numbers get at most 15 digits (a lone integer 0 not counted) and the bound at
 * most 15 significant digits. Distinct decimals of 15 significant digits in
 * the double range are distinct doubles (DBL_DIG), so a value the grammar
 * admits stays strictly inside once read.
 */
#define EXCLUSIVE_DIGITS 15

static int type_number(schema_ctx *c, const gj *s, frag *out) {
    bound lo, hi;
    if (read_bounds(c, s, &lo, &hi)) return -1;
    nfa *n = c->n;
    if (!lo.has && !hi.has) return *out = json_number(n), 0;
    int max_digits = -1;
    if ((lo.has && lo.strict) || (hi.has && hi.strict)) {
        if ((lo.strict && significant_digits(&lo.v) > EXCLUSIVE_DIGITS) ||
            (hi.strict && significant_digits(&hi.v) > EXCLUSIVE_DIGITS))
            return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s",
                         "an exclusive bound of more than 15 significant digits (a double's) is not supported");
        max_digits = EXCLUSIVE_DIGITS;
    }
    decimal zero = {0};
    frag parts[2];
    int k = 0, empty;
    int hi_zero = hi.has && !hi.v.ip && !hi.v.frac[0];
    if (!hi.has || (!hi.v.neg && !(hi_zero && hi.strict))) {
        int from_lo = lo.has && !lo.v.neg;
        frag f = magnitude_between(n, from_lo ? &lo.v : &zero, from_lo && lo.strict, hi.has ? &hi.v : NULL, hi.strict,
                                   max_digits, &empty);
        if (!empty) parts[k++] = f;
    }
    if (!lo.has || lo.v.neg) {
        decimal mlo = zero, mhi = lo.v;
        int below_neg = hi.has && hi.v.neg;
        if (below_neg) mlo = hi.v, mlo.neg = 0;
        mhi.neg = 0;
        frag f = magnitude_between(n, &mlo, below_neg ? hi.strict : 1, lo.has ? &mhi : NULL, lo.strict, max_digits,
                                   &empty);
        if (!empty) parts[k++] = frag_seq(n, literal(n, "-"), f);
    }
    if (k == 0) return sfail(c, MOEQ_ERR_FORMAT, "%s", "no number of at most 15 digits is within the bounds");
    *out = k == 1 ? parts[0] : frag_alt(n, parts, k);
    return 0;
}

static int is_required(const gj *req, const char *key) {
    for (size_t i = 0; req && i < req->n; i++)
        if (req->items[i]->type == GJ_STR && !strcmp(req->items[i]->str, key)) return 1;
    return 0;
}

static frag key_frag(nfa *n, const char *key) {
    gj k = {.type = GJ_STR, .str = (char *)key, .len = strlen(key)};
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (gj_write(&k, &buf, &len, &cap)) n->failed = n->nomem = 1;
    frag f = frag_bytes(n, buf ? buf : "", buf ? len : 0);
    free(buf);
    return frag_seq(n, f, literal(n, ":"));
}

static int enum_values(schema_ctx *c, const gj *s, int depth, frag *out);
static int type_string(schema_ctx *c, const gj *s, frag *out);

/* A map's key: any JSON string, or one valid against propertyNames (a string schema: type string, pattern,
 * format, lengths, or string enum/const), compiled as a string. */
static int map_key(schema_ctx *c, const gj *names, frag *out) {
    if (!names) return *out = json_string_frag(c->n, 0, -1), 0;
    static const char *const string_kw[] = {"type", "pattern", "format", "minLength", "maxLength", "enum", "const",
                                            NULL};
    const gj *t = names->type == GJ_OBJ ? gj_get(names, "type") : NULL;
    int ok = names->type == GJ_OBJ && (!t || (t->type == GJ_STR && !strcmp(t->str, "string")));
    for (size_t i = 0; ok && i < names->n; i++)
        ok = in_list(names->keys[i], annotations) || in_list(names->keys[i], string_kw);
    const gj *e = ok ? gj_get(names, "enum") : NULL, *cst = ok ? gj_get(names, "const") : NULL;
    for (size_t i = 0; ok && e && e->type == GJ_ARR && i < e->n; i++) ok = e->items[i]->type == GJ_STR;
    if (ok && cst) ok = cst->type == GJ_STR;
    if (!ok)
        return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "'propertyNames' other than a string schema (type string, "
                     "pattern, format, lengths, string enum/const) is not supported");
    size_t mark;
    path_push(c, &mark, "propertyNames", NULL);
    int rc = e || cst ? enum_values(c, names, 0, out) : type_string(c, names, out);
    if (rc == 0) path_pop(c, mark);
    return rc;
}

static int value_literal(schema_ctx *c, const gj *v, frag *out);

#define MAX_SET_VALUES 64 /* a finite set's values written apart (uniqueItems, a map's distinct keys) */

/*
 * A map that must have at least two members: a repeated key would make fewer (a reader keeps one), so the keys
 * must differ, which a regular language can keep only over a finite set of them: propertyNames' string enum
 * or const. The members are then distinct keys in the enum's order (as unique_items), within the bounds.
 */
static int distinct_keys_map(schema_ctx *c, const gj *names, const gj *add, long long mn, long long mx, int depth,
                             frag *out) {
    nfa *n = c->n;
    const gj *e = names && names->type == GJ_OBJ ? gj_get(names, "enum") : NULL;
    const gj *cst = names && names->type == GJ_OBJ ? gj_get(names, "const") : NULL;
    const gj *keys[MAX_SET_VALUES];
    int m = 0;
    for (size_t i = 0; (e && e->type == GJ_ARR && i < e->n) || (!e && cst && i < 1); i++) {
        const gj *k = e ? e->items[i] : cst;
        int dup = k->type != GJ_STR;
        for (int j = 0; j < m && !dup; j++) dup = keys[j]->len == k->len && !memcmp(keys[j]->str, k->str, k->len);
        if (dup) continue;
        if (m == MAX_SET_VALUES) break;
        keys[m++] = k;
    }
    if (!m || (e && m == MAX_SET_VALUES && e->n > MAX_SET_VALUES))
        return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "minProperties of 2 or more needs propertyNames with a finite "
                     "set of keys (a string enum of at most 64): a regular language cannot keep other keys distinct");
    if (mn > m)
        return sfail(c, MOEQ_ERR_FORMAT, "%s", "minProperties is above the number of keys propertyNames allows");
    int cap = mx >= 0 ? (int)(mx < m ? mx : m) : m;
    int32_t *st = malloc((size_t)(m + 1) * (size_t)(cap + 1) * sizeof *st);
    if (!st) return sfail(c, MOEQ_ERR_NOMEM, "%s", "map");
    for (int i = 0; i <= m; i++)
        for (int k = 0; k <= cap; k++) st[i * (cap + 1) + k] = nfa_state(n);
    frag open = literal(n, "{"), close = literal(n, "}");
    nfa_eps(n, open.end, st[0]);
    for (int i = 0; i < m; i++)
        for (int k = 0; k <= cap; k++) {
            int32_t from = st[i * (cap + 1) + k];
            nfa_eps(n, from, st[(i + 1) * (cap + 1) + k]); /* key i left out */
            if (k == cap) continue;
            frag key, value;
            if (value_literal(c, keys[i], &key)) return free(st), -1;
            if (add && add->type == GJ_OBJ) {
                if (sub(c, add, depth, "additionalProperties", NULL, &value)) return free(st), -1;
            } else {
                value = json_any_value(n, MOEQ_GRAMMAR_ANY_DEPTH - 1);
            }
            frag member = frag_seq(n, frag_seq(n, key, literal(n, ":")), value);
            if (k) member = frag_seq(n, literal(n, ","), member);
            nfa_eps(n, from, member.start);
            nfa_eps(n, member.end, st[(i + 1) * (cap + 1) + k + 1]);
        }
    for (int k = (int)mn; k <= cap; k++) nfa_eps(n, st[m * (cap + 1) + k], close.start);
    free(st);
    *out = (frag){open.start, close.end};
    return 0;
}

/*
 * A map (pydantic's dict[str, X]: additionalProperties a schema, no properties): "{" key ":" value, ... "}"
 * with between minProperties and maxProperties members. Below two required members a key may repeat (JSON
 * allows it; a reader keeps one, which still meets a minimum of one and any maximum).
 */
static int type_map(schema_ctx *c, const gj *s, const gj *add, int depth, frag *out) {
    nfa *n = c->n;
    long long mn, mx;
    if (count_kw(c, s, "minProperties", &mn) || count_kw(c, s, "maxProperties", &mx)) return -1;
    if (mn < 0) mn = 0;
    if (mx >= 0 && mn > mx) return sfail(c, MOEQ_ERR_FORMAT, "%s", "minProperties is above maxProperties");
    const gj *names = gj_get(s, "propertyNames");
    if (!names && (!add || add->type == GJ_BOOL) && mn == 0 && mx < 0)
        return *out = json_any_object(n, MOEQ_GRAMMAR_ANY_DEPTH - 1), 0;
    if (mx == 0) return *out = literal(n, "{}"), 0;
    if (mn >= 2) return distinct_keys_map(c, names, add, mn, mx, depth, out);
    frag open = literal(n, "{"), close = literal(n, "}");
    int32_t at = open.end;
    for (long long k = 0; mx < 0 || k < mx; k++) {
        if (k >= mn) nfa_eps(n, at, close.start);
        frag key, value;
        if (map_key(c, names, &key)) return -1;
        if (add && add->type == GJ_OBJ) {
            if (sub(c, add, depth, "additionalProperties", NULL, &value)) return -1;
        } else {
            value = json_any_value(n, MOEQ_GRAMMAR_ANY_DEPTH - 1);
        }
        frag member = frag_seq(n, frag_seq(n, key, literal(n, ":")), value);
        if (k) member = frag_seq(n, literal(n, ","), member);
        if (mx < 0 && k >= mn && k >= 1) { /* unbounded: one looped copy from here */
            int32_t loop = nfa_state(n);
            nfa_eps(n, at, loop);
            nfa_eps(n, loop, member.start);
            nfa_eps(n, member.end, loop);
            nfa_eps(n, loop, close.start);
            return *out = (frag){open.start, close.end}, 0;
        }
        nfa_eps(n, at, member.start);
        at = member.end;
    }
    nfa_eps(n, at, close.start);
    return *out = (frag){open.start, close.end}, 0;
}

static int type_object(schema_ctx *c, const gj *s, int depth, frag *out) {
    nfa *n = c->n;
    const gj *props = gj_get(s, "properties"), *req = gj_get(s, "required"), *add = gj_get(s, "additionalProperties");
    if (props && props->type != GJ_OBJ) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'properties' must be an object");
    if (req && req->type != GJ_ARR) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'required' must be an array");
    if (add && add->type != GJ_BOOL && add->type != GJ_OBJ)
        return sfail(c, MOEQ_ERR_FORMAT, "%s", "'additionalProperties' must be a boolean or a schema");
    int add_false = add && add->type == GJ_BOOL && !add->b;
    if (!props && !req) return add_false ? (*out = literal(n, "{}"), 0) : type_map(c, s, add, depth, out);
    /* with properties only they are written: additionalProperties (true or a schema) holds for no extra member;
     * minProperties/maxProperties only where every output meets them */
    long long mn, mx;
    if (count_kw(c, s, "minProperties", &mn) || count_kw(c, s, "maxProperties", &mx)) return -1;
    if ((mn >= 0 && (long long)(req ? req->n : 0) < mn) || (mx >= 0 && (long long)(props ? props->n : 0) > mx))
        return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "minProperties/maxProperties beside 'properties' only where "
                     "'required' reaches the minimum and 'properties' stays within the maximum");
    if (gj_get(s, "propertyNames"))
        return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "'propertyNames' beside 'properties' is not supported");
    for (size_t i = 0; req && i < req->n; i++)
        if (req->items[i]->type != GJ_STR || !gj_get(props, req->items[i]->str))
            return sfail(c, MOEQ_ERR_UNSUPPORTED, "required property '%s' is not in 'properties'",
                         req->items[i]->type == GJ_STR ? req->items[i]->str : "?");
    frag open = literal(n, "{");
    int32_t s0 = open.end, s1 = -1; /* s0: nothing written yet; s1: a member written */
    for (size_t i = 0; props && i < props->n; i++) {
        frag value;
        if (sub(c, props->items[i], depth, "properties", props->keys[i], &value)) return -1;
        frag member = frag_seq(n, key_frag(n, props->keys[i]), value);
        int32_t n0 = nfa_state(n), n1 = nfa_state(n);
        nfa_eps(n, s0, member.start);
        if (s1 >= 0) {
            frag comma = literal(n, ",");
            nfa_eps(n, s1, comma.start);
            nfa_eps(n, comma.end, member.start);
        }
        nfa_eps(n, member.end, n1);
        if (!is_required(req, props->keys[i])) {
            nfa_eps(n, s0, n0);
            if (s1 >= 0) nfa_eps(n, s1, n1);
        }
        s0 = n0, s1 = n1;
    }
    frag close = literal(n, "}");
    nfa_eps(n, s0, close.start);
    if (s1 >= 0) nfa_eps(n, s1, close.start);
    *out = (frag){open.start, close.end};
    return 0;
}

static int item(schema_ctx *c, const gj *items, int depth, frag *out) {
    if (!items) return *out = json_any_value(c->n, MOEQ_GRAMMAR_ANY_DEPTH - 1), 0;
    return sub(c, items, depth, "items", NULL, out);
}

static int type_matches(const gj *v, const gj *type);
static int may_equal(const gj *a, const gj *b);
static const gj *deref(const schema_ctx *c, const gj *s);


/*
 * The values an item schema allows when they are few (uniqueItems needs them): enum/const (filtered by
 * "type"), boolean, null, an integer range of at most MAX_SET_VALUES. Equal values (1 and 1.0) are kept
 * once. Returns the count into vals, or -1 (refused, said why).
 */
static int finite_values(schema_ctx *c, const gj *items, gj *store, char (*text)[24], const gj **vals) {
    static const char *const why = "'uniqueItems': true needs items with a finite set of values (enum, const, "
                                   "boolean, null, or an integer range of at most 64): a regular language "
                                   "cannot tell other items apart";
    const gj *it = items ? deref(c, items) : NULL;
    if (!it || it->type != GJ_OBJ) return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", why);
    static const char *const allowed[] = {"enum", "const", "type", "minimum", "maximum", "exclusiveMinimum",
                                          "exclusiveMaximum", NULL};
    for (size_t i = 0; i < it->n; i++)
        if (!in_list(it->keys[i], annotations) && !in_list(it->keys[i], allowed))
            return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", why);
    const gj *e = gj_get(it, "enum"), *cst = gj_get(it, "const"), *type = gj_get(it, "type");
    int n = 0;
    if (e || cst) {
        if (e && e->type != GJ_ARR) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'enum' must be an array");
        for (size_t i = 0; i < (e ? e->n : 1); i++) {
            const gj *v = e ? e->items[i] : cst;
            if (cst && e && !(v->raw_len == cst->raw_len && !memcmp(v->raw, cst->raw, v->raw_len))) continue;
            if (!type_matches(v, type)) continue;
            int dup = 0;
            for (int j = 0; j < n && !dup; j++) dup = v->type != GJ_ARR && v->type != GJ_OBJ && may_equal(vals[j], v);
            if (dup) continue;
            if (n == MAX_SET_VALUES) return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", why);
            vals[n++] = v;
        }
        return n;
    }
    const char *t = type && type->type == GJ_STR ? type->str : "";
    if (!strcmp(t, "boolean")) {
        store[0] = (gj){.type = GJ_BOOL, .b = 1}, store[1] = (gj){.type = GJ_BOOL, .b = 0};
        vals[0] = &store[0], vals[1] = &store[1];
        return 2;
    }
    if (!strcmp(t, "null")) return store[0] = (gj){.type = GJ_NULL}, vals[0] = &store[0], 1;
    bound lo, hi;
    if (strcmp(t, "integer") || read_bounds(c, it, &lo, &hi) || !lo.has || !hi.has) {
        if (!c->err) sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", why);
        return -1;
    }
    long long a = bound_integer(&lo, 0), z = bound_integer(&hi, 1);
    if (a > z || z - a >= MAX_SET_VALUES) return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", why);
    for (long long v = a; v <= z; v++, n++) {
        snprintf(text[n], sizeof text[n], "%lld", v);
        store[n] = (gj){.type = GJ_NUM, .num = (double)v, .is_int = 1, .raw = text[n], .raw_len = strlen(text[n])};
        vals[n] = &store[n];
    }
    return n;
}

/*
 * uniqueItems over a finite set: the arrays whose items are distinct values of vals, written in vals' order
 * (a set's members in the schema's order: as valid as any other order, and a regular language). State
 * (i values considered, k taken; k capped at max(min, 1) when unbounded) takes value i or skips it.
 */
static int unique_items(schema_ctx *c, const gj **vals, int m, long long mn, long long mx, frag *out) {
    nfa *n = c->n;
    if (mn > m)
        return sfail(c, MOEQ_ERR_FORMAT, "%s", "minItems is above the number of distinct values the items allow");
    int cap = mx >= 0 ? (int)(mx < m ? mx : m) : (int)(mn > 1 ? mn : 1);
    int32_t *st = malloc((size_t)(m + 1) * (size_t)(cap + 1) * sizeof *st);
    if (!st) return sfail(c, MOEQ_ERR_NOMEM, "%s", "uniqueItems");
    for (int i = 0; i <= m; i++)
        for (int k = 0; k <= cap; k++) st[i * (cap + 1) + k] = nfa_state(n);
    frag open = literal(n, "["), close = literal(n, "]");
    nfa_eps(n, open.end, st[0]);
    for (int i = 0; i < m; i++)
        for (int k = 0; k <= cap; k++) {
            int32_t from = st[i * (cap + 1) + k];
            nfa_eps(n, from, st[(i + 1) * (cap + 1) + k]); /* skip value i */
            if (k == cap && mx >= 0) continue;          /* as many as maxItems allows */
            frag v;
            if (value_literal(c, vals[i], &v)) return free(st), -1;
            if (k) v = frag_seq(n, literal(n, ","), v);
            nfa_eps(n, from, v.start);
            nfa_eps(n, v.end, st[(i + 1) * (cap + 1) + (k < cap ? k + 1 : cap)]);
        }
    for (int k = (int)mn; k <= cap; k++) nfa_eps(n, st[m * (cap + 1) + k], close.start);
    free(st);
    *out = (frag){open.start, close.end};
    return 0;
}

/*
 * A tuple: prefixItems (or draft 7's "items" array) one schema per position, then "items" (draft 7:
 * "additionalItems") for the rest; minItems/maxItems bound the length. Items past the prefix are written
 * only where minItems needs them or an explicit schema allows them (a tuple's length is the prefix's).
 */
static int tuple_items(schema_ctx *c, const gj *prefix, const gj *rest, const char *rest_kw, long long mn,
                       long long mx, int depth, frag *out) {
    nfa *n = c->n;
    int np = (int)prefix->n, rest_none = rest && rest->type == GJ_BOOL && !rest->b;
    if (rest_none && mn > np)
        return sfail(c, MOEQ_ERR_FORMAT, "%s", "minItems is above the tuple's length and no more items are allowed");
    long long last = np; /* positions written at most */
    if (rest && !rest_none) last = mx >= 0 ? mx : -1;
    else if (mn > np) last = mn;
    if (mx >= 0 && last > mx) last = mx;
    frag open = literal(n, "["), close = literal(n, "]");
    int32_t cur = open.end;
    for (long long k = 0; last < 0 || k < last; k++) {
        if (k >= mn) nfa_eps(n, cur, close.start);
        frag e;
        char idx[24];
        snprintf(idx, sizeof idx, "%lld", k);
        if (k < np) {
            if (sub(c, prefix->items[k], depth, rest_kw[0] == 'a' ? "items" : "prefixItems", idx, &e)) return -1;
        } else if (rest && !rest_none) {
            if (sub(c, rest, depth, rest_kw, NULL, &e)) return -1;
            if (last < 0 && k >= mn && k >= np && k >= 1) { /* unbounded: one looped copy from here */
                frag more = frag_seq(n, literal(n, ","), e);
                int32_t loop = nfa_state(n);
                nfa_eps(n, cur, loop);
                nfa_eps(n, loop, more.start);
                nfa_eps(n, more.end, loop);
                nfa_eps(n, loop, close.start);
                return *out = (frag){open.start, close.end}, 0;
            }
        } else {
            e = json_any_value(n, MOEQ_GRAMMAR_ANY_DEPTH - 1); /* only as many as minItems needs */
        }
        frag piece = k ? frag_seq(n, literal(n, ","), e) : e;
        nfa_eps(n, cur, piece.start);
        cur = piece.end;
    }
    nfa_eps(n, cur, close.start);
    return *out = (frag){open.start, close.end}, 0;
}

static int type_array(schema_ctx *c, const gj *s, int depth, frag *out) {
    nfa *n = c->n;
    const gj *items = gj_get(s, "items"), *prefix = gj_get(s, "prefixItems"), *uniq = gj_get(s, "uniqueItems");
    long long mn, mx;
    if (count_kw(c, s, "minItems", &mn) || count_kw(c, s, "maxItems", &mx)) return -1;
    if (mn < 0) mn = 0;
    if (mx >= 0 && mn > mx) return sfail(c, MOEQ_ERR_FORMAT, "%s", "minItems is above maxItems");
    if (uniq && uniq->type != GJ_BOOL) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'uniqueItems' must be a boolean");
    int unique = uniq && uniq->b;
    if (prefix && prefix->type != GJ_ARR) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'prefixItems' must be an array");
    if ((prefix || (items && items->type == GJ_ARR)) && unique)
        return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "'uniqueItems': true on a tuple is not supported");
    if (prefix) {
        if (items && items->type == GJ_ARR)
            return sfail(c, MOEQ_ERR_FORMAT, "%s", "'items' must be a schema beside 'prefixItems'");
        return tuple_items(c, prefix, items, "items", mn, mx, depth, out);
    }
    if (items && items->type == GJ_ARR)
        return tuple_items(c, items, gj_get(s, "additionalItems"), "additionalItems", mn, mx, depth, out);
    if (gj_get(s, "additionalItems"))
        return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "'additionalItems' without an 'items' array is not supported");
    if (unique) {
        gj store[MAX_SET_VALUES];
        char text[MAX_SET_VALUES][24];
        const gj *vals[MAX_SET_VALUES];
        int m = finite_values(c, items, store, text, vals);
        if (m < 0) return -1;
        return unique_items(c, vals, m, mn, mx, out);
    }
    frag e;
    if (mn == 0 && mx < 0) {
        if (item(c, items, depth, &e)) return -1;
        return *out = loop_list(n, "[", e, "]"), 0;
    }
    if (mx == 0) return *out = literal(n, "[]"), 0;
    frag f = literal(n, "[");
    int32_t none = f.end; /* mn == 0: the empty array */
    for (long long i = 0; i < (mn ? mn : 1); i++) {
        if (item(c, items, depth, &e)) return -1;
        f = frag_seq(n, i ? frag_seq(n, f, literal(n, ",")) : f, e);
    }
    if (mx < 0) {
        if (item(c, items, depth, &e)) return -1;
        f = frag_seq(n, f, frag_star(n, frag_seq(n, literal(n, ","), e)));
    } else {
        for (long long i = (mn ? mn : 1); i < mx; i++) { /* nested optionals: ,e(,e(,e)?)? */
            if (item(c, items, depth, &e)) return -1;
            f = frag_seq(n, f, frag_opt(n, frag_seq(n, literal(n, ","), e)));
        }
    }
    frag close = literal(n, "]");
    f = frag_seq(n, f, close);
    if (mn == 0) nfa_eps(n, none, close.start);
    *out = f;
    return 0;
}

static int type_one(schema_ctx *c, const gj *s, const char *type, int depth, frag *out) {
    if (!strcmp(type, "string")) return type_string(c, s, out);
    if (!strcmp(type, "integer")) return type_integer(c, s, out);
    if (!strcmp(type, "number")) return type_number(c, s, out);
    if (!strcmp(type, "boolean")) {
        frag p[2] = {literal(c->n, "true"), literal(c->n, "false")};
        return *out = frag_alt(c->n, p, 2), 0;
    }
    if (!strcmp(type, "null")) return *out = literal(c->n, "null"), 0;
    if (!strcmp(type, "object")) return type_object(c, s, depth, out);
    if (!strcmp(type, "array")) return type_array(c, s, depth, out);
    return sfail(c, MOEQ_ERR_FORMAT, "unknown type '%s'", type);
}

/* ---- enum / const / anyOf ------------------------------------------------------------------ */

static int type_matches(const gj *v, const gj *type) {
    if (!type) return 1;
    for (size_t i = 0; i < (type->type == GJ_ARR ? type->n : 1); i++) {
        const gj *t = type->type == GJ_ARR ? type->items[i] : type;
        if (t->type != GJ_STR) continue;
        const char *ts = t->str;
        if ((!strcmp(ts, "string") && v->type == GJ_STR) || (!strcmp(ts, "number") && v->type == GJ_NUM) ||
            (!strcmp(ts, "integer") && v->type == GJ_NUM && v->num == floor(v->num)) ||
            (!strcmp(ts, "boolean") && v->type == GJ_BOOL) || (!strcmp(ts, "null") && v->type == GJ_NULL) ||
            (!strcmp(ts, "object") && v->type == GJ_OBJ) || (!strcmp(ts, "array") && v->type == GJ_ARR))
            return 1;
    }
    return 0;
}

static int value_literal(schema_ctx *c, const gj *v, frag *out) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (gj_write(v, &buf, &len, &cap)) return free(buf), sfail(c, MOEQ_ERR_NOMEM, "%s", "out of memory");
    *out = frag_bytes(c->n, buf, len);
    free(buf);
    return 0;
}

/*
 * The schema's other constraints beside enum/const ({"enum": ["a", "bb"], "maxLength": 1}), compiled into a
 * scratch automaton that each value's text is matched against: a value is written only where the rest of the
 * schema admits it (before, only "type" filtered them, so "bb" could be written there). The scratch automaton
 * writes the subset of values the grammar writes (compact, no exponent beside bounds), so a value outside it
 * is left out even where JSON Schema would allow it: never one that is not valid. *rest: 0 when there is
 * nothing but type and annotations to check.
 */
static int enum_rest(schema_ctx *c, const gj *s, nfa *scratch, frag *rest, int *has, int depth) {
    char *keys[64];
    gj *items[64];
    gj r = {.type = GJ_OBJ, .keys = keys, .items = items};
    *has = 0;
    for (size_t i = 0; i < s->n && r.n < 64; i++) {
        if (!strcmp(s->keys[i], "enum") || !strcmp(s->keys[i], "const")) continue;
        keys[r.n] = s->keys[i], items[r.n++] = s->items[i];
        *has |= strcmp(s->keys[i], "type") && !in_list(s->keys[i], annotations);
    }
    if (!*has) return 0;
    if (s->n > 63) return sfail(c, MOEQ_ERR_LIMIT, "%s", "more than 62 keywords beside 'enum'");
    /* untyped: every type, each with the keywords that apply to it ({"minimum": 2} leaves strings alone) */
    static gj all_types[6] = {{.type = GJ_STR, .str = "string", .len = 6}, {.type = GJ_STR, .str = "number", .len = 6},
                              {.type = GJ_STR, .str = "boolean", .len = 7}, {.type = GJ_STR, .str = "null", .len = 4},
                              {.type = GJ_STR, .str = "object", .len = 6}, {.type = GJ_STR, .str = "array", .len = 5}};
    static gj *all_items[6] = {&all_types[0], &all_types[1], &all_types[2], &all_types[3], &all_types[4],
                               &all_types[5]};
    static gj any_type = {.type = GJ_ARR, .items = all_items, .n = 6};
    if (!gj_get(&r, "type")) keys[r.n] = "type", items[r.n++] = &any_type;
    nfa_init(scratch, c->limits->max_nfa_states);
    schema_ctx sc = *c;
    sc.n = scratch;
    int rc = schema_compile(&sc, &r, depth, rest);
    if (rc && !c->err) c->err = sc.err; /* the message is already in errstr */
    return rc;
}

static int enum_values(schema_ctx *c, const gj *s, int depth, frag *out) {
    const gj *e = gj_get(s, "enum"), *cst = gj_get(s, "const"), *type = gj_get(s, "type");
    if (e && e->type != GJ_ARR) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'enum' must be an array");
    nfa scratch = {0};
    frag rest;
    int has_rest = 0;
    if (enum_rest(c, s, &scratch, &rest, &has_rest, depth)) return nfa_free(&scratch), -1;
    frag alts = {nfa_state(c->n), nfa_state(c->n)};
    int k = 0, typed = 0;
    for (size_t i = 0; i < (e ? e->n : 1); i++) {
        const gj *v = e ? e->items[i] : cst;
        if (cst && e && !(v->raw_len == cst->raw_len && !memcmp(v->raw, cst->raw, v->raw_len))) continue;
        if (!type_matches(v, type)) continue;
        typed++;
        if (has_rest) {
            char *buf = NULL;
            size_t len = 0, cap = 0;
            int ok = gj_write(v, &buf, &len, &cap) ? -1 : nfa_match(&scratch, rest, buf, len);
            free(buf);
            if (ok < 0) return nfa_free(&scratch), sfail(c, MOEQ_ERR_NOMEM, "%s", "out of memory");
            if (!ok) continue;
        }
        frag f;
        if (value_literal(c, v, &f)) return nfa_free(&scratch), -1;
        nfa_eps(c->n, alts.start, f.start);
        nfa_eps(c->n, f.end, alts.end);
        k++;
    }
    nfa_free(&scratch);
    if (!k)
        return sfail(c, MOEQ_ERR_FORMAT, "%s", typed ? "no value of 'enum'/'const' meets the schema's other keywords"
                                                     : "no value of 'enum'/'const' matches the schema's type");
    return *out = alts, 0;
}


/* ---- $ref and allOf -------------------------------------------------------------------------- */

/* A keyword that takes the whole schema: nothing beside it but annotations. */
static int alone(schema_ctx *c, const gj *s, const char *kw, const char *hint) {
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->keys[i], kw) && !in_list(s->keys[i], annotations)) {
            char what[96];
            snprintf(what, sizeof what, "'%s' beside '%s' is not supported (%s)", kw, s->keys[i], hint);
            return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", what);
        }
    return 0;
}

/* The schema a local "$ref" ("#", "#/$defs/Name", "#/definitions/a~1b/items/0": a JSON pointer into the
 * document) names, or NULL. */
static const gj *resolve_ref(const gj *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const gj *at = root;
    for (const char *p = ref + 1; *p;) {
        if (*p != '/' || !at) return NULL;
        char seg[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~') {
                if (p[1] != '0' && p[1] != '1') return NULL;
                ch = p[1] == '0' ? '~' : '/';
                p++;
            }
            if (n + 1 >= sizeof seg) return NULL;
            seg[n++] = ch;
        }
        seg[n] = 0;
        if (at->type == GJ_OBJ) at = gj_get(at, seg);
        else if (at->type == GJ_ARR) {
            char *end;
            unsigned long k = strtoul(seg, &end, 10);
            at = n && !*end && k < at->n ? at->items[k] : NULL;
        } else
            return NULL;
    }
    return at;
}

/*
 * "$ref": the schema it names, compiled in its place (pydantic and most generators put shared models in
 * "$defs"). A reference back into a schema being compiled is recursion (a tree of sections, a thread of
 * replies), which a finite automaton cannot hold whole: it is unrolled max_recursion times, and the
 * reference below the last copy is cut (no value), as is one whose next copy would pass max_schema_depth.
 * What the cut leaves is still valid against the schema: an empty list, an optional property left out,
 * anyOf's null; the budget masks never enter a branch that cannot finish. A schema that recursion must
 * continue at every level has no finite value: the compile refuses it.
 */
static int ref(schema_ctx *c, const gj *s, int depth, frag *out) {
    const gj *r = gj_get(s, "$ref");
    if (r->type != GJ_STR) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'$ref' must be a string");
    if (alone(c, s, "$ref", "put it in an 'anyOf' of one, or into the referenced schema")) return -1;
    if (r->str[0] != '#')
        return sfail(c, MOEQ_ERR_UNSUPPORTED, "'$ref' to '%s' is not supported (only references inside the schema, "
                     "'#...')", r->str);
    const gj *target = resolve_ref(c->root, r->str);
    if (!target) return sfail(c, MOEQ_ERR_FORMAT, "'$ref' '%s' names nothing in the schema", r->str);
    int entered = 0, last = -1;
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i] == target) entered++, last = i;
    if (entered && c->limits->max_recursion <= 0)
        return sfail(c, MOEQ_ERR_UNSUPPORTED, "'$ref' '%s' is recursive (a schema inside itself), which "
                     "max_recursion = 0 refuses", r->str);
    if (entered && (entered > c->limits->max_recursion ||
                    depth + (depth - c->ref_depth[last]) > c->limits->max_schema_depth)) {
        c->n_cut++;
        *out = (frag){nfa_state(c->n), nfa_state(c->n)}; /* no edge between them: no value */
        return 0;
    }
    if (c->n_refs == MOEQ_GRAMMAR_MAX_REFS) return sfail(c, MOEQ_ERR_LIMIT, "%s", "'$ref's nested too deep");
    c->ref_depth[c->n_refs] = depth;
    c->refs[c->n_refs++] = target;
    int rc = sub(c, target, depth, "$ref", NULL, out);
    c->n_refs--;
    return rc;
}

static const gj *deref(const schema_ctx *c, const gj *s);

/* Whether a schema constrains nothing (annotations only: a description wrapper). */
static int annotations_only(const gj *s) {
    for (size_t i = 0; s->type == GJ_OBJ && i < s->n; i++)
        if (!in_list(s->keys[i], annotations)) return 0;
    return s->type == GJ_OBJ || (s->type == GJ_BOOL && s->b);
}

#define MAX_ALL_OF 32

/* allOf's branches, "$ref"s followed and nested allOfs flattened, annotation-only ones left out. */
static int all_of_branches(schema_ctx *c, const gj *a, const gj **out, int *n, int level) {
    for (size_t i = 0; i < a->n; i++) {
        const gj *b = a->items[i]->type == GJ_OBJ ? deref(c, a->items[i]) : a->items[i];
        if (!b) return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "an 'allOf' branch whose '$ref' cannot be followed");
        if (annotations_only(b)) continue;
        if (b->type != GJ_OBJ) return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "the schema false in 'allOf'");
        const gj *inner = gj_get(b, "allOf");
        if (inner && inner->type == GJ_ARR && level < 4) {
            if (alone(c, b, "allOf", "nested allOf with other keywords")) return -1;
            if (all_of_branches(c, inner, out, n, level + 1)) return -1;
            continue;
        }
        if (*n == MAX_ALL_OF) return sfail(c, MOEQ_ERR_LIMIT, "%s", "more than 32 'allOf' branches");
        out[(*n)++] = b;
    }
    return 0;
}

/* The schema's JSON text, for comparing two branches' schemas of one property; NULL on NOMEM. */
static char *schema_text(const gj *s) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (gj_write(s, &buf, &len, &cap)) return free(buf), NULL;
    return buf;
}

/*
 * "allOf": a value valid against every branch. One branch (others only annotations, as generators wrap a
 * "$ref" to give it a description): that schema. Several: object schemas (an OpenAPI model extending
 * another), merged into one: the properties in branch order, a property in several branches only with the
 * same schema, "required" the union, and a property a branch with "additionalProperties": false does not
 * list left out (refused if required: no value could satisfy both). Anything else in a branch is refused by
 * name: merging other constraints needs them written as one schema.
 */
static int all_of(schema_ctx *c, const gj *s, int depth, frag *out) {
    const gj *a = gj_get(s, "allOf");
    if (a->type != GJ_ARR || a->n == 0) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'allOf' must be a non-empty array");
    const gj *br[MAX_ALL_OF + 1];
    int nb = 0;
    if (all_of_branches(c, a, br, &nb, 0)) return -1;
    /* the schema's own keywords beside allOf are one more branch (a model's own properties next to its base) */
    char *rest_keys[64];
    gj *rest_items[64];
    gj rest = {.type = GJ_OBJ, .keys = rest_keys, .items = rest_items};
    if (s->n > 64) return sfail(c, MOEQ_ERR_LIMIT, "%s", "more than 63 keywords beside 'allOf'");
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->keys[i], "allOf")) rest_keys[rest.n] = s->keys[i], rest_items[rest.n++] = s->items[i];
    if (!annotations_only(&rest)) br[nb++] = &rest;
    if (nb == 0) return *out = json_any_value(c->n, MOEQ_GRAMMAR_ANY_DEPTH), 0;
    if (nb == 1 && br[0] == &rest) return schema_compile(c, &rest, depth, out);
    if (nb == 1) { /* compiled where it stands, so a "$ref" to it still counts its recursion */
        for (size_t i = 0; i < a->n; i++) {
            char idx[24];
            snprintf(idx, sizeof idx, "%zu", i);
            const gj *b = a->items[i]->type == GJ_OBJ ? deref(c, a->items[i]) : a->items[i];
            if (b == br[0] || (b && !annotations_only(b))) return sub(c, a->items[i], depth, "allOf", idx, out);
        }
    }
    static const char *const object_kw[] = {"type", "properties", "required", "additionalProperties", NULL};
    int add_false = 0;
    for (int i = 0; i < nb; i++) {
        if (check_keywords(c, br[i])) return -1;
        for (size_t k = 0; k < br[i]->n; k++) {
            const char *kw = br[i]->keys[k];
            if (in_list(kw, annotations) || in_list(kw, object_kw)) continue;
            char what[128];
            snprintf(what, sizeof what, "'allOf' merges object schemas only; a branch has '%.40s' (write them as "
                     "one schema)", kw);
            return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", what);
        }
        const gj *t = gj_get(br[i], "type"), *props = gj_get(br[i], "properties"), *req = gj_get(br[i], "required");
        const gj *add = gj_get(br[i], "additionalProperties");
        if (t && !(t->type == GJ_STR && !strcmp(t->str, "object")))
            return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "'allOf' merges object schemas only; a branch's 'type' is not "
                         "\"object\"");
        if ((props && props->type != GJ_OBJ) || (req && req->type != GJ_ARR))
            return sfail(c, MOEQ_ERR_FORMAT, "%s", "'properties' must be an object and 'required' an array");
        if (add && add->type != GJ_BOOL)
            return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "'additionalProperties' as a schema in an 'allOf' branch");
        add_false |= add && !add->b;
    }
    /* the merged object: property and required lists point into the branches (freed, not their contents) */
    size_t cap_p = 0, cap_r = 0;
    for (int i = 0; i < nb; i++) {
        const gj *props = gj_get(br[i], "properties"), *req = gj_get(br[i], "required");
        cap_p += props ? props->n : 0, cap_r += req ? req->n : 0;
    }
    char **pkeys = calloc(cap_p + 1, sizeof *pkeys), **rkeys = calloc(cap_r + 1, sizeof *rkeys);
    gj **pvals = calloc(cap_p + 1, sizeof *pvals), *rstr = calloc(cap_r + 1, sizeof *rstr);
    gj **ritems = calloc(cap_r + 1, sizeof *ritems);
    int rc = -1;
    size_t np = 0, nr = 0;
    if (!pkeys || !rkeys || !pvals || !rstr || !ritems) {
        sfail(c, MOEQ_ERR_NOMEM, "%s", "allOf");
        goto done;
    }
    for (int i = 0; i < nb; i++) { /* required: the union */
        const gj *req = gj_get(br[i], "required");
        for (size_t k = 0; req && k < req->n; k++) {
            if (req->items[k]->type != GJ_STR) {
                sfail(c, MOEQ_ERR_FORMAT, "%s", "'required' entries must be strings");
                goto done;
            }
            size_t j = 0;
            while (j < nr && strcmp(rstr[j].str, req->items[k]->str)) j++;
            if (j == nr) rstr[nr] = *req->items[k], ritems[nr] = &rstr[nr], nr++;
        }
    }
    for (int i = 0; i < nb; i++) { /* properties: branch order, each once */
        const gj *props = gj_get(br[i], "properties");
        for (size_t k = 0; props && k < props->n; k++) {
            const char *name = props->keys[k];
            size_t j = 0;
            while (j < np && strcmp(pkeys[j], name)) j++;
            if (j < np) {
                char *x = schema_text(pvals[j]), *y = schema_text(props->items[k]);
                int same = x && y && !strcmp(x, y);
                free(x), free(y);
                if (!same) {
                    sfail(c, MOEQ_ERR_UNSUPPORTED, "'allOf' gives property '%s' two different schemas (write one)",
                          name);
                    goto done;
                }
                continue;
            }
            int allowed = 1, is_req = 0;
            for (int b = 0; b < nb && allowed; b++) {
                const gj *add = gj_get(br[b], "additionalProperties"), *bp = gj_get(br[b], "properties");
                if (add && !add->b && !gj_get(bp, name)) allowed = 0;
            }
            for (size_t r = 0; r < nr; r++) is_req |= !strcmp(rstr[r].str, name);
            if (!allowed && is_req) {
                sfail(c, MOEQ_ERR_FORMAT, "'allOf': '%s' is required, but a branch with additionalProperties false "
                      "does not allow it: no value is valid", name);
                goto done;
            }
            if (allowed) pkeys[np] = (char *)name, pvals[np++] = props->items[k];
        }
    }
    for (size_t r = 0; r < nr; r++) { /* a required name no branch describes: any value, as 'required' alone */
        size_t j = 0;
        while (j < np && strcmp(pkeys[j], rstr[r].str)) j++;
        if (j == np) {
            sfail(c, MOEQ_ERR_UNSUPPORTED, "'allOf': required property '%s' is in no branch's 'properties'",
                  rstr[r].str);
            goto done;
        }
    }
    {
        gj props = {.type = GJ_OBJ, .items = pvals, .keys = pkeys, .n = np};
        gj req = {.type = GJ_ARR, .items = ritems, .n = nr};
        gj no = {.type = GJ_BOOL, .b = 0};
        char *mk[3];
        gj *mv[3];
        size_t nm = 0;
        if (np) mk[nm] = "properties", mv[nm++] = &props;
        if (nr) mk[nm] = "required", mv[nm++] = &req;
        if (add_false) mk[nm] = "additionalProperties", mv[nm++] = &no;
        gj merged = {.type = GJ_OBJ, .items = mv, .keys = mk, .n = nm};
        size_t mark;
        path_push(c, &mark, "allOf", NULL);
        rc = type_object(c, &merged, depth, out);
        if (rc == 0) path_pop(c, mark);
    }
done:
    free(pkeys), free(rkeys), free(pvals), free(rstr), free(ritems);
    return rc;
}

/* ---- oneOf: branches told apart --------------------------------------------------------------- */

/* A schema with its "$ref"s followed (a few: a chain that long is not a branch to inspect), or NULL. */
static const gj *deref(const schema_ctx *c, const gj *s) {
    for (int i = 0; i < 8 && s && s->type == GJ_OBJ; i++) {
        const gj *r = gj_get(s, "$ref");
        if (!r) return s;
        if (r->type != GJ_STR) return NULL;
        s = resolve_ref(c->root, r->str);
    }
    return s && s->type == GJ_OBJ && !gj_get(s, "$ref") ? s : NULL;
}

enum { T_STR = 1, T_INT = 2, T_FRAC = 4, T_BOOL = 8, T_NULL = 16, T_OBJ = 32, T_ARR = 64 };

/* The values a schema's explicit "type" allows, as bits ("number" is integers too); 0: no "type". */
static unsigned type_bits(const gj *s) {
    const gj *t = gj_get(s, "type");
    unsigned bits = 0;
    for (size_t i = 0; t && i < (t->type == GJ_ARR ? t->n : 1); i++) {
        const gj *x = t->type == GJ_ARR ? t->items[i] : t;
        if (x->type != GJ_STR) return 0;
        const char *n = x->str;
        bits |= !strcmp(n, "string") ? T_STR : !strcmp(n, "integer") ? T_INT : !strcmp(n, "number") ? T_INT | T_FRAC
              : !strcmp(n, "boolean") ? T_BOOL : !strcmp(n, "null") ? T_NULL : !strcmp(n, "object") ? T_OBJ
              : !strcmp(n, "array") ? T_ARR : 0;
    }
    return bits;
}

/* Whether two literals may be the same value (strings, numbers, booleans, null compared by value; arrays
 * and objects assumed equal: the check only has to be safe). */
static int may_equal(const gj *a, const gj *b) {
    if (a->type != b->type) return 0;
    switch (a->type) {
    case GJ_STR: return a->len == b->len && !memcmp(a->str, b->str, a->len);
    case GJ_NUM: return a->num == b->num;
    case GJ_BOOL: return a->b == b->b;
    default: return 1;
    }
}

/* Whether no value can match both branches: their types do not meet, or a property both require allows
 * literals in one that the other never allows (a discriminator: {"type": {"const": "cat"}} vs "dog"). */
static int disjoint(const schema_ctx *c, const gj *a, const gj *b) {
    if (!(a = deref(c, a)) || !(b = deref(c, b))) return 0;
    unsigned ta = type_bits(a), tb = type_bits(b);
    if (ta && tb && !(ta & tb)) return 1;
    const gj *pa = gj_get(a, "properties"), *pb = gj_get(b, "properties");
    const gj *ra = gj_get(a, "required"), *rb = gj_get(b, "required");
    if (!pa || !pb || pa->type != GJ_OBJ || pb->type != GJ_OBJ) return 0;
    for (size_t i = 0; i < pa->n; i++) {
        const char *key = pa->keys[i];
        const gj *qa = deref(c, pa->items[i]), *qb = gj_get(pb, key);
        if (!qa || !qb || !(qb = deref(c, qb)) || !is_required(ra, key) || !is_required(rb, key)) continue;
        const gj *ca = gj_get(qa, "const"), *cb = gj_get(qb, "const");
        const gj *ea = gj_get(qa, "enum"), *eb = gj_get(qb, "enum");
        const gj *const *va = ca ? &ca : ea && ea->type == GJ_ARR ? (const gj *const *)ea->items : NULL;
        const gj *const *vb = cb ? &cb : eb && eb->type == GJ_ARR ? (const gj *const *)eb->items : NULL;
        size_t na = ca ? 1 : va ? ea->n : 0, nb = cb ? 1 : vb ? eb->n : 0;
        if (!va || !vb) continue;
        int meet = 0;
        for (size_t x = 0; x < na && !meet; x++)
            for (size_t y = 0; y < nb && !meet; y++) meet = may_equal(va[x], vb[y]);
        if (!meet) return 1;
    }
    return 0;
}

/* The union of a's branches ("anyOf", or a "oneOf" whose branches are disjoint). */
static int union_of(schema_ctx *c, const gj *a, const char *kw, int depth, frag *out) {
    frag alts = {nfa_state(c->n), nfa_state(c->n)};
    for (size_t i = 0; i < a->n; i++) {
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        frag f;
        if (sub(c, a->items[i], depth, kw, idx, &f)) return -1;
        nfa_eps(c->n, alts.start, f.start);
        nfa_eps(c->n, f.end, alts.end);
    }
    return *out = alts, 0;
}

static int any_of(schema_ctx *c, const gj *s, int depth, frag *out) {
    const gj *a = gj_get(s, "anyOf");
    if (a->type != GJ_ARR || a->n == 0) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'anyOf' must be a non-empty array");
    if (alone(c, s, "anyOf", "move it into each branch")) return -1;
    return union_of(c, a, "anyOf", depth, out);
}

/* "oneOf": a value must match exactly one branch, which a union keeps only when no value can match two; so
 * the branches must be told apart by their types or by a property both require (pydantic's discriminated
 * unions, "discriminator" an annotation here). Otherwise refused, naming the two. */
static int one_of(schema_ctx *c, const gj *s, int depth, frag *out) {
    const gj *a = gj_get(s, "oneOf");
    if (a->type != GJ_ARR || a->n == 0) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'oneOf' must be a non-empty array");
    if (alone(c, s, "oneOf", "move it into each branch")) return -1;
    for (size_t i = 0; i < a->n; i++)
        for (size_t j = i + 1; j < a->n; j++)
            if (!disjoint(c, a->items[i], a->items[j])) {
                char what[192];
                snprintf(what, sizeof what, "'oneOf' branches %zu and %zu may both match a value (tell them apart "
                         "by 'type' or a required property's 'const', or use 'anyOf')", i, j);
                return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", what);
            }
    return union_of(c, a, "oneOf", depth, out);
}

int schema_compile(schema_ctx *c, const gj *s, int depth, frag *out) {
    if (c->n->failed) /* over the state limit: stop at once, or nested repeats would still cost m^depth calls */
        return sfail(c, c->n->nomem ? MOEQ_ERR_NOMEM : MOEQ_ERR_LIMIT, "%s",
                     "grammar_too_large: the automaton is over max_nfa_states");
    if (depth > c->limits->max_schema_depth) return sfail(c, MOEQ_ERR_LIMIT, "%s", "schemas nested deeper than max_schema_depth");
    if (s->type == GJ_BOOL) {
        if (!s->b) return sfail(c, MOEQ_ERR_UNSUPPORTED, "%s", "the schema false (nothing is valid) is not supported");
        return *out = json_any_value(c->n, MOEQ_GRAMMAR_ANY_DEPTH), 0;
    }
    if (s->type != GJ_OBJ) return sfail(c, MOEQ_ERR_FORMAT, "%s", "a schema must be an object or a boolean");
    if (check_keywords(c, s)) return -1;
    if (gj_get(s, "$ref")) return ref(c, s, depth, out);
    if (gj_get(s, "allOf")) return all_of(c, s, depth, out);
    if (gj_get(s, "oneOf")) return one_of(c, s, depth, out);
    if (gj_get(s, "anyOf")) return any_of(c, s, depth, out);
    if (gj_get(s, "enum") || gj_get(s, "const")) return enum_values(c, s, depth, out);
    const gj *type = gj_get(s, "type");
    if (!type) {
        if (gj_get(s, "properties") || gj_get(s, "required") || gj_get(s, "additionalProperties") ||
            gj_get(s, "minProperties") || gj_get(s, "maxProperties") || gj_get(s, "propertyNames"))
            return type_object(c, s, depth, out);
        if (gj_get(s, "items") || gj_get(s, "minItems") || gj_get(s, "maxItems") || gj_get(s, "prefixItems") ||
            gj_get(s, "uniqueItems"))
            return type_array(c, s, depth, out);
        if (gj_get(s, "pattern") || gj_get(s, "format") || gj_get(s, "minLength") || gj_get(s, "maxLength"))
            return type_string(c, s, out);
        if (gj_get(s, "minimum") || gj_get(s, "maximum") || gj_get(s, "exclusiveMinimum") ||
            gj_get(s, "exclusiveMaximum")) /* numbers only: a subset of what it allows, as the cases above */
            return type_number(c, s, out);
        return *out = json_any_value(c->n, MOEQ_GRAMMAR_ANY_DEPTH), 0;
    }
    if (type->type == GJ_STR) return type_one(c, s, type->str, depth, out);
    if (type->type != GJ_ARR || type->n == 0) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'type' must be a string or an array");
    frag alts = {nfa_state(c->n), nfa_state(c->n)};
    for (size_t i = 0; i < type->n; i++) {
        frag f;
        if (type->items[i]->type != GJ_STR) return sfail(c, MOEQ_ERR_FORMAT, "%s", "'type' entries must be strings");
        if (type_one(c, s, type->items[i]->str, depth, &f)) return -1;
        nfa_eps(c->n, alts.start, f.start);
        nfa_eps(c->n, f.end, alts.end);
    }
    return *out = alts, 0;
}
