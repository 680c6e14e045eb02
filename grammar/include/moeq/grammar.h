/*
 * moeq/grammar.h — structured output: a JSON Schema (subset), "any JSON
 * object", a regular expression or a list of choices compiled into a byte
 * automaton, and per-step token masks over a model's whole vocabulary.
 *
 * Everything moeq accepts is a regular language over bytes: schemas have no
 * $ref (recursion is refused), untyped JSON values nest at most
 * MOEQ_GRAMMAR_ANY_DEPTH levels, so one NFA (Thompson construction) covers
 * it, determinized lazily (subset construction, one DFA state per reached
 * set). A DFA state's token mask depends on nothing but the state — the
 * whole mask is "context independent" in xgrammar's terms — so it is
 * computed once per state (a walk of the vocabulary's byte trie, pruned
 * where the DFA dies) and cached with the grammar; a decode step is then a
 * lookup. Byte-level BPE tokens cross grammar boundaries freely: a token is
 * allowed when all of its bytes walk the DFA to a live state (one from which
 * the grammar can still be completed).
 *
 * Budget: a state's distance to completion (fewest bytes) is known, so with
 * `budget` tokens left only tokens that end in a state at most budget - 1
 * bytes from completion are allowed. With single-byte tokens for every byte
 * the grammar needs (byte-level BPE has all 256), an output is then always
 * complete by max_new_tokens — a truncated JSON document cannot happen.
 *
 * What this does not do: no I/O, no tokenizer (the caller hands in each
 * token's bytes), no sampling, no threads. Compiled grammars grow their DFA
 * and mask cache while used: not thread-safe; one cache per worker loop.
 */
#ifndef MOEQ_GRAMMAR_H
#define MOEQ_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Nesting of untyped values (json_object, {} in a schema, type object without properties). */
#define MOEQ_GRAMMAR_ANY_DEPTH 6

/* ---- vocabulary --------------------------------------------------------------- */

/*
 * The model's tokens as bytes. token_bytes(ctx, id, &bytes, &len) returns 0
 * for a token the grammar may emit (bytes borrowed for the call) and -1 for
 * one it never may (special and added tokens, ids that name no token).
 * n_ids: the model's vocabulary (logits row length), >= 1.
 */
typedef int (*moeq_grammar_token_fn)(void *ctx, int32_t id, const char **bytes, size_t *len);
typedef struct moeq_grammar_vocab moeq_grammar_vocab;

moeq_err moeq_grammar_vocab_new(int n_ids, moeq_grammar_token_fn token_bytes, void *ctx, moeq_grammar_vocab **out,
                                char *errstr, size_t errstr_size);
void moeq_grammar_vocab_destroy(moeq_grammar_vocab *vocab);
int moeq_grammar_vocab_size(const moeq_grammar_vocab *vocab);

/* ---- grammars -------------------------------------------------------------------- */

typedef enum moeq_grammar_kind {
    MOEQ_GRAMMAR_JSON_SCHEMA = 1, /* text = a JSON Schema (JSON text)                    */
    MOEQ_GRAMMAR_JSON_OBJECT,     /* any JSON object; text unused                        */
    MOEQ_GRAMMAR_REGEX,           /* text = a pattern the whole output matches           */
    MOEQ_GRAMMAR_CHOICE,          /* choices[0..n_choices): exactly one of them          */
} moeq_grammar_kind;

typedef struct moeq_grammar_spec {
    moeq_grammar_kind kind;
    const char *text;            /* borrowed for the call                               */
    size_t text_len;
    const char *const *choices;  /* NUL-terminated strings, borrowed                    */
    size_t n_choices;
} moeq_grammar_spec;

/* Bounds on what one grammar may cost. Defaults from moeq_grammar_default_limits(). */
typedef struct moeq_grammar_limits {
    int max_nfa_states;   /* compiled automaton; default 200000                          */
    int max_dfa_states;   /* reached DFA states (each 1 KiB + a mask when used); 20000   */
    int max_schema_depth; /* nesting of schemas inside schemas; default 16               */
    int max_repeat;       /* largest {n,m}, minItems/maxItems, minLength/maxLength
                             bound expanded into the automaton; default 256             */
    int max_string_chars; /* largest minLength/maxLength of a string; default 4096 (each
                             character position is a copy of the character's automaton,
                             and of a pattern's, beside minLength/maxLength)            */
    int max_recursion;    /* times a "$ref" may enter a schema again inside itself (a
                             recursive model, unrolled: values nest at most this many
                             levels below its first); 0 refuses recursion; default 4    */
} moeq_grammar_limits;

moeq_grammar_limits moeq_grammar_default_limits(void);

typedef struct moeq_grammar moeq_grammar;

/*
 * Whether spec compiles within limits (NULL: defaults), without a vocabulary: the automaton only, and whether
 * any output satisfies it. The same refusals as moeq_grammar_compile (UNSUPPORTED, PARSE, FORMAT, LIMIT, with
 * the message in errstr), for a process that checks a response_format before a worker takes the job.
 */
moeq_err moeq_grammar_check(const moeq_grammar_spec *spec, const moeq_grammar_limits *limits, char *errstr,
                            size_t errstr_size);

/*
 * Compile spec for vocab (borrowed; must outlive the grammar). limits NULL =
 * defaults. Errors: MOEQ_ERR_PARSE (the schema is not JSON, the pattern not
 * a regular expression), MOEQ_ERR_UNSUPPORTED (a keyword, format or regex
 * construct outside the subset, named with where it is: "schema keyword
 * 'patternProperties' at /properties/a is not supported"), MOEQ_ERR_LIMIT
 * (over limits), MOEQ_ERR_NOMEM. The grammar starts with one reference.
 */
moeq_err moeq_grammar_compile(const moeq_grammar_spec *spec, const moeq_grammar_vocab *vocab,
                              const moeq_grammar_limits *limits, moeq_grammar **out, char *errstr,
                              size_t errstr_size);
/* Reference counting: a cache and each matcher hold one. NULL is safe. */
void moeq_grammar_retain(moeq_grammar *grammar);
void moeq_grammar_release(moeq_grammar *grammar);

/* Sizes for benchmarks and tests. */
typedef struct moeq_grammar_stats {
    int nfa_states, dfa_states, masks; /* masks: DFA states whose token mask is cached */
    int min_bytes;                     /* shortest complete output, bytes              */
    size_t bytes;                      /* memory held, about (automata and masks)      */
    int shared_masks;                  /* states whose mask is an alike position's     */
} moeq_grammar_stats;
void moeq_grammar_get_stats(const moeq_grammar *grammar, moeq_grammar_stats *stats);

/* ---- cache by content hash ------------------------------------------------------- */

/*
 * Compiled grammars by (kind, text, choices), so the jobs of a batch (and
 * later batches) that share a schema compile it once and share its DFA and
 * masks. Least recently used entries beyond max_entries are released, and
 * beyond max_bytes (0: no bound) of what the kept grammars hold — they grow
 * as outputs reach new states, so the budget is checked at every get. A
 * released grammar lives on while a matcher holds it.
 */
typedef struct moeq_grammar_cache moeq_grammar_cache;

moeq_err moeq_grammar_cache_new(const moeq_grammar_vocab *vocab, const moeq_grammar_limits *limits,
                                int max_entries, moeq_grammar_cache **out, char *errstr, size_t errstr_size);
/* The byte budget (0: none; the default). */
void moeq_grammar_cache_set_max_bytes(moeq_grammar_cache *cache, size_t max_bytes);
/* What the kept grammars hold now, about. */
size_t moeq_grammar_cache_bytes(const moeq_grammar_cache *cache);
void moeq_grammar_cache_destroy(moeq_grammar_cache *cache);
/* The grammar for spec, compiled on a miss; *out holds a new reference (release it). Errors as compile. */
moeq_err moeq_grammar_cache_get(moeq_grammar_cache *cache, const moeq_grammar_spec *spec, moeq_grammar **out,
                                char *errstr, size_t errstr_size);
/* Hits and misses so far. */
void moeq_grammar_cache_counts(const moeq_grammar_cache *cache, int64_t *hits, int64_t *misses);

/* ---- matching --------------------------------------------------------------------- */

/* One output's position in a grammar. */
typedef struct moeq_grammar_matcher moeq_grammar_matcher;

/* Holds a reference to grammar. */
moeq_err moeq_grammar_matcher_new(moeq_grammar *grammar, moeq_grammar_matcher **out);
void moeq_grammar_matcher_destroy(moeq_grammar_matcher *matcher);
/* Back to the start (a new output). */
void moeq_grammar_matcher_reset(moeq_grammar_matcher *matcher);
/* dst takes src's position (both on the same grammar; INVALID_ARG otherwise): a scratch matcher for a guess. */
moeq_err moeq_grammar_matcher_copy(moeq_grammar_matcher *dst, const moeq_grammar_matcher *src);

/* Words of a token bitset over the vocabulary: (n_ids + 31) / 32; bit id of word id / 32 is id % 32. */
size_t moeq_grammar_mask_words(const moeq_grammar *grammar);

/*
 * The tokens allowed next, as a bitset (mask_words words), given `budget`
 * tokens still to come including this one (INT32_MAX: no limit). End-of-
 * sequence is the caller's business: allow it when moeq_grammar_matcher_
 * accepting says so. Returns the number of allowed tokens (0 when only
 * ending is possible) or -1 with *err set (MOEQ_ERR_LIMIT: the DFA outgrew
 * max_dfa_states; NOMEM).
 */
int64_t moeq_grammar_matcher_mask(moeq_grammar_matcher *matcher, int32_t budget, uint32_t *bits, moeq_err *err);

/* Advance by one token. MOEQ_ERR_INVALID_ARG (state unchanged) when the token is not allowed here. */
moeq_err moeq_grammar_matcher_accept(moeq_grammar_matcher *matcher, int32_t token);
/* Advance by raw bytes (tests, forced prefixes). Same errors. */
moeq_err moeq_grammar_matcher_accept_bytes(moeq_grammar_matcher *matcher, const char *bytes, size_t len);

/* 1 when the output so far is complete (ending here gives a valid output). */
int moeq_grammar_matcher_accepting(moeq_grammar_matcher *matcher);
/* 1 when complete and nothing may follow: the output is finished (finish_reason stop). */
int moeq_grammar_matcher_done(moeq_grammar_matcher *matcher);
/* Fewest bytes still needed to complete the output (0 when accepting). */
int moeq_grammar_matcher_distance(const moeq_grammar_matcher *matcher);

#ifdef __cplusplus
}
#endif
#endif
