/*
 * structured_run.c — the structured-output corpus driver (tests/structured_corpus.py runs it): generate one
 * constrained output per entry of a corpus file on a test checkpoint, the way the worker does (engine steps,
 * a seeded sampler per job with the job's decode processor as its hook, the scheduler's end rules: grammar
 * complete -> stop, end-of-sequence -> stop_token, budget -> length), and write one JSON line per entry.
 *
 *   structured_run MODEL_DIR CORPUS.json OUT.jsonl [--batch B] [--mtp K] [--max-new N] [--temperature T]
 *
 * --batch B: B jobs run together in every step (continuous batching as in the worker, finished ones leave);
 * --mtp K: speculative rounds in exact mode (moeq_mtp_decode_step with the job's sampler). The python test
 * compares the token lists of these modes with the plain ones and validates every text with jsonschema.
 * Each corpus entry: {"kind": "json_schema"|"json_object"|"regex"|"choice", "schema"|"pattern"|"choices",
 * optional "max_new_tokens", "logprobs", "top_logprobs", "min_tokens", "stop_token_ids", penalties}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "decode_proc.h"
#include "moeq/engine.h"
#include "moeq/grammar.h"
#include "moeq/tokenizer.h"

#define MAX_BATCH 64

typedef struct run {
    moeq_model *model;
    moeq_engine *engine;
    moeq_tokenizer *tok;
    moeq_grammar_vocab *gvocab;
    moeq_grammar_cache *cache;
    moeq_mtp_decoder *mtp;
    int vocab, eos, mtp_k, max_new;
    long long drafted, accepted;
    double temperature;
    float *logits;
} run;

typedef struct job {
    int index, seq, done, n_out, max_new;
    const char *finish;
    moeq_sampler *sampler;
    moeq_decode_proc *proc;
    moeq_grammar *grammar;
    int32_t prompt[12], *out, next;
    char err[256];
} job;

static int grammar_token(void *ctx, int32_t id, const char **bytes, size_t *len) {
    const run *r = ctx;
    if (id == r->eos) return -1;
    return moeq_tokenizer_token_bytes(r->tok, id, bytes, len) == 0 ? 0 : -1;
}

static int die(const char *what, const char *err) {
    fprintf(stderr, "structured_run: %s: %s\n", what, err);
    return 2;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static double num(const cJSON *e, const char *k, double def) {
    const cJSON *x = cJSON_GetObjectItem(e, k);
    return cJSON_IsNumber(x) ? x->valuedouble : def;
}

/* Compile the entry's grammar (through the cache, as the worker) and make its sampler and processor. */
static int job_open(run *r, job *j, const cJSON *e, int index) {
    memset(j, 0, sizeof *j);
    j->index = index;
    j->max_new = (int)num(e, "max_new_tokens", r->max_new);
    j->out = calloc((size_t)j->max_new + 1, sizeof *j->out);
    const char *kind = cJSON_GetObjectItem(e, "kind")->valuestring;
    char *text = NULL;
    const char *choices[256];
    moeq_grammar_spec spec = {0};
    if (!strcmp(kind, "json_schema")) {
        text = cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "schema"));
        spec = (moeq_grammar_spec){MOEQ_GRAMMAR_JSON_SCHEMA, text, strlen(text), NULL, 0};
    } else if (!strcmp(kind, "json_object")) {
        spec.kind = MOEQ_GRAMMAR_JSON_OBJECT;
    } else if (!strcmp(kind, "regex")) {
        const char *p = cJSON_GetObjectItem(e, "pattern")->valuestring;
        spec = (moeq_grammar_spec){MOEQ_GRAMMAR_REGEX, p, strlen(p), NULL, 0};
    } else if (!strcmp(kind, "choice")) {
        const cJSON *c;
        size_t n = 0;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(e, "choices")) if (n < 256) choices[n++] = c->valuestring;
        spec = (moeq_grammar_spec){MOEQ_GRAMMAR_CHOICE, NULL, 0, choices, n};
    }
    if (spec.kind && moeq_grammar_cache_get(r->cache, &spec, &j->grammar, j->err, sizeof j->err)) {
        free(text);
        j->done = 1, j->finish = "rejected";
        return 0;
    }
    free(text);
    moeq_grammar_stats st;
    moeq_grammar_get_stats(j->grammar, &st);
    int room = moeq_engine_max_model_len(r->engine) - 12;
    if (j->max_new > room) j->max_new = room;
    if (j->grammar && j->max_new < st.min_bytes + 16 && st.min_bytes + 16 <= room) { /* a job must be able to finish (as a producer sizes it) */
        free(j->out);
        j->max_new = st.min_bytes + 16;
        j->out = calloc((size_t)j->max_new + 1, sizeof *j->out);
    }
    int32_t stops[16];
    int n_stops = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(e, "stop_token_ids")) if (n_stops < 16) stops[n_stops++] = c->valueint;
    for (int i = 0; i < 12; i++) j->prompt[i] = (int32_t)((i * 37 + index * 101 + 5) % r->vocab);
    moeq_decode_proc_params pp = {.grammar = j->grammar, .eos_ids = &r->eos, .n_eos = r->eos >= 0,
                                  .stop_token_ids = stops, .n_stop_token_ids = n_stops, .max_new_tokens = j->max_new,
                                  .min_tokens = (int)num(e, "min_tokens", 0),
                                  .repetition_penalty = num(e, "repetition_penalty", 1.0),
                                  .presence_penalty = num(e, "presence_penalty", 0),
                                  .frequency_penalty = num(e, "frequency_penalty", 0), .prompt = j->prompt,
                                  .n_prompt = 12, .logprobs = cJSON_IsTrue(cJSON_GetObjectItem(e, "logprobs")),
                                  .top_logprobs = (int)num(e, "top_logprobs", 0)};
    moeq_sampling_params sp = moeq_sampling_default_params();
    sp.temperature = num(e, "temperature", r->temperature);
    sp.seed = 1000 + (uint64_t)index;
    if (moeq_sampler_new(&sp, r->vocab, &j->sampler)) return -1;
    if (moeq_decode_proc_needed(&pp)) {
        if (moeq_decode_proc_new(&pp, r->vocab, &j->proc, j->err, sizeof j->err)) return -1;
        moeq_sampler_hook hook = moeq_decode_proc_hook(j->proc);
        moeq_sampler_set_hook(j->sampler, &hook);
    }
    if (moeq_engine_seq_new(r->engine, &j->seq)) return -1;
    if (r->mtp && moeq_engine_seq_set_mtp(r->engine, j->seq, 1)) return -1;
    return 0;
}

/* The scheduler's rules, one token at a time. */
static void take(run *r, job *j, const cJSON *e, int32_t t) {
    if (j->done) return;
    if (t < 0) {
        j->done = 1, j->finish = "error";
        return;
    }
    j->out[j->n_out++] = t;
    j->next = t;
    int complete = j->proc && moeq_decode_proc_complete_at(j->proc) > 0 && j->n_out >= moeq_decode_proc_complete_at(j->proc);
    int stop_id = t == r->eos;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(e, "stop_token_ids")) stop_id |= c->valueint == t;
    if (stop_id) j->done = 1, j->finish = complete ? "stop" : "stop_token";
    else if (complete) j->done = 1, j->finish = "stop";
    else if (j->n_out >= j->max_new) j->done = 1, j->finish = "length";
}

static int prefill(run *r, job *jobs, int n, const cJSON *const *entries) {
    moeq_step_item items[MAX_BATCH];
    char err[256];
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!jobs[i].done) items[m++] = (moeq_step_item){jobs[i].seq, jobs[i].prompt, 12, 0};
    if (m && moeq_engine_step(r->engine, items, m, r->logits, (size_t)m, err, sizeof err)) return die("prefill", err);
    for (int i = 0, row = 0; i < n; i++)
        if (!jobs[i].done) take(r, &jobs[i], entries[i], moeq_sampler_sample(jobs[i].sampler, r->logits + (size_t)row++ * r->vocab));
    return 0;
}

static int decode_plain(run *r, job *jobs, int n, const cJSON *const *entries) {
    moeq_step_item items[MAX_BATCH];
    char err[256];
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!jobs[i].done) items[m++] = (moeq_step_item){jobs[i].seq, &jobs[i].next, 1, 0};
    if (!m) return 1;
    if (moeq_engine_step(r->engine, items, m, r->logits, (size_t)m, err, sizeof err)) return die("step", err);
    for (int i = 0, row = 0; i < n; i++)
        if (!jobs[i].done) take(r, &jobs[i], entries[i], moeq_sampler_sample(jobs[i].sampler, r->logits + (size_t)row++ * r->vocab));
    return 0;
}

static int decode_mtp(run *r, job *jobs, int n, const cJSON *const *entries) {
    moeq_spec_seq spec[MAX_BATCH];
    int who[MAX_BATCH], m = 0;
    char err[256];
    for (int i = 0; i < n; i++) {
        if (jobs[i].done) continue;
        int left = jobs[i].max_new - jobs[i].n_out, k = r->mtp_k < left - 1 ? r->mtp_k : left - 1;
        spec[m] = (moeq_spec_seq){.seq_id = jobs[i].seq, .next_token = jobs[i].next, .k = k > 0 ? k : 0,
                                  .sampling = moeq_sampling_default_params(), .sampler = jobs[i].sampler};
        who[m++] = i;
    }
    if (!m) return 1;
    if (moeq_mtp_decode_step(r->mtp, spec, m, err, sizeof err)) return die("mtp round", err);
    for (int s = 0; s < m; s++) {
        r->drafted += spec[s].k, r->accepted += spec[s].n_out - 1;
        for (int t = 0; t < spec[s].n_out; t++) take(r, &jobs[who[s]], entries[who[s]], spec[s].out[t]);
    }
    return 0;
}

static void write_job(run *r, FILE *f, const job *j) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "i", j->index);
    const char *finish = j->finish ? j->finish : "unfinished";
    cJSON_AddStringToObject(o, "finish", finish);
    if (j->err[0]) cJSON_AddStringToObject(o, "error", j->err);
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    int n_text = j->n_out;
    if (n_text && (!strcmp(finish, "stop_token") || (!strcmp(finish, "stop") && j->out[n_text - 1] == r->eos)))
        n_text--; /* a final stop id is in tokens, not in the text */
    for (int i = 0; i < j->n_out; i++) cJSON_AddItemToArray(toks, cJSON_CreateNumber(j->out[i]));
    char *text = NULL;
    size_t len = 0;
    if (moeq_tokenizer_decode(r->tok, j->out, (size_t)n_text, MOEQ_DECODE_SKIP_SPECIAL, &text, &len, NULL, 0) == 0)
        cJSON_AddStringToObject(o, "text", text);
    free(text);
    if (j->proc) {
        cJSON *lps = cJSON_AddArrayToObject(o, "logprobs");
        moeq_logprob lp;
        for (int i = 0; i < j->n_out && moeq_decode_proc_logprob(j->proc, i, &lp) == 0; i++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "token", lp.token);
            cJSON_AddNumberToObject(x, "logprob", lp.logprob);
            cJSON *top = cJSON_AddArrayToObject(x, "top");
            for (int k = 0; k < lp.n_top; k++) {
                cJSON *y = cJSON_CreateArray();
                cJSON_AddItemToArray(y, cJSON_CreateNumber(lp.top_tokens[k]));
                cJSON_AddItemToArray(y, cJSON_CreateNumber(lp.top_logprobs[k]));
                cJSON_AddItemToArray(top, y);
            }
            cJSON_AddItemToArray(lps, x);
        }
    }
    char *line = cJSON_PrintUnformatted(o);
    fprintf(f, "%s\n", line);
    free(line);
    cJSON_Delete(o);
}

static void job_close(run *r, job *j) {
    if (j->seq >= 0 && j->sampler) moeq_engine_seq_free(r->engine, j->seq);
    moeq_sampler_destroy(j->sampler);
    moeq_decode_proc_destroy(j->proc);
    moeq_grammar_release(j->grammar);
    free(j->out);
}

static int run_group(run *r, const cJSON *const *entries, int n, int first, FILE *out) {
    job jobs[MAX_BATCH];
    for (int i = 0; i < n; i++)
        if (job_open(r, &jobs[i], entries[i], first + i)) return die("job", jobs[i].err);
    int rc = prefill(r, jobs, n, entries);
    while (rc == 0) rc = r->mtp ? decode_mtp(r, jobs, n, entries) : decode_plain(r, jobs, n, entries);
    for (int i = 0; i < n; i++) {
        write_job(r, out, &jobs[i]);
        job_close(r, &jobs[i]);
    }
    return rc > 1 ? rc : 0;
}

int main(int argc, char **argv) {
    if (argc < 4) return die("usage", "MODEL_DIR CORPUS.json OUT.jsonl [--batch B] [--mtp K] [--max-new N]");
    run r = {0};
    int batch = 1;
    r.max_new = 160, r.temperature = 1.0;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--mtp")) r.mtp_k = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-new")) r.max_new = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--temperature")) r.temperature = atof(argv[i + 1]);
    }
    if (batch < 1 || batch > MAX_BATCH) return die("--batch", "1..64");
    char err[512] = "";
    if (moeq_model_load(argv[1], NULL, &r.model, err, sizeof err)) return die("model", err);
    if (moeq_tokenizer_load(argv[1], &r.tok, err, sizeof err)) return die("tokenizer", err);
    moeq_engine_params ep = moeq_engine_default_params();
    ep.max_seqs = batch;
    ep.n_threads = 1;
    if (moeq_engine_new(r.model, &ep, &r.engine, err, sizeof err)) return die("engine", err);
    r.vocab = moeq_model_get_config(r.model)->vocab_size;
    r.eos = moeq_tokenizer_eos_id(r.tok);
    if (r.mtp_k && moeq_mtp_decoder_new(r.engine, batch, r.mtp_k, &r.mtp, err, sizeof err)) return die("mtp", err);
    if (moeq_grammar_vocab_new(r.vocab, grammar_token, &r, &r.gvocab, err, sizeof err) ||
        moeq_grammar_cache_new(r.gvocab, NULL, 256, &r.cache, err, sizeof err))
        return die("grammar", err);
    r.logits = malloc((size_t)batch * (size_t)r.vocab * sizeof(float));
    char *text = read_file(argv[2]);
    cJSON *corpus = text ? cJSON_Parse(text) : NULL;
    FILE *out = fopen(argv[3], "w");
    if (!corpus || !out || !r.logits) return die("corpus/out", argv[2]);
    int n = cJSON_GetArraySize(corpus), rc = 0;
    const cJSON *entries[MAX_BATCH];
    for (int first = 0; first < n && rc == 0; first += batch) {
        int m = n - first < batch ? n - first : batch;
        for (int i = 0; i < m; i++) entries[i] = cJSON_GetArrayItem(corpus, first + i);
        rc = run_group(&r, entries, m, first, out);
    }
    fclose(out);
    if (r.mtp) fprintf(stderr, "structured_run: mtp drafted %lld accepted %lld (%.1f %%)\n", r.drafted, r.accepted,
                       r.drafted ? 100.0 * (double)r.accepted / (double)r.drafted : 0.0);
    cJSON_Delete(corpus);
    free(text);
    free(r.logits);
    moeq_grammar_cache_destroy(r.cache);
    moeq_grammar_vocab_destroy(r.gvocab);
    moeq_mtp_decoder_destroy(r.mtp);
    moeq_engine_destroy(r.engine);
    moeq_tokenizer_destroy(r.tok);
    moeq_model_destroy(r.model);
    return rc;
}
