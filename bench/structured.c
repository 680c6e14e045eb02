/*
 * bench-structured — what structured output costs (issue 17): per decode step, the decode processors of B
 * constrained jobs (copy of the row, grammar mask with the job's budget, applying it, advancing the matcher)
 * against the engine's decode step at the same batch, for three schemas (flat object, nested with arrays,
 * enum-heavy, length-bounded strings); and the compile time of each schema and of a ~2 KB one. Prints JSON.
 *
 *   bench-structured --model DIR [--batches 1,8,32] [--tokens N (96)] [--threads N] [--repeat R (5)]
 *
 * The model should be the `bench` preset (vocabulary 129,280, DeepSeek-V3's tokenizer): masks cost what the
 * vocabulary costs. Tokens are drawn uniformly among the allowed ones (a random model's babble: long strings
 * that the budget closes), so every job runs its whole budget through string, number and structure states.
 * "cold" is the first pass over fresh grammars (each new DFA state walks the vocabulary trie once); "warm"
 * the passes after it, with new jobs on the same cached grammars — the steady state of a worker whose
 * batches share a schema.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !__has_include("decode_proc.h") /* a build without the worker (MOEQ_CUDA_CHECK_ONLY): nothing to measure */
int main(void) {
    puts("{\"skipped\": \"built without the worker (decode_proc.h)\"}");
    return 0;
}
#else
#include "decode_proc.h"
#include "moeq/engine.h"
#include "moeq/grammar.h"
#include "moeq/tokenizer.h"
#include "moeq/util.h"

#define MAX_B 64

static const char *const FLAT =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"email\":{\"type\":\"string\","
    "\"format\":\"email\"},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"score\":{\"type\":"
    "\"number\"},\"active\":{\"type\":\"boolean\"},\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\","
    "\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"name\",\"age\",\"active\"],\"additionalProperties\":false}";

static const char *const NESTED =
    "{\"type\":\"object\",\"properties\":{\"document\":{\"type\":\"string\"},\"parties\":{\"type\":\"array\","
    "\"items\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"role\":{\"type\":\"string\"},"
    "\"addresses\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":"
    "\"string\"},\"country\":{\"type\":\"string\"}},\"required\":[\"street\"]},\"maxItems\":3}},\"required\":"
    "[\"name\"]},\"minItems\":1},\"amounts\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}},\"dates\":"
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"date\"},\"maxItems\":4}},\"required\":"
    "[\"document\",\"parties\"]}";

/* Length-bounded strings: a DFA state per character position (pydantic's HttpUrl; a bounded summary). */
static const char *const LONG_STRINGS =
    "{\"type\":\"object\",\"properties\":{\"source\":{\"type\":\"string\",\"format\":\"uri\",\"minLength\":1,"
    "\"maxLength\":2083},\"summary\":{\"type\":\"string\",\"maxLength\":2000}},\"required\":[\"source\","
    "\"summary\"]}";

/* Built at start: 6 properties, each an enum of 40 labels. */
static char ENUMS[16384];

static void build_enum_schema(void) {
    size_t n = (size_t)snprintf(ENUMS, sizeof ENUMS, "{\"type\":\"object\",\"properties\":{");
    for (int p = 0; p < 6; p++) {
        n += (size_t)snprintf(ENUMS + n, sizeof ENUMS - n, "%s\"field_%d\":{\"enum\":[", p ? "," : "", p);
        for (int v = 0; v < 40; v++)
            n += (size_t)snprintf(ENUMS + n, sizeof ENUMS - n, "%s\"category_%d_label_%02d\"", v ? "," : "", p, v);
        n += (size_t)snprintf(ENUMS + n, sizeof ENUMS - n, "]}");
    }
    snprintf(ENUMS + n, sizeof ENUMS - n, "},\"required\":[\"field_0\",\"field_1\",\"field_2\"]}");
}

/* ~2 KB: 32 properties of mixed types (the compile target). */
static char TWO_KB[4096];

static void build_2kb_schema(void) {
    static const char *const types[] = {"{\"type\":\"string\",\"maxLength\":64}", "{\"type\":\"integer\","
                                        "\"minimum\":0,\"maximum\":100000}", "{\"type\":\"number\"}",
                                        "{\"enum\":[\"low\",\"medium\",\"high\",\"critical\"]}",
                                        "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":8}",
                                        "{\"type\":\"string\",\"format\":\"date\"}"};
    size_t n = (size_t)snprintf(TWO_KB, sizeof TWO_KB, "{\"type\":\"object\",\"properties\":{");
    for (int p = 0; p < 32; p++)
        n += (size_t)snprintf(TWO_KB + n, sizeof TWO_KB - n, "%s\"extracted_field_name_%02d\":%s", p ? "," : "", p,
                              types[p % 6]);
    snprintf(TWO_KB + n, sizeof TWO_KB - n, "},\"required\":[\"extracted_field_name_00\",\"extracted_field_name_03\"],"
                                            "\"additionalProperties\":false}");
}

typedef struct bench {
    moeq_model *model;
    moeq_engine *engine;
    moeq_tokenizer *tok;
    moeq_grammar_vocab *gvocab;
    int vocab, eos, tokens, repeat, threads;
    float *logits, *work;
} bench;

static int grammar_token(void *ctx, int32_t id, const char **bytes, size_t *len) {
    const bench *b = ctx;
    if (id == b->eos) return -1;
    return moeq_tokenizer_token_bytes(b->tok, id, bytes, len) == 0 ? 0 : -1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? v[n / 2] : 0;
}

/* Median ms of one decode step of B sequences (short prompts, then `tokens` decode steps). */
static double decode_step_ms(bench *b, int B) {
    int seqs[MAX_B];
    int32_t prompt[8], next[MAX_B];
    moeq_step_item items[MAX_B];
    char err[256];
    for (int i = 0; i < B; i++) {
        moeq_engine_seq_new(b->engine, &seqs[i]);
        for (int t = 0; t < 8; t++) prompt[t] = (int32_t)((t * 131 + i * 17 + 3) % b->vocab);
        items[0] = (moeq_step_item){seqs[i], prompt, 8, 0};
        moeq_engine_step(b->engine, items, 1, b->logits, 1, err, sizeof err);
        next[i] = (int32_t)((i * 7 + 1) % b->vocab);
    }
    int n = b->tokens < 24 ? b->tokens : 24;
    double *ms = malloc(sizeof(double) * (size_t)n);
    for (int s = 0; s < n; s++) {
        for (int i = 0; i < B; i++) items[i] = (moeq_step_item){seqs[i], &next[i], 1, 0};
        int64_t t0 = moeq_mono_ns();
        if (moeq_engine_step(b->engine, items, B, b->logits, (size_t)B, err, sizeof err)) {
            fprintf(stderr, "step: %s\n", err);
            break;
        }
        ms[s] = (double)(moeq_mono_ns() - t0) / 1e6;
    }
    double m = median(ms, n);
    free(ms);
    for (int i = 0; i < B; i++) moeq_engine_seq_free(b->engine, seqs[i]);
    return m;
}

static uint64_t rng(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* A token uniformly among the row's finite entries (not timed: the sampler's own cost is not the mask's). */
static int32_t pick(const float *row, int V, uint64_t *seed) {
    int32_t chosen = 0;
    uint64_t n = 0;
    for (int32_t t = 0; t < V; t++)
        if (row[t] != -INFINITY && rng(seed) % ++n == 0) chosen = t;
    return chosen;
}

typedef struct pass_stats {
    double ms_per_step;  /* processor time of B jobs per step */
    double max_job_us;   /* the slowest single draw            */
    int steps;
} pass_stats;

/*
 * B jobs on grammar g for `tokens` steps; a job that completes, or has drawn `tokens`, is replaced by a new
 * one. budget: each job's max_new_tokens. A generous budget is the common case (an output ends long before
 * it); a tight one (the shortest output + 16 bytes) makes every step of a job walk the vocabulary for the
 * tokens that still fit — the cost of the last tokens of a job that runs into its budget.
 */
static pass_stats one_pass(bench *b, moeq_grammar *g, int B, uint64_t seed, int budget) {
    moeq_decode_proc *procs[MAX_B];
    moeq_decode_proc_params pp = {.grammar = g, .eos_ids = &b->eos, .n_eos = b->eos >= 0,
                                  .max_new_tokens = budget};
    for (int i = 0; i < B; i++) moeq_decode_proc_new(&pp, b->vocab, &procs[i], NULL, 0);
    pass_stats st = {0, 0, b->tokens};
    double total_ns = 0;
    for (int s = 0; s < b->tokens; s++)
        for (int i = 0; i < B; i++) {
            if (moeq_decode_proc_complete_at(procs[i]) || moeq_decode_proc_n_drawn(procs[i]) >= b->tokens ||
                moeq_decode_proc_n_drawn(procs[i]) >= budget) {
                moeq_decode_proc_destroy(procs[i]); /* a finished job: the next one takes its place */
                moeq_decode_proc_new(&pp, b->vocab, &procs[i], NULL, 0);
            }
            const float *row = b->logits + (size_t)(i % 8) * b->vocab;
            moeq_sampler_hook h = moeq_decode_proc_hook(procs[i]);
            int64_t t0 = moeq_mono_ns();
            memcpy(b->work, row, sizeof(float) * (size_t)b->vocab); /* the sampler's copy */
            h.process(h.ctx, row, b->work, b->vocab);
            int64_t t1 = moeq_mono_ns();
            int32_t t = pick(b->work, b->vocab, &seed);
            int64_t t2 = moeq_mono_ns();
            h.accept(h.ctx, row, t);
            int64_t t3 = moeq_mono_ns();
            double ns = (double)(t1 - t0 + t3 - t2);
            total_ns += ns;
            if (ns / 1e3 > st.max_job_us) st.max_job_us = ns / 1e3;
        }
    for (int i = 0; i < B; i++) moeq_decode_proc_destroy(procs[i]);
    st.ms_per_step = total_ns / 1e6 / b->tokens;
    return st;
}

static double compile_ms(bench *b, const char *schema, moeq_grammar_stats *stats) {
    double ms[9];
    for (int r = 0; r < 9; r++) {
        moeq_grammar_spec spec = {MOEQ_GRAMMAR_JSON_SCHEMA, schema, strlen(schema), NULL, 0};
        moeq_grammar *g = NULL;
        char err[256] = "";
        int64_t t0 = moeq_mono_ns();
        if (moeq_grammar_compile(&spec, b->gvocab, NULL, &g, err, sizeof err)) {
            fprintf(stderr, "compile: %s\n", err);
            return -1;
        }
        ms[r] = (double)(moeq_mono_ns() - t0) / 1e6;
        moeq_grammar_get_stats(g, stats);
        moeq_grammar_release(g);
    }
    return median(ms, 9);
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (s && *s && n < max) {
        out[n++] = atoi(s);
        s = strchr(s, ',');
        if (s) s++;
    }
    return n;
}

int main(int argc, char **argv) {
    bench b = {0};
    const char *model = NULL, *batches = "1,8,32";
    b.tokens = 96, b.repeat = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--batches")) batches = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens")) b.tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) b.threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--repeat")) b.repeat = atoi(argv[i + 1]);
    }
    int Bs[8], nB = parse_list(batches, Bs, 8);
    char err[512] = "";
    if (!model) return fprintf(stderr, "usage: bench-structured --model DIR [--batches 1,8,32] [--tokens N]\n"), 2;
    if (moeq_model_load(model, NULL, &b.model, err, sizeof err) || moeq_tokenizer_load(model, &b.tok, err, sizeof err))
        return fprintf(stderr, "bench-structured: %s\n", err), 1;
    moeq_engine_params ep = moeq_engine_default_params();
    ep.max_seqs = MAX_B;
    ep.n_threads = b.threads;
    if (moeq_engine_new(b.model, &ep, &b.engine, err, sizeof err)) return fprintf(stderr, "engine: %s\n", err), 1;
    b.vocab = moeq_model_get_config(b.model)->vocab_size;
    b.eos = moeq_tokenizer_eos_id(b.tok);
    b.logits = calloc((size_t)MAX_B * (size_t)b.vocab, sizeof(float));
    b.work = malloc(sizeof(float) * (size_t)b.vocab);
    int64_t t0 = moeq_mono_ns();
    if (moeq_grammar_vocab_new(b.vocab, grammar_token, &b, &b.gvocab, err, sizeof err))
        return fprintf(stderr, "vocab: %s\n", err), 1;
    double vocab_ms = (double)(moeq_mono_ns() - t0) / 1e6;
    build_enum_schema();
    build_2kb_schema();
    const char *names[] = {"flat_object", "nested_arrays", "enum_heavy", "long_strings"};
    const char *schemas[] = {FLAT, NESTED, ENUMS, LONG_STRINGS};
    const int n_schemas = 4;
    printf("{\n  \"model\": \"%s\", \"vocab\": %d, \"tokens_per_job\": %d, \"vocab_trie_ms\": %.1f,\n", model, b.vocab,
           b.tokens, vocab_ms);
    moeq_grammar_stats st;
    double c2k = compile_ms(&b, TWO_KB, &st);
    printf("  \"compile_2kb\": {\"bytes\": %zu, \"ms\": %.3f, \"nfa_states\": %d},\n", strlen(TWO_KB), c2k,
           st.nfa_states);
    double step_ms[8];
    for (int k = 0; k < nB; k++) step_ms[k] = decode_step_ms(&b, Bs[k]);
    printf("  \"decode_step_ms\": {");
    for (int k = 0; k < nB; k++) printf("%s\"%d\": %.2f", k ? ", " : "", Bs[k], step_ms[k]);
    printf("},\n  \"schemas\": [\n");
    for (int s = 0; s < n_schemas; s++) {
        double cms = compile_ms(&b, schemas[s], &st);
        printf("    {\"name\": \"%s\", \"bytes\": %zu, \"compile_ms\": %.3f, \"nfa_states\": %d, \"batches\": [\n",
               names[s], strlen(schemas[s]), cms, st.nfa_states);
        for (int k = 0; k < nB; k++) {
            moeq_grammar *g = NULL;
            moeq_grammar_spec spec = {MOEQ_GRAMMAR_JSON_SCHEMA, schemas[s], strlen(schemas[s]), NULL, 0};
            moeq_grammar_compile(&spec, b.gvocab, NULL, &g, NULL, 0);
            moeq_grammar_get_stats(g, &st);
            int tight = st.min_bytes + 16;
            pass_stats cold = one_pass(&b, g, Bs[k], 1, 4096);
            double warm[16];
            double worst = 0;
            for (int r = 0; r < b.repeat && r < 16; r++) {
                pass_stats w = one_pass(&b, g, Bs[k], 100 + (uint64_t)r, 4096);
                warm[r] = w.ms_per_step;
                if (w.max_job_us > worst) worst = w.max_job_us;
            }
            double wm = median(warm, b.repeat < 16 ? b.repeat : 16);
            pass_stats tail = one_pass(&b, g, Bs[k], 7, tight);
            moeq_grammar_get_stats(g, &st);
            printf("      {\"batch\": %d, \"mask_ms_per_step_cold\": %.3f, \"mask_ms_per_step_warm\": %.3f, "
                   "\"fraction_of_decode_step_warm\": %.4f, \"fraction_cold\": %.4f, \"per_job_us_warm\": %.1f, "
                   "\"slowest_draw_us\": %.0f, \"tight_budget_ms_per_step\": %.3f, \"tight_fraction\": %.4f, "
                   "\"dfa_states\": %d, \"cached_masks\": %d}%s\n",
                   Bs[k], cold.ms_per_step, wm, wm / step_ms[k], cold.ms_per_step / step_ms[k], wm * 1e3 / Bs[k],
                   worst, tail.ms_per_step, tail.ms_per_step / step_ms[k], st.dfa_states, st.masks,
                   k + 1 < nB ? "," : "");
            moeq_grammar_release(g);
        }
        printf("    ]}%s\n", s < n_schemas - 1 ? "," : "");
    }
    printf("  ]\n}\n");
    moeq_grammar_vocab_destroy(b.gvocab);
    moeq_engine_destroy(b.engine);
    moeq_tokenizer_destroy(b.tok);
    moeq_model_destroy(b.model);
    free(b.logits), free(b.work);
    return 0;
}
#endif
