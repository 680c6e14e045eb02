/*
 * test_grammar.c — the grammar library (moeq/grammar.h) on a synthetic
 * byte-level vocabulary: every single byte plus multi-byte tokens that
 * cross grammar boundaries ("}, ":, ,", {"a). Random walks over the masks
 * must end in complete outputs within their budget; masks must allow a
 * token exactly when its bytes walk the automaton; unsupported features are
 * errors naming themselves. The corpus test (structured_corpus.py) checks
 * real schemas against Python's jsonschema.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "moeq/grammar.h"

static const char *const multi[] = {"{\"", "\":", ",\"", "\"}", "true", "false", "null", "12", "3.5", "ab", "a\"",
                                    "\"name\":\"", "}}", "]}", "[\"", "\",\"", "é", "\xe4\xbd", "\xa0", "1\"}"};
#define N_MULTI (sizeof multi / sizeof multi[0])
#define N_IDS (256 + (int)N_MULTI + 2) /* + 2 unusable ids (specials) */

static int token_bytes(void *ctx, int32_t id, const char **bytes, size_t *len) {
    static char single[256];
    (void)ctx;
    if (id < 256) {
        single[id] = (char)id;
        *bytes = &single[id];
        *len = 1;
        return 0;
    }
    if (id < 256 + (int)N_MULTI) {
        *bytes = multi[id - 256];
        *len = strlen(multi[id - 256]);
        return 0;
    }
    return -1;
}

static moeq_grammar_vocab *vocab(void) {
    moeq_grammar_vocab *v = NULL;
    assert_int_equal(moeq_grammar_vocab_new(N_IDS, token_bytes, NULL, &v, NULL, 0), MOEQ_OK);
    return v;
}

static moeq_grammar *compile(moeq_grammar_vocab *v, moeq_grammar_kind kind, const char *text) {
    moeq_grammar_spec spec = {kind, text, text ? strlen(text) : 0, NULL, 0};
    moeq_grammar *g = NULL;
    char err[256] = "";
    moeq_err e = moeq_grammar_compile(&spec, v, NULL, &g, err, sizeof err);
    if (e) print_error("compile %s: %s\n", text, err);
    assert_int_equal(e, MOEQ_OK);
    return g;
}

static uint64_t rng(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* One random output of at most budget tokens into out; returns its length, asserts it is complete. */
static size_t random_walk(moeq_grammar *g, uint64_t seed, int budget, char *out, size_t cap) {
    moeq_grammar_matcher *m = NULL;
    assert_int_equal(moeq_grammar_matcher_new(g, &m), MOEQ_OK);
    size_t words = moeq_grammar_mask_words(g), len = 0;
    uint32_t *bits = calloc(words, sizeof *bits);
    int32_t ids[N_IDS];
    for (int left = budget; left > 0 && !moeq_grammar_matcher_done(m); left--) {
        if (moeq_grammar_matcher_accepting(m) && rng(&seed) % 4 == 0) break; /* the model chose to end */
        moeq_err err;
        int64_t n = moeq_grammar_matcher_mask(m, left, bits, &err);
        assert_true(n >= 0);
        if (n == 0) {
            assert_true(moeq_grammar_matcher_accepting(m)); /* nothing allowed: only ending */
            break;
        }
        int k = 0;
        for (int id = 0; id < N_IDS; id++)
            if (bits[id / 32] >> (id % 32) & 1) ids[k++] = id;
        assert_int_equal(k, n);
        int32_t t = ids[rng(&seed) % (uint64_t)k];
        const char *b = NULL;
        size_t bl = 0;
        token_bytes(NULL, t, &b, &bl);
        assert_true(len + bl < cap);
        memcpy(out + len, b, bl);
        len += bl;
        assert_int_equal(moeq_grammar_matcher_accept(m, t), MOEQ_OK);
    }
    out[len] = 0;
    if (!moeq_grammar_matcher_accepting(m)) print_error("incomplete output: %s\n", out);
    assert_true(moeq_grammar_matcher_accepting(m));
    free(bits);
    moeq_grammar_matcher_destroy(m);
    return len;
}

static int matches(moeq_grammar *g, const char *text) {
    moeq_grammar_matcher *m = NULL;
    assert_int_equal(moeq_grammar_matcher_new(g, &m), MOEQ_OK);
    int ok = moeq_grammar_matcher_accept_bytes(m, text, strlen(text)) == MOEQ_OK && moeq_grammar_matcher_accepting(m);
    moeq_grammar_matcher_destroy(m);
    return ok;
}

static void random_outputs_of_a_schema_are_complete_within_their_budget(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                         "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
                         "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"maxItems\":3},"
                         "\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\"]}";
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, schema);
    moeq_grammar_stats st;
    moeq_grammar_get_stats(g, &st);
    char out[4096];
    for (int budget = st.min_bytes; budget < st.min_bytes + 60; budget += 3)
        for (uint64_t seed = 1; seed <= 20; seed++) random_walk(g, seed * 7919 + (uint64_t)budget, budget, out, sizeof out);
    assert_true(matches(g, "{\"name\":\"x\",\"age\":150}"));
    assert_true(matches(g, "{\"name\":\"\\u00e9\\n\",\"age\":0,\"tags\":[\"a\",\"c\"],\"ok\":true}"));
    assert_false(matches(g, "{\"name\":\"x\",\"age\":151}"));
    assert_false(matches(g, "{\"age\":1,\"name\":\"x\"}")); /* properties in schema order */
    assert_false(matches(g, "{\"name\":\"x\"}"));            /* required */
    assert_false(matches(g, "{\"name\":\"x\",\"age\":1,\"tags\":[\"a\",\"a\",\"a\",\"a\"]}"));
    moeq_grammar_release(g);
    moeq_grammar_vocab_destroy(v);
}

/* 1 when prefix then token walk the automaton from its start. */
static int walks(moeq_grammar *g, const char *prefix, size_t plen, int32_t id) {
    const char *b;
    size_t len;
    if (token_bytes(NULL, id, &b, &len) != 0) return 0;
    moeq_grammar_matcher *m = NULL;
    assert_int_equal(moeq_grammar_matcher_new(g, &m), MOEQ_OK);
    int ok = moeq_grammar_matcher_accept_bytes(m, prefix, plen) == MOEQ_OK &&
             moeq_grammar_matcher_accept_bytes(m, b, len) == MOEQ_OK;
    moeq_grammar_matcher_destroy(m);
    return ok;
}

static void a_token_is_allowed_exactly_when_all_its_bytes_walk_the_automaton(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                              "{\"properties\":{\"name\":{\"type\":\"string\"}},\"required\":[\"name\"]}");
    moeq_grammar_matcher *m = NULL;
    assert_int_equal(moeq_grammar_matcher_new(g, &m), MOEQ_OK);
    uint32_t *bits = calloc(moeq_grammar_mask_words(g), 4);
    char prefix[256];
    size_t plen = 0;
    int crossed = 0;
    for (int step = 0; step < 12 && !moeq_grammar_matcher_done(m); step++) {
        moeq_err err;
        assert_true(moeq_grammar_matcher_mask(m, INT32_MAX, bits, &err) >= 0);
        int32_t pick = -1;
        for (int id = 0; id < N_IDS; id++) {
            int allowed = (int)(bits[id / 32] >> (id % 32) & 1);
            assert_int_equal(allowed, walks(g, prefix, plen, id));
            if (allowed && (pick < 256 || id == 256 + 11)) pick = id; /* prefer multi-byte tokens */
        }
        const char *b = NULL;
        size_t len = 0;
        token_bytes(NULL, pick, &b, &len);
        crossed += pick >= 256;
        memcpy(prefix + plen, b, len);
        plen += len;
        assert_int_equal(moeq_grammar_matcher_accept(m, pick), MOEQ_OK);
    }
    assert_true(crossed > 0);
    assert_true(moeq_grammar_matcher_done(m));
    prefix[plen] = 0;
    assert_true(matches(g, prefix));
    free(bits);
    moeq_grammar_matcher_destroy(m);
    moeq_grammar_release(g);
    moeq_grammar_vocab_destroy(v);
}

/* Length-bounded strings give a DFA state per character position; positions past the minimum and more than a
 * token away from the bound share one mask (dfa.c's alias key). Every mask must still equal the byte walk of
 * every token from the state itself, and every budget mask the tokens whose end state can finish in budget - 1
 * bytes: checked at each step of random outputs through a bounded string, a format with lengths and a pattern
 * with lengths (whose positions are a product's copies). */
static void alike_positions_share_masks_and_each_equals_the_byte_walk(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":60},"
        "\"u\":{\"type\":\"string\",\"format\":\"uri\",\"maxLength\":50}},\"required\":[\"s\",\"u\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"minLength\":2,\"maxLength\":40},"
        "\"maxItems\":3}",
    };
    for (int si = 0; si < 2; si++)
        for (uint64_t seed = 1; seed <= 6; seed++) {
            moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, schemas[si]);
            moeq_grammar_matcher *m = NULL, *probe = NULL;
            assert_int_equal(moeq_grammar_matcher_new(g, &m), MOEQ_OK);
            assert_int_equal(moeq_grammar_matcher_new(g, &probe), MOEQ_OK);
            uint32_t *bits = calloc(moeq_grammar_mask_words(g), 4), *tight = calloc(moeq_grammar_mask_words(g), 4);
            char prefix[4096];
            size_t plen = 0;
            uint64_t r = seed * 7919;
            for (int step = 0; step < 200 && !moeq_grammar_matcher_done(m); step++) {
                moeq_err err;
                assert_true(moeq_grammar_matcher_mask(m, INT32_MAX, bits, &err) >= 0);
                int32_t budget = (int32_t)(1 + rng(&r) % 6);
                assert_true(moeq_grammar_matcher_mask(m, budget, tight, &err) >= 0);
                int32_t ids[N_IDS];
                int k = 0;
                for (int id = 0; id < N_IDS; id++) {
                    int allowed = (int)(bits[id / 32] >> (id % 32) & 1);
                    if (allowed != walks(g, prefix, plen, id)) print_error("schema %d step %d id %d\n", si, step, id);
                    assert_int_equal(allowed, walks(g, prefix, plen, id));
                    int fits = 0;
                    if (allowed) {
                        assert_int_equal(moeq_grammar_matcher_copy(probe, m), MOEQ_OK);
                        assert_int_equal(moeq_grammar_matcher_accept(probe, id), MOEQ_OK);
                        fits = moeq_grammar_matcher_distance(probe) <= budget - 1;
                        ids[k++] = id;
                    }
                    assert_int_equal((int)(tight[id / 32] >> (id % 32) & 1), fits);
                }
                if (!k || (moeq_grammar_matcher_accepting(m) && rng(&r) % 8 == 0)) break;
                int32_t pick = ids[rng(&r) % (uint64_t)k];
                const char *b = NULL;
                size_t len = 0;
                token_bytes(NULL, pick, &b, &len);
                assert_true(plen + len < sizeof prefix);
                memcpy(prefix + plen, b, len);
                plen += len;
                assert_int_equal(moeq_grammar_matcher_accept(m, pick), MOEQ_OK);
            }
            moeq_grammar_stats st;
            moeq_grammar_get_stats(g, &st);
            if (seed == 6) assert_true(st.shared_masks > 0);
            free(bits), free(tight);
            moeq_grammar_matcher_destroy(m), moeq_grammar_matcher_destroy(probe);
            moeq_grammar_release(g);
        }
    moeq_grammar_vocab_destroy(v);
}

/* With a budget, a token is allowed exactly when its end state can still finish in budget - 1 bytes. */
static void a_tight_budget_allows_exactly_the_tokens_that_can_still_finish(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                              "{\"properties\":{\"name\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"},"
                              "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"ab\",\"true\"]}}},"
                              "\"required\":[\"name\"]}");
    uint32_t *bits = calloc(moeq_grammar_mask_words(g), 4);
    uint64_t seed = 3;
    for (int run = 0; run < 40; run++) {
        moeq_grammar_matcher *m = NULL;
        assert_int_equal(moeq_grammar_matcher_new(g, &m), MOEQ_OK);
        char prefix[512];
        size_t plen = 0;
        for (int step = 0; step < 30 && !moeq_grammar_matcher_done(m); step++) {
            int budget = 1 + (int)(rng(&seed) % 24);
            moeq_err err;
            int64_t n = moeq_grammar_matcher_mask(m, budget, bits, &err);
            assert_true(n >= 0);
            int64_t k = 0;
            for (int id = 0; id < N_IDS; id++) {
                const char *b = NULL;
                size_t len = 0;
                int want = 0;
                if (token_bytes(NULL, id, &b, &len) == 0) {
                    moeq_grammar_matcher *p = NULL;
                    assert_int_equal(moeq_grammar_matcher_new(g, &p), MOEQ_OK);
                    want = moeq_grammar_matcher_accept_bytes(p, prefix, plen) == MOEQ_OK &&
                           moeq_grammar_matcher_accept_bytes(p, b, len) == MOEQ_OK &&
                           moeq_grammar_matcher_distance(p) <= budget - 1;
                    moeq_grammar_matcher_destroy(p);
                }
                assert_int_equal((int)(bits[id / 32] >> (id % 32) & 1), want);
                k += want;
            }
            assert_int_equal(k, n);
            /* advance by any token allowed without a budget */
            n = moeq_grammar_matcher_mask(m, INT32_MAX, bits, &err);
            int32_t ids[N_IDS], c = 0;
            for (int id = 0; id < N_IDS; id++)
                if (bits[id / 32] >> (id % 32) & 1) ids[c++] = id;
            if (c == 0) break;
            int32_t t = ids[rng(&seed) % (uint64_t)c];
            const char *b = NULL;
            size_t len = 0;
            token_bytes(NULL, t, &b, &len);
            if (plen + len >= sizeof prefix) break;
            memcpy(prefix + plen, b, len);
            plen += len;
            assert_int_equal(moeq_grammar_matcher_accept(m, t), MOEQ_OK);
        }
        moeq_grammar_matcher_destroy(m);
    }
    free(bits);
    moeq_grammar_release(g);
    moeq_grammar_vocab_destroy(v);
}

static void expect_error(moeq_grammar_vocab *v, moeq_grammar_kind kind, const char *text, moeq_err want,
                         const char *needle) {
    moeq_grammar_spec spec = {kind, text, strlen(text), NULL, 0};
    moeq_grammar *g = NULL;
    char err[256] = "";
    moeq_err e = moeq_grammar_compile(&spec, v, NULL, &g, err, sizeof err);
    if (e != want || !strstr(err, needle)) print_error("%s: got %d '%s'\n", text, (int)e, err);
    assert_int_equal(e, want);
    assert_non_null(strstr(err, needle));
    assert_null(g);
}

static void an_unsupported_feature_is_an_error_naming_it_and_where(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"properties\":{\"a\":{\"patternProperties\":{}}}}",
                 MOEQ_ERR_UNSUPPORTED, "'patternProperties' is not supported at /properties/a");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"#/$defs/x\"}", MOEQ_ERR_FORMAT,
                 "'$ref' '#/$defs/x' names nothing in the schema at /");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"hostname\"}", MOEQ_ERR_UNSUPPORTED,
                 "format 'hostname'");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"anyOf\":[{\"type\":\"integer\"},{\"not\":{}}]}",
                 MOEQ_ERR_UNSUPPORTED, "'not' is not supported at /anyOf/1");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", MOEQ_ERR_UNSUPPORTED,
                 "backreferences");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.5}", MOEQ_ERR_UNSUPPORTED,
                 "'multipleOf' is not supported");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":", MOEQ_ERR_PARSE, "schema JSON");
    expect_error(v, MOEQ_GRAMMAR_REGEX, "a(?=b)", MOEQ_ERR_UNSUPPORTED, "lookaround");
    expect_error(v, MOEQ_GRAMMAR_REGEX, "[a-\\d]", MOEQ_ERR_PARSE, "bad class range"); /* a class cannot end a range */
    expect_error(v, MOEQ_GRAMMAR_REGEX, "a{1,100000}", MOEQ_ERR_LIMIT, "max_repeat");
    expect_error(v, MOEQ_GRAMMAR_REGEX, "(ab", MOEQ_ERR_PARSE, "missing )");
    /* nested repeats past the state limit fail at once, not after m^depth rebuilds */
    expect_error(v, MOEQ_GRAMMAR_REGEX, "((((((a{256}){256}){256}){256}){256}){256})", MOEQ_ERR_LIMIT, "max_nfa_states");
    char deep[2048] = "";
    for (int i = 0; i < 8; i++) strcat(deep, "{\"type\":\"array\",\"minItems\":256,\"items\":");
    strcat(deep, "{\"type\":\"integer\"}");
    for (int i = 0; i < 8; i++) strcat(deep, "}");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, deep, MOEQ_ERR_LIMIT, "max_nfa_states");
    moeq_grammar_vocab_destroy(v);
}

/* $ref into $defs / definitions (JSON pointer escapes, array indices), allOf of one schema (a generator's
 * description wrapper), as a pydantic model's schema has them; what stays refused says why and where. */
static void refs_and_single_all_of_compile_as_their_targets(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    const char *schema =
        "{\"$defs\":{\"Point\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},"
        "\"required\":[\"x\"],\"additionalProperties\":false},"
        "\"Kind\":{\"enum\":[\"a\",\"b\"]}},"
        "\"definitions\":{\"a/b~c\":{\"type\":\"boolean\"}},"
        "\"title\":\"Shape\",\"type\":\"object\",\"properties\":{"
        "\"p\":{\"$ref\":\"#/$defs/Point\",\"description\":\"where\"},"
        "\"q\":{\"anyOf\":[{\"$ref\":\"#/$defs/Point\"},{\"type\":\"null\"}],\"default\":null},"
        "\"k\":{\"allOf\":[{\"$ref\":\"#/$defs/Kind\"}],\"description\":\"kind\"},"
        "\"f\":{\"$ref\":\"#/definitions/a~1b~0c\"},"
        "\"g\":{\"$ref\":\"#/properties/q/anyOf/1\"}},"
        "\"required\":[\"p\",\"q\",\"k\",\"f\",\"g\"],\"additionalProperties\":false}";
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, schema);
    assert_true(matches(g, "{\"p\":{\"x\":1},\"q\":null,\"k\":\"a\",\"f\":true,\"g\":null}"));
    assert_true(matches(g, "{\"p\":{\"x\":-7},\"q\":{\"x\":2},\"k\":\"b\",\"f\":false,\"g\":null}"));
    assert_false(matches(g, "{\"p\":{},\"q\":null,\"k\":\"a\",\"f\":true,\"g\":null}"));        /* x required */
    assert_false(matches(g, "{\"p\":{\"x\":1},\"q\":null,\"k\":\"c\",\"f\":true,\"g\":null}")); /* the enum */
    assert_false(matches(g, "{\"p\":{\"x\":1},\"q\":null,\"k\":\"a\",\"f\":1,\"g\":null}"));   /* boolean */
    assert_false(matches(g, "{\"p\":{\"x\":1},\"q\":null,\"k\":\"a\",\"f\":true,\"g\":{}}"));  /* null */
    char out[4096];
    moeq_grammar_stats st;
    moeq_grammar_get_stats(g, &st);
    for (uint64_t seed = 1; seed <= 20; seed++) random_walk(g, seed, st.min_bytes + 40, out, sizeof out);
    moeq_grammar_release(g);
    /* a root reference, and one reached twice in a row (not recursion) */
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                "{\"$defs\":{\"I\":{\"type\":\"integer\"}},\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/I\"},"
                "\"maxItems\":3}");
    assert_true(matches(g, "[1,2,3]"));
    assert_false(matches(g, "[1,\"a\"]"));
    moeq_grammar_release(g);
    { /* max_recursion = 0 refuses recursion, named where it first refers back, not a level further in */
        const char *rec = "{\"properties\":{\"next\":{\"$ref\":\"#\"}}}";
        moeq_grammar_spec spec = {MOEQ_GRAMMAR_JSON_SCHEMA, rec, strlen(rec), NULL, 0};
        moeq_grammar_limits lim = moeq_grammar_default_limits();
        lim.max_recursion = 0;
        moeq_grammar *none = NULL;
        char err[256] = "";
        assert_int_equal(moeq_grammar_compile(&spec, v, &lim, &none, err, sizeof err), MOEQ_ERR_UNSUPPORTED);
        assert_non_null(strstr(err, "'$ref' '#' is recursive"));
        const char *at = strstr(err, " at ");
        assert_non_null(at);
        assert_string_equal(at, " at /properties/next");
    }
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"https://example.com/s.json\"}", MOEQ_ERR_UNSUPPORTED,
                 "only references inside the schema");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"$defs\":{\"a\":{}},\"$ref\":\"#/$defs/a\",\"type\":\"object\"}",
                 MOEQ_ERR_UNSUPPORTED, "'$ref' beside 'type' is not supported");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"allOf\":[{\"type\":\"object\"},{\"required\":[\"a\"]}]}",
                 MOEQ_ERR_UNSUPPORTED, "'allOf': required property 'a' is in no branch's 'properties'");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"#/$defs/a~2\"}", MOEQ_ERR_FORMAT, "names nothing");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"$ref\":3}", MOEQ_ERR_FORMAT, "'$ref' must be a string");
    moeq_grammar_vocab_destroy(v);
}

/* {"t":1,"sub":[{"t":2,"sub":[ ... ]}]}: levels nested sections, the innermost with no subsections. */
static void sections(char *out, int levels) {
    out[0] = 0;
    for (int i = 0; i < levels; i++) sprintf(out + strlen(out), "{\"t\":%d,\"sub\":[", i);
    for (int i = 0; i < levels; i++) strcat(out, "]}");
}

/* Recursive models (a tree of sections, a linked list through "#", a binary tree) unroll to max_recursion
 * levels below the first: every output the masks allow is complete and valid, deeper values are refused, and a
 * schema whose recursion never ends is refused by name. */
static void recursive_refs_unroll_to_max_recursion_levels(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    const char *tree = "{\"$defs\":{\"S\":{\"type\":\"object\",\"properties\":{\"t\":{\"type\":\"integer\"},"
                       "\"sub\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/S\"},\"maxItems\":2}},"
                       "\"required\":[\"t\",\"sub\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/S\"}";
    char text[512], out[4096];
    for (int max = 1; max <= 4; max += 3) { /* 1, and the default 4 */
        moeq_grammar_limits lim = moeq_grammar_default_limits();
        lim.max_recursion = max;
        moeq_grammar_spec spec = {MOEQ_GRAMMAR_JSON_SCHEMA, tree, strlen(tree), NULL, 0};
        moeq_grammar *g = NULL;
        char err[256] = "";
        moeq_err e = moeq_grammar_compile(&spec, v, &lim, &g, err, sizeof err);
        if (e) print_error("%s\n", err);
        assert_int_equal(e, MOEQ_OK);
        for (int levels = 1; levels <= max + 2; levels++) {
            sections(text, levels);
            assert_int_equal(matches(g, text), levels <= max + 1);
        }
        assert_true(matches(g, "{\"t\":0,\"sub\":[{\"t\":1,\"sub\":[]},{\"t\":2,\"sub\":[]}]}"));
        assert_false(matches(g, "{\"t\":0,\"sub\":[{\"t\":1}]}")); /* sub is required at every level */
        for (uint64_t seed = 1; seed <= 30; seed++) random_walk(g, seed, 200, out, sizeof out);
        moeq_grammar_release(g);
    }
    /* through the root, with anyOf's null ending the list */
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                              "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                              "\"next\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}},"
                              "\"required\":[\"v\",\"next\"]}");
    strcpy(text, "null");
    for (int n = 1; n <= 6; n++) {
        char longer[512];
        snprintf(longer, sizeof longer, "{\"v\":%d,\"next\":%s}", n, text);
        strcpy(text, longer);
        assert_int_equal(matches(g, text), n <= 5);
    }
    for (uint64_t seed = 1; seed <= 30; seed++) random_walk(g, seed, 200, out, sizeof out);
    moeq_grammar_release(g);
    /* two references per level: 2^5 copies at the innermost level, still far inside max_nfa_states */
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                "{\"type\":\"object\",\"properties\":{\"l\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]},"
                "\"r\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}},\"required\":[\"l\",\"r\"]}");
    assert_true(matches(g, "{\"l\":{\"l\":null,\"r\":{\"l\":null,\"r\":null}},\"r\":null}"));
    for (uint64_t seed = 1; seed <= 30; seed++) random_walk(g, seed, 400, out, sizeof out);
    moeq_grammar_release(g);
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                 "{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#\"}},\"required\":[\"next\"]}",
                 MOEQ_ERR_UNSUPPORTED, "a recursive schema with no value that nests at most 4 levels");
    moeq_grammar_vocab_destroy(v);
}

/* allOf of object schemas (an OpenAPI model extending a base, a model's own properties beside its base's) is
 * merged: properties in branch order, required the union, additionalProperties false honoured; what cannot be
 * merged is refused by name. */
static void all_of_merges_object_schemas(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
#define BASE "\"$defs\":{\"Base\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}," \
             "\"kind\":{\"enum\":[\"a\",\"b\"]}},\"required\":[\"id\"]}," \
             "\"Closed\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}}," \
             "\"additionalProperties\":false}}"
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                              "{" BASE ",\"allOf\":[{\"$ref\":\"#/$defs/Base\"},{\"type\":\"object\",\"properties\":"
                              "{\"note\":{\"type\":\"string\",\"maxLength\":5},\"id\":{\"type\":\"integer\"}},"
                              "\"required\":[\"note\"]},{\"description\":\"an annotation-only branch\"}]}");
    assert_true(matches(g, "{\"id\":1,\"note\":\"x\"}"));
    assert_true(matches(g, "{\"id\":-4,\"kind\":\"b\",\"note\":\"\"}"));
    assert_false(matches(g, "{\"note\":\"x\"}")); /* Base's required */
    assert_false(matches(g, "{\"id\":1}"));       /* the extension's required */
    assert_false(matches(g, "{\"id\":1,\"kind\":\"c\",\"note\":\"x\"}"));
    char out[1024];
    for (uint64_t seed = 1; seed <= 20; seed++) random_walk(g, seed, 80, out, sizeof out);
    moeq_grammar_release(g);
    /* the schema's own properties beside allOf, and a nested allOf, are branches too */
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                "{" BASE ",\"allOf\":[{\"allOf\":[{\"$ref\":\"#/$defs/Base\"}]}],\"properties\":{\"ok\":"
                "{\"type\":\"boolean\"}},\"required\":[\"ok\"],\"title\":\"T\"}");
    assert_true(matches(g, "{\"id\":2,\"ok\":true}"));
    assert_false(matches(g, "{\"id\":2}"));
    moeq_grammar_release(g);
    /* a branch with additionalProperties false keeps the others' properties out */
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                "{" BASE ",\"allOf\":[{\"$ref\":\"#/$defs/Closed\"},"
                "{\"properties\":{\"note\":{\"type\":\"string\"}}}]}");
    assert_true(matches(g, "{\"id\":1}"));
    assert_true(matches(g, "{}"));
    assert_false(matches(g, "{\"id\":1,\"note\":\"x\"}"));
    moeq_grammar_release(g);
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                 "{" BASE ",\"allOf\":[{\"$ref\":\"#/$defs/Closed\"},{\"properties\":{\"note\":{\"type\":\"string\"}},"
                 "\"required\":[\"note\"]}]}",
                 MOEQ_ERR_FORMAT, "'note' is required, but a branch with additionalProperties false");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                 "{" BASE ",\"allOf\":[{\"$ref\":\"#/$defs/Base\"},{\"properties\":{\"id\":{\"type\":\"string\"}}}]}",
                 MOEQ_ERR_UNSUPPORTED, "'allOf' gives property 'id' two different schemas");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"allOf\":[{\"type\":\"integer\"},{\"minimum\":0}]}",
                 MOEQ_ERR_UNSUPPORTED, "'allOf' merges object schemas only");
#undef BASE
    moeq_grammar_vocab_destroy(v);
}

/* Sets and tuples as pydantic writes them: set[Literal[...]] (uniqueItems over a finite set: distinct values in the
 * schema's order, within minItems/maxItems), tuple[int, str] (prefixItems, draft 7's items array) and a tuple
 * with a rest; uniqueItems over items that cannot be told apart is refused by name. */
static void sets_and_tuples_compile(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                              "{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\",1,1.0],\"type\":[\"string\","
                              "\"integer\"]},\"uniqueItems\":true,\"maxItems\":3}");
    static const char *const yes[] = {"[]", "[\"a\"]", "[\"a\",\"c\"]", "[\"b\",\"c\",1]", "[1]"};
    static const char *const no[] = {"[\"a\",\"a\"]", "[\"c\",\"a\"]", "[\"a\",\"b\",\"c\",1]", "[1,1]", "[1.0]"};
    for (int i = 0; i < 5; i++) assert_true(matches(g, yes[i]));
    for (int i = 0; i < 5; i++) assert_false(matches(g, no[i]));
    char out[512];
    for (uint64_t seed = 1; seed <= 20; seed++) random_walk(g, seed, 40, out, sizeof out);
    moeq_grammar_release(g);
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":4},\"uniqueItems\":true,"
                "\"minItems\":2}");
    assert_true(matches(g, "[1,4]"));
    assert_true(matches(g, "[1,2,3,4]"));
    assert_false(matches(g, "[2]"));
    assert_false(matches(g, "[1,2,3,4,4]"));
    moeq_grammar_release(g);
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"items\":{\"type\":\"boolean\"},\"uniqueItems\":true}");
    assert_true(matches(g, "[true,false]"));
    assert_false(matches(g, "[true,true]"));
    moeq_grammar_release(g);
    /* tuple[int, str]: pydantic's prefixItems with minItems = maxItems */
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":3}],"
                "\"minItems\":2,\"maxItems\":2}");
    assert_true(matches(g, "[1,\"ab\"]"));
    assert_false(matches(g, "[1]"));
    assert_false(matches(g, "[\"ab\",1]"));
    assert_false(matches(g, "[1,\"ab\",2]"));
    for (uint64_t seed = 1; seed <= 20; seed++) random_walk(g, seed, 40, out, sizeof out);
    moeq_grammar_release(g);
    /* a prefix then a rest of integers (tuple[str, *int]), and draft 7's items array with additionalItems false */
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                "{\"prefixItems\":[{\"type\":\"string\",\"maxLength\":2}],\"items\":{\"type\":\"integer\"}}");
    assert_true(matches(g, "[]"));
    assert_true(matches(g, "[\"x\"]"));
    assert_true(matches(g, "[\"x\",1,2,3]"));
    assert_false(matches(g, "[\"x\",\"y\"]"));
    for (uint64_t seed = 1; seed <= 20; seed++) random_walk(g, seed, 60, out, sizeof out);
    moeq_grammar_release(g);
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                "{\"type\":\"array\",\"items\":[{\"type\":\"boolean\"},{\"type\":\"null\"}],\"additionalItems\":false,"
                "\"minItems\":1}");
    assert_true(matches(g, "[true]"));
    assert_true(matches(g, "[false,null]"));
    assert_false(matches(g, "[]"));
    assert_false(matches(g, "[false,null,null]"));
    moeq_grammar_release(g);
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                 "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}", MOEQ_ERR_UNSUPPORTED,
                 "'uniqueItems': true needs items with a finite set of values");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                 "{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"uniqueItems\":true,\"minItems\":3}",
                 MOEQ_ERR_FORMAT, "minItems is above the number of distinct values");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                 "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"null\"}],\"items\":false,\"minItems\":2}",
                 MOEQ_ERR_FORMAT, "no more items are allowed");
    moeq_grammar_vocab_destroy(v);
}

/* Characters of a JSON string's contents (no quotes): one per UTF-8 lead or ASCII byte, an escape one. */
static int json_chars_of(const char *t) {
    int k = 0;
    for (const unsigned char *p = (const unsigned char *)t; *p; p++) {
        if (*p == '\\') p += p[1] == 'u' ? 5 : 1;
        if ((*p & 0xC0) != 0x80) k++;
    }
    return k;
}

/* Length bounds: a bounded string (the chain of per-position characters) admits what the unbounded one does,
 * exactly when it has no more characters than maxLength (multi-byte UTF-8, escapes, and the bytes JSON or UTF-8
 * refuse); minLength/maxLength beside a pattern or format (the pattern's minimal DFA times a character count;
 * pydantic's HttpUrl: format uri, 1..2083); format uri; a bound past max_string_chars is refused by name. */
static void string_lengths_hold_with_and_without_patterns(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    static const char *const texts[] = {"", "a", "ab", "abc", "\xc3\xa9", "\xc3\xa9\xc3\xa9\xc3\xa9",
                                        "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x98\x80x", "\\n", "\\u00e9z",
                                        "a\\\"b", "\xed\xa0\x80", "\xc0\x80", "\x01", "\xf4\x90\x80\x80",
                                        "\xe0\x80\x80", "abcdefgh", "\\x"};
    moeq_grammar *any = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\"}");
    for (int mx = 0; mx <= 4; mx++) {
        char schema[96], q[64];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"minLength\":1,\"maxLength\":%d}", mx);
        if (mx == 0) snprintf(schema, sizeof schema, "{\"type\":\"string\",\"maxLength\":0}");
        moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, schema);
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            snprintf(q, sizeof q, "\"%s\"", texts[i]);
            int k = json_chars_of(texts[i]), want = matches(any, q) && k <= mx && (mx == 0 || k >= 1);
            if (matches(g, q) != want) print_error("%s: %s admitted %d want %d\n", schema, q, !want, want);
            assert_int_equal(matches(g, q), want);
        }
        moeq_grammar_release(g);
    }
    moeq_grammar_release(any);
    /* a pattern with lengths: characters, not bytes */
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                              "{\"type\":\"string\",\"pattern\":\"^[a-z\xc3\xa9]+$\",\"minLength\":2,\"maxLength\":3}");
    assert_true(matches(g, "\"ab\""));
    assert_true(matches(g, "\"\xc3\xa9\xc3\xa9\xc3\xa9\""));
    assert_false(matches(g, "\"a\""));
    assert_false(matches(g, "\"abcd\""));
    assert_false(matches(g, "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\""));
    assert_false(matches(g, "\"aB\""));
    moeq_grammar_release(g);
    /* a search pattern (no anchors) with a length: the count covers what surrounds the match */
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"x\",\"maxLength\":3}");
    assert_true(matches(g, "\"axb\""));
    assert_false(matches(g, "\"aaxb\""));
    assert_false(matches(g, "\"ab\""));
    moeq_grammar_release(g);
    /* pydantic's HttpUrl */
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                "{\"type\":\"string\",\"format\":\"uri\",\"minLength\":1,\"maxLength\":2083}");
    static const char *const uris[] = {"\"https://example.com/a/b?x=1&y=%20#top\"", "\"mailto:a@b.c\"",
                                       "\"urn:isbn:0451450523\"", "\"http://u:p@host:8080/\"", "\"a:\""};
    static const char *const not_uris[] = {"\"example.com\"", "\"http://exa mple.com\"", "\"1http://x\"",
                                           "\"http://x/%zz\"", "\"\""};
    for (int i = 0; i < 5; i++) assert_true(matches(g, uris[i]));
    for (int i = 0; i < 5; i++) assert_false(matches(g, not_uris[i]));
    moeq_grammar_release(g);
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"uri\",\"maxLength\":12}");
    char out[512];
    for (uint64_t seed = 1; seed <= 30; seed++) {
        size_t len = random_walk(g, seed, 40, out, sizeof out);
        out[len - 1] = 0;
        assert_true(json_chars_of(out + 1) <= 12);
    }
    moeq_grammar_release(g);
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":5000}", MOEQ_ERR_LIMIT,
                 "'maxLength' is above the grammar's max_string_chars (4096)");
    moeq_grammar_vocab_destroy(v);
}

/* Maps (pydantic's dict[str, X]: additionalProperties a schema) hold every value to it; minProperties,
 * maxProperties and propertyNames bound them; beside properties only those are written (additionalProperties
 * true or a schema then holds for no extra member). Before, a map was any object: {"a":"x"} for dict[str, int]. */
static void maps_hold_their_values_and_bounds(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"additionalProperties\":"
                                                          "{\"type\":\"integer\"}}");
    assert_true(matches(g, "{}"));
    assert_true(matches(g, "{\"a\":1,\"b\":-2}"));
    assert_false(matches(g, "{\"a\":\"x\"}"));
    assert_false(matches(g, "{\"a\":1,\"b\":null}"));
    char out[512];
    for (uint64_t seed = 1; seed <= 20; seed++) random_walk(g, seed, 60, out, sizeof out);
    moeq_grammar_release(g);
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                "{\"propertyNames\":{\"pattern\":\"^[a-z]+$\"},\"additionalProperties\":{\"type\":\"boolean\"},"
                "\"minProperties\":1,\"maxProperties\":2}");
    assert_true(matches(g, "{\"ab\":true}"));
    assert_true(matches(g, "{\"ab\":true,\"c\":false}"));
    assert_false(matches(g, "{}"));
    assert_false(matches(g, "{\"Ab\":true}"));
    assert_false(matches(g, "{\"a\":true,\"b\":true,\"c\":true}"));
    moeq_grammar_release(g);
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"propertyNames\":{\"enum\":[\"x\",\"y\"]},\"additionalProperties\":"
                                            "{\"type\":\"null\"}}");
    assert_true(matches(g, "{\"y\":null,\"x\":null}"));
    assert_false(matches(g, "{\"z\":null}"));
    moeq_grammar_release(g);
    /* beside properties: the listed ones only */
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"],"
                "\"additionalProperties\":{\"type\":\"string\"},\"minProperties\":1}");
    assert_true(matches(g, "{\"a\":1}"));
    assert_false(matches(g, "{\"a\":1,\"z\":\"w\"}"));
    moeq_grammar_release(g);
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                 "{\"properties\":{\"a\":{}},\"minProperties\":1}", MOEQ_ERR_UNSUPPORTED,
                 "minProperties/maxProperties beside 'properties' only where");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"propertyNames\":{\"type\":\"integer\"}}", MOEQ_ERR_UNSUPPORTED,
                 "'propertyNames' other than a string schema");
    /* two members or more: a repeated key would be one member to a reader, so the keys must differ: distinct keys
     * of propertyNames' enum, in its order (grammar_fuzz.py found {"k2":1,"k2":2} for minProperties 2) */
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"propertyNames\":{\"enum\":[\"a\",\"b\",\"c\"]},\"minProperties\":2,"
                                            "\"additionalProperties\":{\"type\":\"integer\"}}");
    assert_true(matches(g, "{\"a\":1,\"c\":2}"));
    assert_true(matches(g, "{\"a\":1,\"b\":2,\"c\":3}"));
    assert_false(matches(g, "{\"a\":1,\"a\":2}"));
    assert_false(matches(g, "{\"b\":1}"));
    moeq_grammar_release(g);
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"minProperties\":2}", MOEQ_ERR_UNSUPPORTED,
                 "minProperties of 2 or more needs propertyNames with a finite set of keys");
    moeq_grammar_vocab_destroy(v);
}

/* enum/const beside other keywords: a value is written only where they admit it (before, only "type" filtered,
 * so "bb" was written for {"enum": ["a", "bb"], "maxLength": 1}); an untyped schema's keywords restrict only
 * their own type ({"minimum": 2} leaves "a" valid); an untyped schema with number bounds writes numbers within
 * them (before: any value, -5 for {"minimum": 0}); no value left is an error naming why. */
static void enum_values_meet_the_schemas_other_keywords(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"enum\":[\"a\",\"bb\",7],\"maxLength\":1}");
    assert_true(matches(g, "\"a\""));
    assert_false(matches(g, "\"bb\""));
    assert_true(matches(g, "7")); /* maxLength does not apply to numbers */
    moeq_grammar_release(g);
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"enum\":[1,\"a\",3,{\"k\":1},{\"k\":\"x\"}],\"minimum\":2,"
                                            "\"properties\":{\"k\":{\"type\":\"integer\"}}}");
    assert_false(matches(g, "1"));
    assert_true(matches(g, "3"));
    assert_true(matches(g, "\"a\""));
    assert_true(matches(g, "{\"k\":1}"));
    assert_false(matches(g, "{\"k\":\"x\"}"));
    moeq_grammar_release(g);
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"properties\":{\"x\":{\"minimum\":0}},\"required\":[\"x\"]}");
    assert_true(matches(g, "{\"x\":3}"));
    assert_false(matches(g, "{\"x\":-5}"));
    assert_false(matches(g, "{\"x\":\"s\"}")); /* numbers only: a subset of what the schema allows */
    moeq_grammar_release(g);
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"const\":5,\"minimum\":6}", MOEQ_ERR_FORMAT,
                 "no value of 'enum'/'const' meets the schema's other keywords");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"enum\":[\"a\"],\"not\":{}}", MOEQ_ERR_UNSUPPORTED,
                 "'not' is not supported");
    moeq_grammar_vocab_destroy(v);
}

/* oneOf whose branches no value can match twice: by type, or by a property both require with disjoint
 * const/enum values (pydantic's discriminated unions, through $ref); branches that may overlap are refused. */
static void one_of_compiles_when_its_branches_are_told_apart(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    const char *pets =
        "{\"$defs\":{\"Cat\":{\"type\":\"object\",\"properties\":{\"pet\":{\"const\":\"cat\",\"type\":\"string\"},"
        "\"lives\":{\"type\":\"integer\"}},\"required\":[\"pet\",\"lives\"]},"
        "\"Dog\":{\"type\":\"object\",\"properties\":{\"pet\":{\"enum\":[\"dog\",\"puppy\"]},"
        "\"good\":{\"type\":\"boolean\"}},\"required\":[\"pet\",\"good\"]}},"
        "\"type\":\"object\",\"properties\":{\"p\":{\"oneOf\":[{\"$ref\":\"#/$defs/Cat\"},{\"$ref\":\"#/$defs/Dog\"}],"
        "\"discriminator\":{\"propertyName\":\"pet\",\"mapping\":{\"cat\":\"#/$defs/Cat\",\"dog\":\"#/$defs/Dog\"}}}},"
        "\"required\":[\"p\"]}";
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, pets);
    assert_true(matches(g, "{\"p\":{\"pet\":\"cat\",\"lives\":9}}"));
    assert_true(matches(g, "{\"p\":{\"pet\":\"puppy\",\"good\":true}}"));
    assert_false(matches(g, "{\"p\":{\"pet\":\"cat\",\"good\":true}}"));
    char out[4096];
    for (uint64_t seed = 1; seed <= 20; seed++) random_walk(g, seed, 60, out, sizeof out);
    moeq_grammar_release(g);
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"integer\"},"
                                             "{\"type\":[\"null\",\"boolean\"]}]}");
    assert_true(matches(g, "\"ab\""));
    assert_true(matches(g, "-12"));
    assert_true(matches(g, "null"));
    assert_false(matches(g, "1.5"));
    moeq_grammar_release(g);
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}",
                 MOEQ_ERR_UNSUPPORTED, "'oneOf' branches 0 and 1 may both match a value");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                 "{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"object\",\"properties\":{\"k\":{\"const\":1}},"
                 "\"required\":[\"k\"]},{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[2,1.0]}},"
                 "\"required\":[\"k\"]}]}",
                 MOEQ_ERR_UNSUPPORTED, "'oneOf' branches 1 and 2 may both match a value"); /* 1 == 1.0 */
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                 "{\"oneOf\":[{\"properties\":{\"k\":{\"const\":1}},\"required\":[\"k\"]},"
                 "{\"properties\":{\"k\":{\"const\":2}}}]}",
                 MOEQ_ERR_UNSUPPORTED, "may both match"); /* k optional in one: {} matches both */
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"string\"}],\"type\":\"string\"}",
                 MOEQ_ERR_UNSUPPORTED, "'oneOf' beside 'type' is not supported");
    moeq_grammar_vocab_destroy(v);
}

/* A number text as the bounded-number grammar should admit it: -?(0|[1-9][0-9]*)(\.[0-9]+)?, never "-0...",
 * with at most 4 fraction digits (the candidates have no more); its value in units of 1e-4 into *v. */
static int canonical_number(const char *t, long long *v) {
    int neg = *t == '-';
    const char *p = t + neg;
    if (!(*p >= '0' && *p <= '9') || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return 0;
    long long ip = 0, frac = 0;
    for (; *p >= '0' && *p <= '9'; p++) ip = ip * 10 + (*p - '0');
    int fd = 0;
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, fd++) frac = frac * 10 + (*p - '0');
        if (fd == 0) return 0;
    }
    if (*p) return 0;
    for (int i = fd; i < 4; i++) frac *= 10;
    *v = (ip * 10000 + frac) * (neg ? -1 : 1);
    return !(neg && *v == 0);
}

/* Number bounds of any sign, fractional and exclusive (and draft 4's boolean exclusive*), against every
 * candidate text: admitted exactly when canonical and within the bounds, compared exactly (units of 1e-4). */
static void number_bounds_admit_exactly_the_values_within_them(void **state) {
    (void)state;
    static const struct {
        const char *bounds;
        int has_lo, lo_strict, has_hi, hi_strict;
        long long lo, hi; /* units of 1e-4 */
    } cases[] = {
        {"\"minimum\":0,\"maximum\":1", 1, 0, 1, 0, 0, 10000},
        {"\"exclusiveMinimum\":0", 1, 1, 0, 0, 0, 0},
        {"\"minimum\":-1.5,\"maximum\":2.25", 1, 0, 1, 0, -15000, 22500},
        {"\"exclusiveMinimum\":-10,\"exclusiveMaximum\":-0.5", 1, 1, 1, 1, -100000, -5000},
        {"\"maximum\":0.5", 0, 0, 1, 0, 0, 5000},
        {"\"exclusiveMaximum\":0", 0, 0, 1, 1, 0, 0},
        {"\"maximum\":0", 0, 0, 1, 0, 0, 0},
        {"\"minimum\":0.25,\"exclusiveMaximum\":0.75", 1, 0, 1, 1, 2500, 7500},
        {"\"minimum\":-0.001", 1, 0, 0, 0, -10, 0},
        {"\"minimum\":1.5,\"maximum\":1.50", 1, 0, 1, 0, 15000, 15000},
        {"\"minimum\":5,\"exclusiveMaximum\":12", 1, 0, 1, 1, 50000, 120000},
        {"\"minimum\":2,\"exclusiveMinimum\":2,\"maximum\":100", 1, 1, 1, 0, 20000, 1000000},
        {"\"minimum\":1,\"exclusiveMinimum\":true,\"maximum\":9.9,\"exclusiveMaximum\":false", 1, 1, 1, 0, 10000,
         99000},
        {"\"minimum\":1e-3,\"maximum\":1.2E1", 1, 0, 1, 0, 10, 120000},
        {"\"maximum\":-0.1,\"minimum\":-99.99", 1, 0, 1, 0, -999900, -1000},
        {"\"minimum\":0.1,\"maximum\":0.1001,\"exclusiveMaximum\":0.10010", 1, 0, 1, 1, 1000, 1001},
        {"\"minimum\":-5.05,\"exclusiveMaximum\":-5.0", 1, 0, 1, 1, -50500, -50000},
    };
    static const char *const ints[] = {"0", "00", "01", "1", "2", "5", "9", "10", "12", "99", "100", "123"};
    static const char *const fracs[] = {"",    ".",    ".0",   ".00", ".5",   ".05",  ".1",   ".25",  ".50",
                                        ".75", ".9",   ".99", ".999", ".001", ".0001", ".1001", ".101", ".2"};
    moeq_grammar_vocab *v = vocab();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char schema[256];
        snprintf(schema, sizeof schema, "{\"type\":\"number\",%s}", cases[c].bounds);
        moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, schema);
        int admitted = 0;
        for (int sign = 0; sign < 2; sign++)
            for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
                for (size_t f = 0; f < sizeof fracs / sizeof fracs[0]; f++) {
                    char text[32];
                    snprintf(text, sizeof text, "%s%s%s", sign ? "-" : "", ints[i], fracs[f]);
                    long long x = 0;
                    int want = canonical_number(text, &x);
                    if (want && cases[c].has_lo) want = cases[c].lo_strict ? x > cases[c].lo : x >= cases[c].lo;
                    if (want && cases[c].has_hi) want = cases[c].hi_strict ? x < cases[c].hi : x <= cases[c].hi;
                    int got = matches(g, text);
                    if (got != want) print_error("%s: '%s' admitted %d, want %d\n", schema, text, got, want);
                    assert_int_equal(got, want);
                    admitted += got;
                }
        assert_true(admitted > 0);
        assert_false(matches(g, "1e2")); /* bounded numbers are written without an exponent */
        char out[256];
        for (uint64_t seed = 1; seed <= 20; seed++) random_walk(g, seed, 40, out, sizeof out);
        moeq_grammar_release(g);
    }
    /* beside an exclusive bound at most 15 digits, so a reader's double stays strictly inside: 99.99999999999999
     * (16 digits) reads as 100.0; an inclusive bound needs no such cap (rounding keeps order) */
    static const struct {
        const char *schema, *text;
        int admitted;
    } digits[] = {
        {"{\"type\":\"number\",\"exclusiveMaximum\":100}", "99.9999999999999", 1},
        {"{\"type\":\"number\",\"exclusiveMaximum\":100}", "99.99999999999999", 0},
        {"{\"type\":\"number\",\"exclusiveMaximum\":100}", "-123456789012345", 1},
        {"{\"type\":\"number\",\"exclusiveMaximum\":100}", "-1234567890123456", 0},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0}", "0.000000000000001", 1},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0}", "0.0000000000000001", 0},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}", "0.999999999999999999", 0},
        {"{\"type\":\"number\",\"maximum\":100}", "99.99999999999999999", 1},
        {"{\"type\":\"number\",\"minimum\":0}", "12345678901234567890.5", 1},
    };
    for (size_t i = 0; i < sizeof digits / sizeof digits[0]; i++) {
        moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, digits[i].schema);
        if (matches(g, digits[i].text) != digits[i].admitted) print_error("%s: %s\n", digits[i].schema, digits[i].text);
        assert_int_equal(matches(g, digits[i].text), digits[i].admitted);
        moeq_grammar_release(g);
    }
    /* integers with fractional and exclusive bounds: [-2, 2] */
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                              "{\"type\":\"integer\",\"minimum\":-2.5,\"exclusiveMaximum\":3}");
    static const char *const in[] = {"-2", "-1", "0", "1", "2"}, *const out_of[] = {"-3", "3", "-0", "2.0", "1e0"};
    for (int i = 0; i < 5; i++) assert_true(matches(g, in[i]));
    for (int i = 0; i < 5; i++) assert_false(matches(g, out_of[i]));
    moeq_grammar_release(g);
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":2,\"maximum\":1.5}", MOEQ_ERR_FORMAT,
                 "minimum is above maximum");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"exclusiveMinimum\":1,\"maximum\":1}",
                 MOEQ_ERR_FORMAT, "no value is within the bounds");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":0.2,\"maximum\":0.8}",
                 MOEQ_ERR_FORMAT, "no integer is within the bounds");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"exclusiveMaximum\":true}", MOEQ_ERR_FORMAT,
                 "'exclusiveMaximum': true without the bound");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"exclusiveMinimum\":0.1234567890123456}",
                 MOEQ_ERR_UNSUPPORTED, "more than 15 significant digits");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA,
                 "{\"type\":\"number\",\"exclusiveMinimum\":999999999999999,\"maximum\":1e15}", MOEQ_ERR_FORMAT,
                 "no number of at most 15 digits");
    expect_error(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":1e-50}", MOEQ_ERR_UNSUPPORTED,
                 "more than 40 digits after the point");
    moeq_grammar_vocab_destroy(v);
}

/* \d \w \s read as ECMA-262 and as Python's re (jsonschema's) differ on Unicode: an output must match under both,
 * so \W, \D, \S and negated brackets leave out what either counts as a word character, digit or space, and \s
 * writes only the spaces both count (grammar_fuzz.py found "é" for "^\\W+$" and U+FEFF for "^[\\s\\d]+$"). */
static void class_escapes_match_under_ecma_and_python_alike(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    static const struct {
        const char *pattern, *text;
        int admitted;
    } cases[] = {
        {"^\\\\W$", "-", 1},           {"^\\\\W$", "\xc3\xa9", 0},          /* é: a word character to Python */
        {"^\\\\s$", " ", 1},           {"^\\\\s$", "\xe2\x80\x80", 1},      /* U+2000: a space to both */
        {"^\\\\s$", "\xef\xbb\xbf", 0}, /* U+FEFF: ECMA's, not Python's */
        {"^\\\\S$", "a", 1},           {"^\\\\S$", "\xe2\x80\x80", 0},      {"^\\\\S$", "\xef\xbb\xbf", 0},
        {"^\\\\S$", "\xc2\x85", 0},    /* U+0085: Python's, not ECMA's */
        {"^\\\\D$", "a", 1},           {"^\\\\D$", "\xd9\xa3", 0},          /* U+0663: a digit to Python */
        {"^[^\\\\d]$", "\xd9\xa3", 0}, {"^[^\\\\d]$", "\xc3\xa9", 1},       {"^[^\\\\w]$", "\xc3\xa9", 0},
        {"^[^\\\\w]$", "!", 1},        {"^[\\\\d]$", "\xd9\xa3", 0},        {"^\\\\d$", "7", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char schema[128], text[32];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"pattern\":\"%s\"}", cases[i].pattern);
        snprintf(text, sizeof text, "\"%s\"", cases[i].text);
        moeq_grammar *g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, schema);
        if (matches(g, text) != cases[i].admitted) print_error("%s: %s\n", schema, text);
        assert_int_equal(matches(g, text), cases[i].admitted);
        moeq_grammar_release(g);
    }
    moeq_grammar_vocab_destroy(v);
}

static void regex_and_choice_outputs_match_exactly(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    moeq_grammar *g = compile(v, MOEQ_GRAMMAR_REGEX, "(ab|[0-9]{2,3})+-?\\d");
    assert_true(matches(g, "ab123-4"));
    assert_true(matches(g, "12ab7"));
    assert_false(matches(g, "ab-"));
    char out[512];
    for (uint64_t s = 1; s < 30; s++) random_walk(g, s, 40, out, sizeof out);
    moeq_grammar_release(g);
    const char *choices[] = {"yes", "no", "not sure"};
    moeq_grammar_spec spec = {MOEQ_GRAMMAR_CHOICE, NULL, 0, choices, 3};
    assert_int_equal(moeq_grammar_compile(&spec, v, NULL, &g, NULL, 0), MOEQ_OK);
    for (uint64_t s = 1; s < 30; s++) {
        random_walk(g, s, 10, out, sizeof out);
        assert_true(!strcmp(out, "yes") || !strcmp(out, "no") || !strcmp(out, "not sure"));
    }
    moeq_grammar_release(g);
    g = compile(v, MOEQ_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]+$\"}");
    assert_true(matches(g, "\"AB-12\""));
    assert_false(matches(g, "\"AB-\""));
    moeq_grammar_release(g);
    moeq_grammar_vocab_destroy(v);
}

static void a_cached_grammar_is_compiled_once_and_shared(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    moeq_grammar_cache *c = NULL;
    assert_int_equal(moeq_grammar_cache_new(v, NULL, 2, &c, NULL, 0), MOEQ_OK);
    const char *a = "{\"type\":\"integer\"}", *b = "{\"type\":\"boolean\"}", *d = "{\"type\":\"null\"}";
    moeq_grammar_spec sa = {MOEQ_GRAMMAR_JSON_SCHEMA, a, strlen(a), NULL, 0}, sb = sa, sd = sa;
    sb.text = b, sb.text_len = strlen(b), sd.text = d, sd.text_len = strlen(d);
    moeq_grammar *g1, *g2, *g3, *g4;
    assert_int_equal(moeq_grammar_cache_get(c, &sa, &g1, NULL, 0), MOEQ_OK);
    assert_int_equal(moeq_grammar_cache_get(c, &sa, &g2, NULL, 0), MOEQ_OK);
    assert_ptr_equal(g1, g2);
    assert_int_equal(moeq_grammar_cache_get(c, &sb, &g3, NULL, 0), MOEQ_OK);
    assert_int_equal(moeq_grammar_cache_get(c, &sd, &g4, NULL, 0), MOEQ_OK); /* evicts b (least recent) */
    int64_t hits, misses;
    moeq_grammar_cache_counts(c, &hits, &misses);
    assert_int_equal(hits, 1);
    assert_int_equal(misses, 3);
    assert_true(matches(g1, "-17") && matches(g3, "false") && matches(g4, "null")); /* evicted g3 still alive */
    moeq_grammar_release(g1), moeq_grammar_release(g2), moeq_grammar_release(g3), moeq_grammar_release(g4);
    moeq_grammar_cache_destroy(c);
    moeq_grammar_vocab_destroy(v);
}

/* A byte budget over the kept grammars (they grow as outputs reach new states): past it, the least recently
 * used are released at the next get (never the one asked for); a released grammar lives on in its matchers. */
static void the_cache_keeps_its_grammars_within_a_byte_budget(void **state) {
    (void)state;
    moeq_grammar_vocab *v = vocab();
    moeq_grammar_cache *c = NULL;
    assert_int_equal(moeq_grammar_cache_new(v, NULL, 8, &c, NULL, 0), MOEQ_OK);
    const char *texts[3] = {"{\"type\":\"string\",\"maxLength\":300}", "{\"type\":\"integer\",\"maximum\":999}",
                            "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}"};
    moeq_grammar *g[3];
    moeq_grammar_spec spec = {MOEQ_GRAMMAR_JSON_SCHEMA, NULL, 0, NULL, 0};
    spec.text = texts[0], spec.text_len = strlen(texts[0]);
    assert_int_equal(moeq_grammar_cache_get(c, &spec, &g[0], NULL, 0), MOEQ_OK);
    char out[2048];
    for (uint64_t seed = 1; seed <= 10; seed++) random_walk(g[0], seed, 320, out, sizeof out); /* grows it */
    moeq_grammar_stats st;
    moeq_grammar_get_stats(g[0], &st);
    assert_true(st.bytes > 0);
    assert_int_equal(moeq_grammar_cache_bytes(c), st.bytes);
    moeq_grammar_cache_set_max_bytes(c, st.bytes + 1); /* room for the first alone */
    for (int i = 1; i < 3; i++) {
        spec.text = texts[i], spec.text_len = strlen(texts[i]);
        assert_int_equal(moeq_grammar_cache_get(c, &spec, &g[i], NULL, 0), MOEQ_OK);
    }
    assert_true(moeq_grammar_cache_bytes(c) <= st.bytes + 1); /* the first released; the others fit */
    spec.text = texts[2], spec.text_len = strlen(texts[2]);
    moeq_grammar *again;
    assert_int_equal(moeq_grammar_cache_get(c, &spec, &again, NULL, 0), MOEQ_OK);
    assert_ptr_equal(again, g[2]); /* the one asked for stays */
    spec.text = texts[0], spec.text_len = strlen(texts[0]);
    moeq_grammar *first;
    assert_int_equal(moeq_grammar_cache_get(c, &spec, &first, NULL, 0), MOEQ_OK);
    assert_ptr_not_equal(first, g[0]); /* compiled again */
    assert_true(matches(g[0], "\"abc\"")); /* the released one still works for its holder */
    int64_t hits, misses;
    moeq_grammar_cache_counts(c, &hits, &misses);
    assert_int_equal(hits, 1);
    assert_int_equal(misses, 4);
    for (int i = 0; i < 3; i++) moeq_grammar_release(g[i]);
    moeq_grammar_release(again), moeq_grammar_release(first);
    moeq_grammar_cache_destroy(c);
    moeq_grammar_vocab_destroy(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_outputs_of_a_schema_are_complete_within_their_budget),
        cmocka_unit_test(a_token_is_allowed_exactly_when_all_its_bytes_walk_the_automaton),
        cmocka_unit_test(a_tight_budget_allows_exactly_the_tokens_that_can_still_finish),
        cmocka_unit_test(alike_positions_share_masks_and_each_equals_the_byte_walk),
        cmocka_unit_test(an_unsupported_feature_is_an_error_naming_it_and_where),
        cmocka_unit_test(refs_and_single_all_of_compile_as_their_targets),
        cmocka_unit_test(recursive_refs_unroll_to_max_recursion_levels),
        cmocka_unit_test(all_of_merges_object_schemas),
        cmocka_unit_test(sets_and_tuples_compile),
        cmocka_unit_test(string_lengths_hold_with_and_without_patterns),
        cmocka_unit_test(maps_hold_their_values_and_bounds),
        cmocka_unit_test(enum_values_meet_the_schemas_other_keywords),
        cmocka_unit_test(one_of_compiles_when_its_branches_are_told_apart),
        cmocka_unit_test(number_bounds_admit_exactly_the_values_within_them),
        cmocka_unit_test(class_escapes_match_under_ecma_and_python_alike),
        cmocka_unit_test(regex_and_choice_outputs_match_exactly),
        cmocka_unit_test(a_cached_grammar_is_compiled_once_and_shared),
        cmocka_unit_test(the_cache_keeps_its_grammars_within_a_byte_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
