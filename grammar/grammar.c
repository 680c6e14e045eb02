/*
 * grammar.c — moeq/grammar.h: the vocabulary trie, compiling a spec into a
 * grammar (NFA -> lazy DFA), the cache by content hash, and matchers.
 */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

/* ---- vocabulary ------------------------------------------------------------------------- */

static int32_t trie_child(moeq_grammar_vocab *v, int32_t *root_index, int32_t node, uint8_t byte, size_t *cap) {
    if (node == 0 && root_index[byte] >= 0) return root_index[byte];
    if (node != 0)
        for (int32_t c = v->nodes[node].first_child; c >= 0; c = v->nodes[c].next_sibling)
            if (v->nodes[c].byte == byte) return c;
    if ((size_t)v->n_nodes == *cap) {
        vtrie_node *g = realloc(v->nodes, *cap * 2 * sizeof *g);
        if (!g) return -1;
        v->nodes = g, *cap *= 2;
    }
    int32_t c = v->n_nodes++;
    v->nodes[c] = (vtrie_node){-1, v->nodes[node].first_child, -1, 0, byte};
    v->nodes[node].first_child = c;
    if (node == 0) root_index[byte] = c;
    return c;
}

static int vocab_insert(moeq_grammar_vocab *v, int32_t *root_index, int32_t id, const char *b, size_t len,
                        size_t *cap) {
    int32_t node = 0;
    for (size_t i = 0; i < len; i++)
        if ((node = trie_child(v, root_index, node, (uint8_t)b[i], cap)) < 0) return -1;
    v->same_next[id] = v->nodes[node].token;
    v->nodes[node].token = id;
    return 0;
}

moeq_err moeq_grammar_vocab_new(int n_ids, moeq_grammar_token_fn token_bytes, void *ctx, moeq_grammar_vocab **out,
                                char *errstr, size_t errstr_size) {
    if (!out || n_ids < 1 || !token_bytes)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "grammar vocab: n_ids >= 1 and a token function");
    *out = NULL;
    moeq_grammar_vocab *v = calloc(1, sizeof *v);
    size_t cap = 1024;
    int32_t root_index[256];
    for (int i = 0; i < 256; i++) root_index[i] = -1;
    size_t bcap = 4096, blen = 0;
    if (!v || !(v->nodes = malloc(cap * sizeof *v->nodes)) || !(v->same_next = malloc((size_t)n_ids * 4)) ||
        !(v->usable = calloc((size_t)n_ids, 1)) || !(v->off = calloc((size_t)n_ids, 4)) ||
        !(v->len = calloc((size_t)n_ids, 4)) || !(v->bytes = malloc(bcap)))
        goto nomem;
    v->n_ids = n_ids;
    v->nodes[0] = (vtrie_node){-1, -1, -1, 0, 0};
    v->n_nodes = 1;
    for (int32_t id = 0; id < n_ids; id++) {
        const char *b;
        size_t len;
        v->same_next[id] = -1;
        if (token_bytes(ctx, id, &b, &len) != 0 || len == 0) continue; /* an empty token would never progress */
        v->usable[id] = 1;
        if (vocab_insert(v, root_index, id, b, len, &cap)) goto nomem;
        if (blen + len > bcap) {
            while (blen + len > bcap) bcap *= 2;
            char *g = realloc(v->bytes, bcap);
            if (!g) goto nomem;
            v->bytes = g;
        }
        memcpy(v->bytes + blen, b, len);
        v->off[id] = (uint32_t)blen, v->len[id] = (uint32_t)len;
        blen += len;
    }
    for (int32_t i = v->n_nodes - 1; i >= 0; i--) /* children come after their parent */
        for (int32_t c = v->nodes[i].first_child; c >= 0; c = v->nodes[c].next_sibling)
            if (v->nodes[c].height + 1 > v->nodes[i].height)
                v->nodes[i].height = (uint16_t)(v->nodes[c].height + 1 > 65535 ? 65535 : v->nodes[c].height + 1);
    *out = v;
    return MOEQ_OK;
nomem:
    moeq_grammar_vocab_destroy(v);
    return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "grammar vocab (%d ids)", n_ids);
}

void moeq_grammar_vocab_destroy(moeq_grammar_vocab *v) {
    if (!v) return;
    free(v->nodes);
    free(v->same_next);
    free(v->usable);
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v);
}

int moeq_grammar_vocab_size(const moeq_grammar_vocab *v) { return v ? v->n_ids : 0; }

/* ---- compile ------------------------------------------------------------------------------ */

struct moeq_grammar {
    int refs;
    const moeq_grammar_vocab *vocab;
    dfa *d;
};

moeq_grammar_limits moeq_grammar_default_limits(void) {
    return (moeq_grammar_limits){.max_nfa_states = 200000, .max_dfa_states = 20000, .max_schema_depth = 16,
                                 .max_repeat = 256, .max_string_chars = 4096, .max_recursion = 4};
}

static int build_choice(nfa *n, const moeq_grammar_spec *spec, frag *out, char *errstr, size_t errstr_size) {
    if (spec->n_choices == 0 || !spec->choices)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "choice: no choices"), -1;
    frag alts = {nfa_state(n), nfa_state(n)};
    for (size_t i = 0; i < spec->n_choices; i++) {
        if (!spec->choices[i] || !spec->choices[i][0])
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "choice %zu is empty", i), -1;
        frag f = frag_bytes(n, spec->choices[i], strlen(spec->choices[i]));
        nfa_eps(n, alts.start, f.start);
        nfa_eps(n, f.end, alts.end);
    }
    *out = alts;
    return 0;
}

static moeq_err build_schema(nfa *n, const moeq_grammar_spec *spec, const moeq_grammar_limits *lim, frag *out,
                             int *cut, char *errstr, size_t errstr_size) {
    gj *root = gj_parse(spec->text ? spec->text : "", spec->text ? spec->text_len : 0, lim->max_schema_depth * 4 + 8,
                        errstr, errstr_size);
    if (!root) return MOEQ_ERR_PARSE;
    schema_ctx c = {n, lim, errstr, errstr_size, MOEQ_OK, "", root, {root}, {0}, 1, 0}; /* "#" inside: recursion */
    schema_compile(&c, root, 0, out);
    gj_free(root);
    *cut = c.n_cut;
    return c.err;
}

static moeq_err build(nfa *n, const moeq_grammar_spec *spec, const moeq_grammar_limits *lim, frag *out, int *cut,
                      char *errstr, size_t errstr_size) {
    switch (spec->kind) {
    case MOEQ_GRAMMAR_JSON_SCHEMA: return build_schema(n, spec, lim, out, cut, errstr, errstr_size);
    case MOEQ_GRAMMAR_JSON_OBJECT: *out = json_any_object(n, MOEQ_GRAMMAR_ANY_DEPTH); return MOEQ_OK;
    case MOEQ_GRAMMAR_REGEX:
        if (!spec->text) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "regex: no pattern");
        return (moeq_err)regex_compile(n, spec->text, spec->text_len, 0, 1, lim->max_repeat, out, errstr, errstr_size);
    case MOEQ_GRAMMAR_CHOICE: return build_choice(n, spec, out, errstr, errstr_size) ? MOEQ_ERR_INVALID_ARG : MOEQ_OK;
    }
    return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "grammar: unknown kind %d", (int)spec->kind);
}

/* spec's NFA into n (initialised here; free it on every path) with its final fragment and whether recursion
 * was cut; the limit and NOMEM as errors. Shared by check and compile. */
static moeq_err build_nfa(const moeq_grammar_spec *spec, const moeq_grammar_limits *lim, nfa *n, frag *f, int *cut,
                          char *errstr, size_t errstr_size) {
    nfa_init(n, lim->max_nfa_states);
    *f = (frag){0, 0};
    *cut = 0;
    moeq_err err = build(n, spec, lim, f, cut, errstr, errstr_size);
    if (!err && n->failed)
        err = n->nomem ? moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "grammar: out of memory")
                       : moeq_errf(MOEQ_ERR_LIMIT, errstr, errstr_size,
                                   "grammar_too_large: the automaton needs more than %d states (max_nfa_states)",
                                   lim->max_nfa_states);
    return err;
}

/* The refusal of a grammar no output satisfies. */
static moeq_err empty_error(int cut, const moeq_grammar_limits *lim, char *errstr, size_t errstr_size) {
    if (cut)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "grammar: a recursive schema with no value that nests at most %d levels "
                         "(max_recursion; is the recursion required at every level?)",
                         lim->max_recursion);
    return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "grammar: no output can satisfy it");
}

moeq_err moeq_grammar_check(const moeq_grammar_spec *spec, const moeq_grammar_limits *limits, char *errstr,
                            size_t errstr_size) {
    if (!spec) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "grammar: NULL argument");
    moeq_grammar_limits lim = limits ? *limits : moeq_grammar_default_limits();
    nfa n;
    frag f;
    int cut;
    moeq_err err = build_nfa(spec, &lim, &n, &f, &cut, errstr, errstr_size);
    int reach = err ? 1 : nfa_reaches(&n, f.start, f.end);
    if (reach < 0) err = moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "grammar: out of memory");
    else if (!reach) err = empty_error(cut, &lim, errstr, errstr_size);
    nfa_free(&n);
    return err;
}

moeq_err moeq_grammar_compile(const moeq_grammar_spec *spec, const moeq_grammar_vocab *vocab,
                              const moeq_grammar_limits *limits, moeq_grammar **out, char *errstr,
                              size_t errstr_size) {
    if (!spec || !vocab || !out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "grammar: NULL argument");
    *out = NULL;
    moeq_grammar_limits lim = limits ? *limits : moeq_grammar_default_limits();
    nfa n;
    frag f;
    int cut;
    moeq_err err = build_nfa(spec, &lim, &n, &f, &cut, errstr, errstr_size);
    if (err) return nfa_free(&n), err;
    moeq_grammar *g = calloc(1, sizeof *g);
    if (!g) return nfa_free(&n), moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "grammar");
    g->refs = 1;
    g->vocab = vocab;
    g->d = dfa_new(&n, f.start, f.end, vocab->n_ids, lim.max_dfa_states);
    nfa_free(&n); /* dfa_new took it (or it failed) */
    if (!g->d) return free(g), moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "grammar DFA");
    if (dfa_distance(g->d, dfa_start(g->d)) == INT32_MAX) {
        moeq_grammar_release(g);
        return empty_error(cut, &lim, errstr, errstr_size);
    }
    *out = g;
    return MOEQ_OK;
}

void moeq_grammar_retain(moeq_grammar *g) {
    if (g) g->refs++;
}

void moeq_grammar_release(moeq_grammar *g) {
    if (!g || --g->refs > 0) return;
    dfa_free(g->d);
    free(g);
}

void moeq_grammar_get_stats(const moeq_grammar *g, moeq_grammar_stats *st) {
    memset(st, 0, sizeof *st);
    if (!g) return;
    st->nfa_states = dfa_nfa_states(g->d);
    st->dfa_states = dfa_n_states(g->d);
    st->masks = dfa_n_masks(g->d);
    st->min_bytes = dfa_distance(g->d, dfa_start(g->d));
    st->bytes = dfa_bytes(g->d);
    st->shared_masks = dfa_n_shared_masks(g->d);
}

size_t moeq_grammar_mask_words(const moeq_grammar *g) { return g ? ((size_t)g->vocab->n_ids + 31) / 32 : 0; }

/* ---- cache ---------------------------------------------------------------------------------- */

typedef struct cache_entry {
    uint64_t hash;
    char *key;
    size_t key_len;
    moeq_grammar *grammar;
    uint64_t used;
} cache_entry;

struct moeq_grammar_cache {
    const moeq_grammar_vocab *vocab;
    moeq_grammar_limits limits;
    cache_entry *e;
    int n, max;
    size_t max_bytes; /* 0: none */
    uint64_t clock;
    int64_t hits, misses;
};

void moeq_grammar_cache_set_max_bytes(moeq_grammar_cache *c, size_t max_bytes) {
    if (c) c->max_bytes = max_bytes;
}

size_t moeq_grammar_cache_bytes(const moeq_grammar_cache *c) {
    size_t total = 0;
    for (int i = 0; c && i < c->n; i++) total += dfa_bytes(c->e[i].grammar->d);
    return total;
}

/* Release least recently used entries, never keep, while the kept grammars hold more than max_bytes. */
static void cache_trim(moeq_grammar_cache *c, const moeq_grammar *keep) {
    if (!c->max_bytes) return;
    size_t total = moeq_grammar_cache_bytes(c);
    while (total > c->max_bytes && c->n > 1) {
        int lru = -1;
        for (int i = 0; i < c->n; i++)
            if (c->e[i].grammar != keep && (lru < 0 || c->e[i].used < c->e[lru].used)) lru = i;
        if (lru < 0) break;
        total -= dfa_bytes(c->e[lru].grammar->d);
        free(c->e[lru].key);
        moeq_grammar_release(c->e[lru].grammar);
        c->e[lru] = c->e[--c->n];
        c->e[c->n] = (cache_entry){0};
    }
}

moeq_err moeq_grammar_cache_new(const moeq_grammar_vocab *vocab, const moeq_grammar_limits *limits, int max_entries,
                                moeq_grammar_cache **out, char *errstr, size_t errstr_size) {
    if (!vocab || !out || max_entries < 1)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "grammar cache: vocab and max_entries >= 1");
    moeq_grammar_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->e = calloc((size_t)max_entries, sizeof *c->e))) {
        free(c);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "grammar cache");
    }
    c->vocab = vocab, c->max = max_entries;
    c->limits = limits ? *limits : moeq_grammar_default_limits();
    *out = c;
    return MOEQ_OK;
}

void moeq_grammar_cache_destroy(moeq_grammar_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].key);
        moeq_grammar_release(c->e[i].grammar);
    }
    free(c->e);
    free(c);
}

/* The key: kind byte, then the text, then each choice NUL-terminated. */
static char *spec_key(const moeq_grammar_spec *spec, size_t *len) {
    size_t n = 1 + (spec->text ? spec->text_len : 0) + 1;
    for (size_t i = 0; i < spec->n_choices; i++) n += strlen(spec->choices[i]) + 1;
    char *k = malloc(n), *p = k;
    if (!k) return NULL;
    *p++ = (char)spec->kind;
    if (spec->text) memcpy(p, spec->text, spec->text_len), p += spec->text_len;
    *p++ = 0;
    for (size_t i = 0; i < spec->n_choices; i++) {
        size_t l = strlen(spec->choices[i]) + 1;
        memcpy(p, spec->choices[i], l), p += l;
    }
    *len = n;
    return k;
}

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

moeq_err moeq_grammar_cache_get(moeq_grammar_cache *c, const moeq_grammar_spec *spec, moeq_grammar **out,
                                char *errstr, size_t errstr_size) {
    if (!c || !spec || !out) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "grammar cache: NULL");
    size_t len;
    char *key = spec_key(spec, &len);
    if (!key) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "grammar cache key");
    uint64_t h = fnv(key, len);
    for (int i = 0; i < c->n; i++)
        if (c->e[i].hash == h && c->e[i].key_len == len && !memcmp(c->e[i].key, key, len)) {
            free(key);
            c->e[i].used = ++c->clock;
            c->hits++;
            moeq_grammar_retain(c->e[i].grammar);
            *out = c->e[i].grammar;
            cache_trim(c, *out);
            return MOEQ_OK;
        }
    c->misses++;
    moeq_grammar *g;
    moeq_err err = moeq_grammar_compile(spec, c->vocab, &c->limits, &g, errstr, errstr_size);
    if (err) return free(key), err;
    int slot = c->n < c->max ? c->n++ : 0;
    if (slot == 0 && c->n == c->max && c->e[0].grammar) { /* evict the least recently used */
        for (int i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[slot].used) slot = i;
        free(c->e[slot].key);
        moeq_grammar_release(c->e[slot].grammar);
    }
    c->e[slot] = (cache_entry){h, key, len, g, ++c->clock};
    moeq_grammar_retain(g);
    *out = g;
    cache_trim(c, g);
    return MOEQ_OK;
}

void moeq_grammar_cache_counts(const moeq_grammar_cache *c, int64_t *hits, int64_t *misses) {
    *hits = c ? c->hits : 0;
    *misses = c ? c->misses : 0;
}

/* ---- matchers ---------------------------------------------------------------------------------- */

struct moeq_grammar_matcher {
    moeq_grammar *g;
    int32_t state;
};

moeq_err moeq_grammar_matcher_new(moeq_grammar *g, moeq_grammar_matcher **out) {
    if (!g || !out) return MOEQ_ERR_INVALID_ARG;
    moeq_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return MOEQ_ERR_NOMEM;
    moeq_grammar_retain(g);
    m->g = g;
    m->state = dfa_start(g->d);
    *out = m;
    return MOEQ_OK;
}

void moeq_grammar_matcher_destroy(moeq_grammar_matcher *m) {
    if (!m) return;
    moeq_grammar_release(m->g);
    free(m);
}

void moeq_grammar_matcher_reset(moeq_grammar_matcher *m) { m->state = dfa_start(m->g->d); }

moeq_err moeq_grammar_matcher_copy(moeq_grammar_matcher *dst, const moeq_grammar_matcher *src) {
    if (!dst || !src || dst->g != src->g) return MOEQ_ERR_INVALID_ARG;
    dst->state = src->state;
    return MOEQ_OK;
}

int64_t moeq_grammar_matcher_mask(moeq_grammar_matcher *m, int32_t budget, uint32_t *bits, moeq_err *err) {
    moeq_err e = MOEQ_OK;
    if (budget < 1) budget = 1;
    int64_t n = dfa_mask_budget(m->g->d, m->g->vocab, m->state, budget, bits, &e);
    if (err) *err = e;
    return n;
}

moeq_err moeq_grammar_matcher_accept_bytes(moeq_grammar_matcher *m, const char *bytes, size_t len) {
    int32_t s = m->state;
    for (size_t i = 0; i < len; i++) {
        s = dfa_next(m->g->d, s, (uint8_t)bytes[i]);
        if (s == -2) return MOEQ_ERR_LIMIT;
        if (s < 0) return MOEQ_ERR_INVALID_ARG;
    }
    m->state = s;
    return MOEQ_OK;
}

moeq_err moeq_grammar_matcher_accept(moeq_grammar_matcher *m, int32_t token) {
    const moeq_grammar_vocab *v = m->g->vocab;
    if (token < 0 || token >= v->n_ids || !v->usable[token]) return MOEQ_ERR_INVALID_ARG;
    return moeq_grammar_matcher_accept_bytes(m, v->bytes + v->off[token], v->len[token]);
}

int moeq_grammar_matcher_accepting(moeq_grammar_matcher *m) { return dfa_distance(m->g->d, m->state) == 0; }
int moeq_grammar_matcher_done(moeq_grammar_matcher *m) { return dfa_done(m->g->d, m->state); }
int moeq_grammar_matcher_distance(const moeq_grammar_matcher *m) { return dfa_distance(m->g->d, m->state); }
