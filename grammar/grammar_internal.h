/*
 * grammar_internal.h — the pieces of moeq_grammar: a JSON reader for
 * schemas (gjson.c), the NFA and its builders (nfa.c), regular expressions
 * (regex.c), JSON Schema (schema.c) and the lazy DFA with token masks
 * (dfa.c). Internal to the grammar library.
 */
#ifndef MOEQ_GRAMMAR_INTERNAL_H
#define MOEQ_GRAMMAR_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/grammar.h"

/* ---- JSON values (schemas) ------------------------------------------------------- */

typedef enum gj_type { GJ_NULL, GJ_BOOL, GJ_NUM, GJ_STR, GJ_ARR, GJ_OBJ } gj_type;

typedef struct gj {
    gj_type type;
    int b;
    double num;
    int is_int;        /* written without fraction or exponent   */
    char *str;         /* GJ_STR: decoded UTF-8, NUL-terminated  */
    size_t len;
    struct gj **items; /* GJ_ARR items, GJ_OBJ values            */
    char **keys;       /* GJ_OBJ keys, in document order         */
    size_t n;
    const char *raw;   /* the value's text in the source         */
    size_t raw_len;
} gj;

/* Parse text (RFC 8259, depth <= max_depth). NULL with errstr on failure. */
gj *gj_parse(const char *text, size_t len, int max_depth, char *errstr, size_t errstr_size);
void gj_free(gj *v);
const gj *gj_get(const gj *obj, const char *key);
/* Compact JSON text of v appended to *buf (malloc'd, grown); -1 on NOMEM. */
int gj_write(const gj *v, char **buf, size_t *len, size_t *cap);

/* ---- NFA over bytes -------------------------------------------------------------- */

typedef struct nfa_edge {
    int32_t to, next; /* next: the state's next edge, -1 ends             */
    uint8_t lo, hi;   /* byte range; eps when is_eps                      */
    uint8_t is_eps;
} nfa_edge;

/*
 * A run of NFA states laid out one copy per character position (a length-bounded string's chain, a pattern's
 * states times a character count): copy k is states [first + k * stride, first + (k + 1) * stride). Where the
 * bound is far (more than a token's bytes away) and the minimum is behind, the positions' futures within one
 * token are alike, so the DFA shares their masks (dfa.c: the alias key). pos_shift: 1 when a copy's first
 * state is the position after its others (the chain: P_k+1, then the 12 states of character k).
 */
typedef struct nfa_run {
    int32_t first, stride, copies;
    int32_t min_pos, max_pos; /* the positions an output may end at or after / the bound                 */
    int32_t pos_shift;
} nfa_run;

typedef struct nfa {
    int32_t *head;    /* [n_states] first edge, -1 none                   */
    int n_states, cap_states;
    nfa_edge *edges;
    int n_edges, cap_edges;
    int max_states;   /* limit                                            */
    int failed;       /* 1: over the limit or out of memory (sticky)      */
    int nomem;
    nfa_run *runs;    /* in increasing `first` order (states are never reused) */
    int n_runs, cap_runs;
} nfa;

/* Record a run (no-op on NOMEM: the masks are then not shared, which changes nothing else). */
void nfa_add_run(nfa *n, nfa_run run);

typedef struct frag {
    int32_t start, end; /* end: the fragment's single final state          */
} frag;

void nfa_init(nfa *n, int max_states);
void nfa_free(nfa *n);
int32_t nfa_state(nfa *n);
void nfa_eps(nfa *n, int32_t from, int32_t to);
void nfa_range(nfa *n, int32_t from, int32_t to, uint8_t lo, uint8_t hi);

frag frag_empty(nfa *n);
frag frag_bytes(nfa *n, const char *s, size_t len);
frag frag_seq(nfa *n, frag a, frag b);
/* The union of parts[0..k). */
frag frag_alt(nfa *n, const frag *parts, int k);
frag frag_opt(nfa *n, frag a);
frag frag_star(nfa *n, frag a); /* a*; a must be a fresh fragment (its end gets edges) */
/* 1 when f accepts exactly these bytes, 0 when not, -1 on NOMEM. */
int nfa_match(const nfa *n, frag f, const char *bytes, size_t len);
/* 1 when to is reachable from from, 0 when not, -1 on NOMEM. */
int nfa_reaches(const nfa *n, int32_t from, int32_t to);

/* A set of code points: sorted, disjoint ranges. */
typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;
typedef struct cp_set {
    cp_range *r;
    int n, cap;
} cp_set;
int cp_set_add(cp_set *s, uint32_t lo, uint32_t hi);
void cp_set_normalize(cp_set *s);           /* sort, merge                            */
int cp_set_negate(cp_set *s);               /* complement in [0, 0x10FFFF] \ surrogates */
int cp_set_intersect(cp_set *s, const cp_set *with);
void cp_set_free(cp_set *s);
/* One code point of s as UTF-8 bytes (surrogates excluded). Empty set: a dead fragment. */
frag frag_class(nfa *n, const cp_set *s);

/* ---- regular expressions --------------------------------------------------------- */

/*
 * Compile pattern into a fragment. json_string: the output is the inside of
 * a JSON string, so characters that would need an escape (", \, controls)
 * are never produced (a literal one is an error). anchored: the whole text
 * matches (response_format regex); otherwise JSON Schema's search semantics
 * (".*" around unless ^ / $). max_repeat bounds {n,m}. Returns 0, or the moeq_err (PARSE,
 * UNSUPPORTED, LIMIT, NOMEM) with the message in errstr.
 */
int regex_compile(nfa *n, const char *pattern, size_t len, int json_string, int anchored, int max_repeat,
                  frag *out, char *errstr, size_t errstr_size);

/* ---- JSON Schema ------------------------------------------------------------------ */

/* "$ref"s followed inside one another at most (each a schema level too: max_schema_depth bounds them first). */
#define MOEQ_GRAMMAR_MAX_REFS 64

typedef struct schema_ctx {
    nfa *n;
    const moeq_grammar_limits *limits;
    char *errstr;
    size_t errstr_size;
    moeq_err err;    /* first error                                           */
    char path[256];  /* JSON pointer of the schema being compiled            */
    const gj *root;  /* the whole schema: "$ref" resolves against it         */
    const gj *refs[MOEQ_GRAMMAR_MAX_REFS]; /* the "$ref" targets being compiled, outermost first */
    int ref_depth[MOEQ_GRAMMAR_MAX_REFS];  /* the schema depth each was entered at               */
    int n_refs;
    int n_cut;       /* recursive "$ref"s cut at max_recursion (or the depth limit)            */
} schema_ctx;

/* A fragment for one JSON value valid against schema; -1 with ctx->err set. */
int schema_compile(schema_ctx *ctx, const gj *schema, int depth, frag *out);
/* Any JSON object / any value, nested at most depth levels. */
frag json_any_object(nfa *n, int depth);
frag json_any_value(nfa *n, int depth);
frag json_string_frag(nfa *n, int min_chars, int max_chars); /* "..." with a length in characters; max -1 = none */

/* ---- DFA and masks ----------------------------------------------------------------- */

typedef struct dfa dfa;

/* Takes the NFA (accept = its final state). NULL on NOMEM. */
dfa *dfa_new(nfa *n, int32_t start, int32_t accept, int n_ids, int max_states);
void dfa_free(dfa *d);
int dfa_start(dfa *d);
int32_t dfa_next(dfa *d, int32_t state, uint8_t byte); /* -1 dead, -2 over the limit/NOMEM */
int dfa_distance(dfa *d, int32_t state);
int dfa_done(dfa *d, int32_t state);
int dfa_n_states(const dfa *d);
size_t dfa_bytes(const dfa *d); /* memory held, about (the grammar cache's budget) */
int dfa_n_shared_masks(const dfa *d); /* states whose mask is another's (alike positions of a run) */
int dfa_n_masks(const dfa *d);
int dfa_nfa_states(const dfa *d);
/* The cached mask of a state (NULL with *err on failure), or one restricted to budget written into bits. */
const uint32_t *dfa_mask(dfa *d, const moeq_grammar_vocab *vocab, int32_t state, moeq_err *err);
int64_t dfa_mask_budget(dfa *d, const moeq_grammar_vocab *vocab, int32_t state, int32_t budget, uint32_t *bits,
                        moeq_err *err);
int dfa_max_distance(const dfa *d);

/* Vocabulary internals (dfa.c walks them). */
typedef struct vtrie_node {
    int32_t first_child, next_sibling;
    int32_t token; /* first id ending here, -1 none; more in same_next */
    uint16_t height; /* bytes of the longest token below, beyond this node (a budget walk's prune) */
    uint8_t byte;
} vtrie_node;

struct moeq_grammar_vocab {
    int n_ids;
    vtrie_node *nodes; /* [0] is the root */
    int n_nodes;
    int32_t *same_next; /* [n_ids] another id with the same bytes, -1 */
    char *bytes;        /* every token's bytes                        */
    uint32_t *off, *len;
    uint8_t *usable;    /* [n_ids]                                    */
};

#endif
