/*
 * bench/mtp.c — `bench-mtp --model DIR`: greedy decode tokens/s with MTP
 * speculative decoding off (k = 0: plain steps, sequences not marked) and on
 * (k = 1, 2, 3) at batch 1, 8 and 32; the measured acceptance rate; the
 * tokens each round yields (= the speedup drafting and verifying would give
 * at zero overhead); and the measured speedup over k = 0. Prints JSON.
 *
 * Each run: B sequences with 16-token prompts, one batched prefill, then
 * rounds until every sequence has `--tokens` new tokens; timed from the
 * first round (a warm-up round before). Use a checkpoint with an MTP layer:
 * `moeq gen-model --preset bench-mtp` (agrees by construction) or `bench`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/engine.h"
#include "moeq/util.h"

typedef struct args {
    const char *model;
    int n_threads, tokens, prompt;
    int batches[8], n_batches, ks[8], n_ks;
} args;

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    for (char *end; *s && n < max; s = *end ? end + 1 : end) {
        out[n++] = (int)strtol(s, &end, 10);
        if (end == s) return -1;
    }
    return n;
}

static int parse(int argc, char **argv, args *a) {
    *a = (args){.tokens = 48, .prompt = 16, .batches = {1, 8, 32}, .n_batches = 3, .ks = {0, 1, 2, 3}, .n_ks = 4};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--model")) a->model = v;
        else if (!strcmp(k, "--threads")) a->n_threads = atoi(v);
        else if (!strcmp(k, "--tokens")) a->tokens = atoi(v);
        else if (!strcmp(k, "--batches")) a->n_batches = parse_list(v, a->batches, 8);
        else if (!strcmp(k, "--ks")) a->n_ks = parse_list(v, a->ks, 8);
        else return -1;
    }
    return a->model && a->n_batches > 0 && a->n_ks > 0 && a->tokens > 0 ? 0 : -1;
}

typedef struct result {
    double tps, tokens_per_round;
    int64_t drafted, accepted, tokens, rounds;
} result;

static int32_t argmax(const float *row, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++) b = row[i] > row[b] ? i : b;
    return b;
}

/* One (batch, k) run on a fresh engine. */
static int run(const moeq_model *model, const args *a, int B, int k, result *r) {
    const moeq_model_config *c = moeq_model_get_config(model);
    moeq_engine_params p = moeq_engine_default_params();
    p.n_threads = a->n_threads;
    p.max_seqs = B;
    p.max_step_tokens = B * (a->prompt > MOEQ_MTP_MAX_K + 1 ? a->prompt : MOEQ_MTP_MAX_K + 1);
    p.kv_cache_tokens = (int64_t)B * (a->prompt + a->tokens + 2 * MOEQ_MTP_MAX_K + 16);
    moeq_engine *e = NULL;
    moeq_mtp_decoder *dec = NULL;
    char err[512] = "";
    int rc = 1;
    moeq_spec_seq *seqs = calloc((size_t)B, sizeof *seqs);
    moeq_step_item *items = calloc((size_t)B, sizeof *items);
    int32_t *ids = malloc((size_t)B * a->prompt * sizeof(int32_t));
    float *logits = malloc((size_t)B * c->vocab_size * sizeof(float));
    int64_t *got = calloc((size_t)B, sizeof(int64_t));
    if (!seqs || !items || !ids || !logits || !got) goto free_all;
    if (moeq_engine_new(model, &p, &e, err, sizeof err)) goto fail;
    if (k > 0 && moeq_mtp_decoder_new(e, B, k, &dec, err, sizeof err)) goto fail;
    for (int b = 0; b < B; b++) {
        if (moeq_engine_seq_new(e, &seqs[b].seq_id)) goto fail;
        if (k > 0 && moeq_engine_seq_set_mtp(e, seqs[b].seq_id, 1)) goto fail;
        for (int i = 0; i < a->prompt; i++) ids[b * a->prompt + i] = (int32_t)((i * 37 + b * 101 + 5) % c->vocab_size);
        items[b] = (moeq_step_item){seqs[b].seq_id, ids + b * a->prompt, a->prompt, 0};
        seqs[b].sampling = moeq_sampling_default_params();
    }
    if (moeq_engine_step(e, items, B, logits, (size_t)B, err, sizeof err)) goto fail;
    for (int b = 0; b < B; b++) seqs[b].next_token = argmax(logits + (size_t)b * c->vocab_size, c->vocab_size);
    int64_t t0 = 0;
    for (int round = 0;; round++) {
        if (round == 1) { /* round 0 warms up */
            t0 = moeq_mono_ns();
            memset(r, 0, sizeof *r);
            for (int b = 0; b < B; b++) got[b] = 0, seqs[b].drafted = seqs[b].accepted = 0;
        }
        int done = round > 0;
        for (int b = 0; b < B; b++) done &= got[b] >= a->tokens;
        if (done) break;
        if (k == 0) {
            for (int b = 0; b < B; b++) items[b] = (moeq_step_item){seqs[b].seq_id, &seqs[b].next_token, 1, 0};
            if (moeq_engine_step(e, items, B, logits, (size_t)B, err, sizeof err)) goto fail;
            for (int b = 0; b < B; b++) {
                seqs[b].next_token = argmax(logits + (size_t)b * c->vocab_size, c->vocab_size);
                got[b]++;
            }
        } else {
            for (int b = 0; b < B; b++) seqs[b].k = k;
            if (moeq_mtp_decode_step(dec, seqs, B, err, sizeof err)) goto fail;
            for (int b = 0; b < B; b++) got[b] += seqs[b].n_out;
        }
        r->rounds++;
    }
    double s = (double)(moeq_mono_ns() - t0) / 1e9;
    for (int b = 0; b < B; b++) r->tokens += got[b], r->drafted += seqs[b].drafted, r->accepted += seqs[b].accepted;
    r->tps = (double)r->tokens / s;
    r->tokens_per_round = (double)r->tokens / (double)(r->rounds * B);
    rc = 0;
    goto free_all;
fail:
    fprintf(stderr, "bench-mtp: batch %d k %d: %s\n", B, k, err);
free_all:
    moeq_mtp_decoder_destroy(dec);
    moeq_engine_destroy(e);
    free(seqs), free(items), free(ids), free(logits), free(got);
    return rc;
}

int main(int argc, char **argv) {
    args a;
    if (parse(argc, argv, &a)) {
        fprintf(stderr, "usage: bench-mtp --model DIR [--threads N] [--batches 1,8,32] [--ks 0,1,2,3] [--tokens N]\n");
        return 2;
    }
    moeq_model *model = NULL;
    char err[512] = "";
    if (moeq_model_load(a.model, NULL, &model, err, sizeof err)) {
        fprintf(stderr, "bench-mtp: %s\n", err);
        return 1;
    }
    printf("{\"model\": \"%s\", \"tokens_per_seq\": %d, \"runs\": [", a.model, a.tokens);
    int first = 1;
    for (int bi = 0; bi < a.n_batches; bi++) {
        double base = 0;
        for (int ki = 0; ki < a.n_ks; ki++) {
            result r;
            int B = a.batches[bi], k = a.ks[ki];
            if (run(model, &a, B, k, &r)) continue;
            if (k == 0) base = r.tps;
            double acc = r.drafted ? (double)r.accepted / (double)r.drafted : 0.0;
            printf("%s\n  {\"batch\": %d, \"k\": %d, \"tokens_per_s\": %.2f, \"acceptance\": %.4f, "
                   "\"tokens_per_step\": %.3f, \"zero_overhead_speedup\": %.3f, \"speedup\": %.3f}",
                   first ? "" : ",", B, k, r.tps, acc, r.tokens_per_round, r.tokens_per_round,
                   base > 0 ? r.tps / base : 0.0);
            first = 0;
            fflush(stdout);
        }
    }
    printf("\n]}\n");
    moeq_model_destroy(model);
    return 0;
}
