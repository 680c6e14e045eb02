/*
 * nfa.c — a Thompson NFA over bytes and the fragment builders the regex and
 * schema compilers share; code point sets and their UTF-8 byte sequences.
 *
 * A fragment has one start and one final state. Builders never copy a
 * fragment: repetition rebuilds it from its source (regex AST, schema),
 * which keeps this file small. Limits and allocation failures are sticky
 * (n->failed): builders keep returning harmless fragments and the compiler
 * checks once at the end.
 */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

void nfa_init(nfa *n, int max_states) {
    memset(n, 0, sizeof *n);
    n->max_states = max_states;
}

void nfa_free(nfa *n) {
    free(n->head);
    free(n->edges);
    free(n->runs);
    memset(n, 0, sizeof *n);
}

void nfa_add_run(nfa *n, nfa_run run) {
    if (n->failed || run.copies < 1) return;
    if (n->n_runs == n->cap_runs) {
        int cap = n->cap_runs ? n->cap_runs * 2 : 8;
        nfa_run *g = realloc(n->runs, (size_t)cap * sizeof *g);
        if (!g) return;
        n->runs = g, n->cap_runs = cap;
    }
    n->runs[n->n_runs++] = run;
}

int32_t nfa_state(nfa *n) {
    if (n->failed) return 0;
    if (n->n_states >= n->max_states) return n->failed = 1, 0;
    if (n->n_states == n->cap_states) {
        int cap = n->cap_states ? n->cap_states * 2 : 256;
        int32_t *h = realloc(n->head, (size_t)cap * sizeof *h);
        if (!h) return n->failed = n->nomem = 1, 0;
        n->head = h, n->cap_states = cap;
    }
    n->head[n->n_states] = -1;
    return n->n_states++;
}

static void edge(nfa *n, int32_t from, int32_t to, uint8_t lo, uint8_t hi, int eps) {
    if (n->failed) return;
    if (n->n_edges == n->cap_edges) {
        int cap = n->cap_edges ? n->cap_edges * 2 : 512;
        nfa_edge *e = realloc(n->edges, (size_t)cap * sizeof *e);
        if (!e) {
            n->failed = n->nomem = 1;
            return;
        }
        n->edges = e, n->cap_edges = cap;
    }
    n->edges[n->n_edges] = (nfa_edge){to, n->head[from], lo, hi, (uint8_t)eps};
    n->head[from] = n->n_edges++;
}

void nfa_eps(nfa *n, int32_t from, int32_t to) { edge(n, from, to, 0, 0, 1); }
void nfa_range(nfa *n, int32_t from, int32_t to, uint8_t lo, uint8_t hi) { edge(n, from, to, lo, hi, 0); }

frag frag_empty(nfa *n) {
    int32_t s = nfa_state(n);
    return (frag){s, s};
}

frag frag_bytes(nfa *n, const char *s, size_t len) {
    frag f = frag_empty(n);
    for (size_t i = 0; i < len; i++) {
        int32_t t = nfa_state(n);
        nfa_range(n, f.end, t, (uint8_t)s[i], (uint8_t)s[i]);
        f.end = t;
    }
    return f;
}

frag frag_seq(nfa *n, frag a, frag b) {
    nfa_eps(n, a.end, b.start);
    return (frag){a.start, b.end};
}

frag frag_alt(nfa *n, const frag *parts, int k) {
    frag f = {nfa_state(n), nfa_state(n)};
    for (int i = 0; i < k; i++) {
        nfa_eps(n, f.start, parts[i].start);
        nfa_eps(n, parts[i].end, f.end);
    }
    return f;
}

frag frag_opt(nfa *n, frag a) {
    frag f = {nfa_state(n), nfa_state(n)};
    nfa_eps(n, f.start, a.start);
    nfa_eps(n, a.end, f.end);
    nfa_eps(n, f.start, f.end);
    return f;
}

frag frag_star(nfa *n, frag a) {
    frag f = {nfa_state(n), nfa_state(n)};
    nfa_eps(n, f.start, a.start);
    nfa_eps(n, a.end, a.start);
    nfa_eps(n, a.end, f.end);
    nfa_eps(n, f.start, f.end);
    return f;
}

/* ---- code point sets -------------------------------------------------------------- */

int cp_set_add(cp_set *s, uint32_t lo, uint32_t hi) {
    if (lo > hi) return 0;
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        cp_range *r = realloc(s->r, (size_t)cap * sizeof *r);
        if (!r) return -1;
        s->r = r, s->cap = cap;
    }
    s->r[s->n++] = (cp_range){lo, hi};
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

void cp_set_normalize(cp_set *s) {
    if (s->n < 2) return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, cmp_range);
    int m = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[m].hi + 1) {
            if (s->r[i].hi > s->r[m].hi) s->r[m].hi = s->r[i].hi;
        } else {
            s->r[++m] = s->r[i];
        }
    }
    s->n = m + 1;
}

int cp_set_negate(cp_set *s) {
    cp_set_normalize(s);
    cp_set out = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > next && cp_set_add(&out, next, s->r[i].lo - 1)) return cp_set_free(&out), -1;
        next = s->r[i].hi + 1;
    }
    if (next <= 0x10FFFF && cp_set_add(&out, next, 0x10FFFF)) return cp_set_free(&out), -1;
    cp_set_free(s);
    *s = out;
    return 0;
}

int cp_set_intersect(cp_set *s, const cp_set *with) {
    cp_set out = {0};
    for (int i = 0; i < s->n; i++)
        for (int j = 0; j < with->n; j++) {
            uint32_t lo = s->r[i].lo > with->r[j].lo ? s->r[i].lo : with->r[j].lo;
            uint32_t hi = s->r[i].hi < with->r[j].hi ? s->r[i].hi : with->r[j].hi;
            if (lo <= hi && cp_set_add(&out, lo, hi)) return cp_set_free(&out), -1;
        }
    cp_set_free(s);
    *s = out;
    cp_set_normalize(s);
    return 0;
}

void cp_set_free(cp_set *s) {
    free(s->r);
    memset(s, 0, sizeof *s);
}

/* ---- UTF-8 sequences of a code point range ----------------------------------------- */

static int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

static void utf8_enc(uint32_t cp, uint8_t *b) {
    int n = utf8_len(cp);
    if (n == 1) {
        b[0] = (uint8_t)cp;
        return;
    }
    for (int i = n - 1; i > 0; i--, cp >>= 6) b[i] = (uint8_t)(0x80 | (cp & 0x3F));
    b[0] = (uint8_t)((n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0) | cp);
}

/* Byte ranges lo[k]..hi[k] in a chain from s to e. */
static void chain(nfa *n, int32_t s, int32_t e, const uint8_t *lo, const uint8_t *hi, int len) {
    int32_t at = s;
    for (int k = 0; k < len; k++) {
        int32_t t = k == len - 1 ? e : nfa_state(n);
        nfa_range(n, at, t, lo[k], hi[k]);
        at = t;
    }
}

/* The standard split (as Rust's utf8-ranges): ranges of equal length whose bytes vary independently. */
static void utf8_range(nfa *n, int32_t s, int32_t e, uint32_t lo, uint32_t hi) {
    static const uint32_t edges[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= edges[i] && hi > edges[i]) {
            utf8_range(n, s, e, lo, edges[i]);
            utf8_range(n, s, e, edges[i] + 1, hi);
            return;
        }
    int len = utf8_len(lo);
    for (int i = 1; i < len; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_range(n, s, e, lo, lo | m);
                utf8_range(n, s, e, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_range(n, s, e, lo, (hi & ~m) - 1);
                utf8_range(n, s, e, hi & ~m, hi);
                return;
            }
        }
    }
    uint8_t a[4], b[4];
    utf8_enc(lo, a);
    utf8_enc(hi, b);
    chain(n, s, e, a, b, len);
}

frag frag_class(nfa *n, const cp_set *set) {
    frag f = {nfa_state(n), nfa_state(n)};
    for (int i = 0; i < set->n; i++) {
        uint32_t lo = set->r[i].lo, hi = set->r[i].hi > 0x10FFFF ? 0x10FFFF : set->r[i].hi;
        if (lo <= 0xDFFF && hi >= 0xD800) { /* surrogates are not characters */
            if (lo < 0xD800) utf8_range(n, f.start, f.end, lo, 0xD7FF);
            if (hi > 0xDFFF) utf8_range(n, f.start, f.end, 0xE000, hi);
        } else if (lo <= hi) {
            utf8_range(n, f.start, f.end, lo, hi);
        }
    }
    return f;
}

/* Whether f (in n) accepts bytes exactly: the state-set simulation, each set closed under eps. */
int nfa_match(const nfa *n, frag f, const char *bytes, size_t len) {
    int N = n->n_states, rc = -1;
    int32_t *cur = malloc((size_t)N * sizeof *cur), *nxt = malloc((size_t)N * sizeof *nxt);
    uint8_t *in = calloc((size_t)N, 1);
    if (!cur || !nxt || !in) goto done;
    int nc = 0;
#define ADD(list, cnt, s)                                                                                             \
    do {                                                                                                            \
        if (!in[s]) in[s] = 1, list[cnt++] = (s);                                                                   \
    } while (0)
    ADD(cur, nc, f.start);
    for (size_t i = 0;; i++) {
        for (int k = 0; k < nc; k++) /* the closure: cur grows while it is walked */
            for (int32_t e = n->head[cur[k]]; e >= 0; e = n->edges[e].next)
                if (n->edges[e].is_eps) ADD(cur, nc, n->edges[e].to);
        if (i == len) {
            rc = 0;
            for (int k = 0; k < nc; k++) rc |= cur[k] == f.end;
            break;
        }
        for (int k = 0; k < nc; k++) in[cur[k]] = 0;
        int nn = 0;
        uint8_t b = (uint8_t)bytes[i];
        for (int k = 0; k < nc; k++)
            for (int32_t e = n->head[cur[k]]; e >= 0; e = n->edges[e].next)
                if (!n->edges[e].is_eps && n->edges[e].lo <= b && b <= n->edges[e].hi) ADD(nxt, nn, n->edges[e].to);
        int32_t *t = cur;
        cur = nxt, nxt = t, nc = nn;
        if (!nc) {
            rc = 0;
            break;
        }
    }
#undef ADD
done:
    free(cur), free(nxt), free(in);
    return rc;
}

/* Whether to is reachable from from over any edges (the language between them is not empty). */
int nfa_reaches(const nfa *n, int32_t from, int32_t to) {
    uint8_t *seen = calloc((size_t)n->n_states, 1);
    int32_t *stack = malloc((size_t)n->n_states * sizeof *stack);
    int k = 0, found = -1;
    if (seen && stack) {
        found = 0;
        seen[from] = 1, stack[k++] = from;
        while (k > 0 && !found) {
            int32_t u = stack[--k];
            found = u == to;
            for (int32_t e = n->head[u]; e >= 0; e = n->edges[e].next)
                if (!seen[n->edges[e].to]) seen[n->edges[e].to] = 1, stack[k++] = n->edges[e].to;
        }
    }
    free(seen), free(stack);
    return found;
}
