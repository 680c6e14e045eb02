/*
 * grammar_walk — random complete outputs of JSON Schemas, for tests/grammar_fuzz.py to validate with Python's
 * jsonschema. Reads one schema per line on stdin ("regex:" then a pattern: a response_format regex); writes
 * one JSON line per schema: {"i": N, "outputs": [...]}
 * (each output a random walk over the grammar's masks: a byte vocabulary plus multi-byte tokens that cross
 * the grammar's boundaries, ending at random where the grammar may end, always within the budget), or
 * {"i": N, "error": "...", "code": "..."} when the schema is refused.
 *
 *   grammar_walk [--walks N (6)] [--budget TOKENS (600)] [--seed S (1)] < schemas.jsonl
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/grammar.h"

static const char *const multi[] = {"{\"", "\":", ",\"", "\"}", "true", "false", "null", "12", "-3", "0.5",
                                    "\"a", "https://", "e\"", "]}", "[\"", "\xc3\xa9", "\xe6\x97\xa5",
                                    "\xf0\x9f\x98\x80", "\\n", "\\u00", "00", "99", "ab", ".com"};
#define N_MULTI (int)(sizeof multi / sizeof multi[0])
#define N_IDS (256 + N_MULTI)

static int token_bytes(void *ctx, int32_t id, const char **bytes, size_t *len) {
    static char single[256];
    (void)ctx;
    if (id < 256) {
        single[id] = (char)id;
        *bytes = &single[id];
        *len = 1;
        return 0;
    }
    *bytes = multi[id - 256];
    *len = strlen(multi[id - 256]);
    return 0;
}

static uint64_t rng(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* s as a JSON string (bytes >= 0x80 as they are: the grammar writes valid UTF-8). */
static void put_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

int main(int argc, char **argv) {
    int walks = 6, budget = 600;
    uint64_t seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--walks")) walks = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--budget")) budget = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
    }
    moeq_grammar_vocab *v = NULL;
    char err[512];
    if (moeq_grammar_vocab_new(N_IDS, token_bytes, NULL, &v, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    size_t cap = 1 << 20;
    char *line = malloc(cap), *out = malloc((size_t)budget * 16 + 16);
    uint32_t *bits = NULL;
    int32_t ids[N_IDS];
    for (int idx = 0; fgets(line, (int)cap, stdin); idx++) {
        size_t len = strcspn(line, "\n");
        line[len] = 0;
        int is_regex = !strncmp(line, "regex:", 6); /* a response_format regex: the whole output matches it */
        moeq_grammar_spec spec = {is_regex ? MOEQ_GRAMMAR_REGEX : MOEQ_GRAMMAR_JSON_SCHEMA, line + 6 * is_regex,
                                  len - 6 * (size_t)is_regex, NULL, 0};
        moeq_grammar *g = NULL;
        moeq_err e = moeq_grammar_compile(&spec, v, NULL, &g, err, sizeof err);
        if (e) {
            printf("{\"i\": %d, \"code\": \"%s\", \"error\": ", idx, moeq_err_str(e));
            put_json_string(err, strlen(err));
            printf("}\n");
            continue;
        }
        if (!bits) bits = calloc(moeq_grammar_mask_words(g), sizeof *bits);
        printf("{\"i\": %d, \"outputs\": [", idx);
        for (int w = 0; w < walks; w++) {
            moeq_grammar_matcher *m = NULL;
            moeq_grammar_matcher_new(g, &m);
            size_t n = 0;
            int done = 0;
            /* a regex's outputs stay short: Python's backtracking re checks them (a*a*a* is cubic in the length) */
            for (int left = is_regex && budget > 60 ? 60 : budget; left > 0 && !moeq_grammar_matcher_done(m); left--) {
                if (moeq_grammar_matcher_accepting(m) && rng(&seed) % 3 == 0) break;
                moeq_err me;
                int64_t k = moeq_grammar_matcher_mask(m, left, bits, &me);
                if (k <= 0) break;
                int c = 0;
                for (int id = 0; id < N_IDS; id++)
                    if (bits[id / 32] >> (id % 32) & 1) ids[c++] = id;
                int32_t t = ids[rng(&seed) % (uint64_t)c];
                const char *b;
                size_t bl;
                token_bytes(NULL, t, &b, &bl);
                memcpy(out + n, b, bl);
                n += bl;
                moeq_grammar_matcher_accept(m, t);
            }
            done = moeq_grammar_matcher_accepting(m);
            moeq_grammar_matcher_destroy(m);
            if (w) putchar(',');
            if (!done) printf("{\"incomplete\": ");
            put_json_string(out, n);
            if (!done) putchar('}');
        }
        printf("]}\n");
        fflush(stdout);
        moeq_grammar_release(g);
    }
    free(bits), free(line), free(out);
    moeq_grammar_vocab_destroy(v);
    return 0;
}
