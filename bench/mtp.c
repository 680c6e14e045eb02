/*
 * bench/mtp.c — `bench-mtp --model DIR`: greedy decode tokens/s with MTP
 * speculative decoding off (k = 0: plain steps, sequences not marked) and on
 * (k = 1, 2, 3) at batch 1, 8 and 32; the measured acceptance rate; the
 * tokens each round yields (= the speedup drafting and verifying would give
 * at zero overhead); and the measured speedup over k = 0. Prints JSON.
 *
 * Each batch size B: one engine per k ("lane"), each with B sequences with
 * 16-token prompts and one batched prefill; then the lanes run in lockstep,
 * one round (k = 0: one plain step) of each lane in turn, each round timed
 * on its own, until every sequence of every lane has `--tokens` new tokens
 * (round 0 of each lane is a warm-up, not timed). Interleaving round by
 * round makes every k see the same machine load, so the speedups (ratios
 * of tokens/s within a batch size) hold on a shared, noisy machine even
 * when the absolute figures do not. `--mtp-draft f8,e4m3,exact` runs each
 * k > 0 once per engine key mtp_draft listed (default f8 alone), in the same
 * lockstep. `--repeat R` runs the whole comparison
 * R times and reports the median of each figure. Use a checkpoint with an
 * MTP layer: `moeq gen-model --preset bench-mtp` (agrees by construction)
 * or `bench`.
 *
 * `verify_step_cost` (batch 1, issue 18's aim: a 2-4 token verify step at
 * most ~1.05 plain steps): one engine, one sequence, steps of 1, 2, ...,
 * max k + 1 tokens with a logits record per token (a verify step's rows),
 * each truncated away again, alternated --cost-rounds times (default 24) in
 * one process with fresh tokens every step; the median over rounds of each
 * step's time over the 1-token step's of the same round. A round of k costs
 * about that plus the draft, so speedup ~ tokens_per_step / (cost + draft).
 *
 * `--ks ...,auto` adds a lane whose drafts per sequence and round (0-3) are
 * the worker's `mtp_k = auto` choice (worker/mtp_auto.h: each sequence's
 * acceptance by depth, this lane's own round times), with the mean k it
 * chose; it should match or beat the best fixed k of its batch size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moeq/engine.h"
#include "moeq/util.h"
#include "stats.h"
#include "mtp_auto.h"

#define K_AUTO (-1)   /* --ks auto: the lane of mtp_k = auto                     */
#define AUTO_MAX_K 3  /* the worker's auto range                                */

typedef struct args {
    const char *model;
    int n_threads, tokens, prompt, repeat, cost_rounds;
    int batches[8], n_batches, ks[8], n_ks;
    char drafts[3][8]; /* --mtp-draft: engine key mtp_draft of the k > 0 lanes */
    const char *cpu_matrix; /* --cpu-matrix: engine key cpu_matrix (default auto) */
    int n_drafts;
    int n_lanes, lane_k[8], lane_draft[8]; /* the lanes: each k, each draft mode for k > 0 */
} args;

/* Up to three of "f8", "e4m3" and "exact", comma-separated, into a->drafts. */
static int parse_drafts(const char *v, args *a) {
    a->n_drafts = 0;
    for (const char *s = v; *s && a->n_drafts < 3;) {
        size_t n = strcspn(s, ",");
        if (!((n == 2 && !strncmp(s, "f8", 2)) || (n == 4 && !strncmp(s, "e4m3", 4)) ||
              (n == 5 && !strncmp(s, "exact", 5))))
            return -1;
        snprintf(a->drafts[a->n_drafts++], sizeof a->drafts[0], "%.*s", (int)n, s);
        s += n + (s[n] == ',');
    }
    return a->n_drafts > 0 ? 0 : -1;
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    for (char *end; *s && n < max; s = *end ? end + 1 : end) {
        if (!strncmp(s, "auto", 4) && (s[4] == ',' || !s[4])) {
            out[n++] = K_AUTO;
            end = (char *)s + 4;
            continue;
        }
        out[n++] = (int)strtol(s, &end, 10);
        if (end == s) return -1;
    }
    return n;
}

static int parse(int argc, char **argv, args *a) {
    *a = (args){.tokens = 128, .prompt = 16, .batches = {1, 8, 32}, .n_batches = 3, .ks = {0, 1, 2, 3}, .n_ks = 4,
              .repeat = 1, .drafts = {"f8"}, .n_drafts = 1, .cost_rounds = 24};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--model")) a->model = v;
        else if (!strcmp(k, "--threads")) a->n_threads = atoi(v);
        else if (!strcmp(k, "--tokens")) a->tokens = atoi(v);
        else if (!strcmp(k, "--repeat")) a->repeat = atoi(v);
        else if (!strcmp(k, "--cost-rounds")) a->cost_rounds = atoi(v);
        else if (!strcmp(k, "--batches")) a->n_batches = parse_list(v, a->batches, 8);
        else if (!strcmp(k, "--ks")) a->n_ks = parse_list(v, a->ks, 8);
        else if (!strcmp(k, "--cpu-matrix")) a->cpu_matrix = v;
        else if (!strcmp(k, "--mtp-draft")) {
            if (parse_drafts(v, a)) return -1;
        } else return -1;
    }
    a->n_lanes = 0;
    for (int i = 0; i < a->n_ks; i++)
        for (int d = 0; d < (a->ks[i] != 0 ? a->n_drafts : 1); d++) {
            if (a->n_lanes == 8) return -1;
            a->lane_k[a->n_lanes] = a->ks[i], a->lane_draft[a->n_lanes++] = d;
        }
    return a->model && a->n_batches > 0 && a->n_ks > 0 && a->tokens > 0 && a->repeat >= 1 && a->repeat <= 15 ? 0 : -1;
}

typedef struct result {
    double tps, tokens_per_round, mean_k;
    int64_t drafted, accepted, tokens, rounds, ns, k_sum;
} result;

/* One k at batch B on its own engine. */
typedef struct lane {
    int B, k;
    moeq_engine *engine;
    moeq_mtp_decoder *dec;
    moeq_spec_seq *seqs;
    moeq_step_item *items;
    int32_t *ids;
    float *logits;
    int64_t *got;
    moeq_logits_record *rec; /* k = 0: the plain steps' records (greedy rows, as the MTP rounds read theirs) */
    uint8_t *have;
    int vocab, round;
    moeq_mtp_auto *choice;      /* k = K_AUTO: the worker's choice of drafts ... */
    moeq_mtp_depths *depths;    /* ... each sequence's acceptance by depth       */
    moeq_mtp_auto_job *jobs;
    int64_t *accepted_before;
    result r;
} lane;

static int32_t argmax(const float *row, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++) b = row[i] > row[b] ? i : b;
    return b;
}

static void lane_close(lane *l) {
    moeq_mtp_decoder_destroy(l->dec);
    moeq_engine_destroy(l->engine);
    moeq_mtp_auto_destroy(l->choice);
    free(l->depths), free(l->jobs), free(l->accepted_before);
    free(l->seqs), free(l->items), free(l->ids), free(l->logits), free(l->got), free(l->rec), free(l->have);
    memset(l, 0, sizeof *l);
}

/* Engine, sequences, prefill, first token. */
static int lane_open(const moeq_model *model, const args *a, int B, int k, const char *draft, lane *l, char *err,
                     size_t err_size) {
    const moeq_model_config *c = moeq_model_get_config(model);
    moeq_engine_params p = moeq_engine_default_params();
    snprintf(p.mtp_draft, sizeof p.mtp_draft, "%s", draft);
    if (a->cpu_matrix) snprintf(p.cpu_matrix, sizeof p.cpu_matrix, "%s", a->cpu_matrix);
    p.n_threads = a->n_threads;
    p.max_seqs = B;
    p.max_step_tokens = B * (a->prompt > MOEQ_MTP_MAX_K + 1 ? a->prompt : MOEQ_MTP_MAX_K + 1);
    /* twice the tokens: auto's sequences run at different paces, and every one steps until the last is done */
    p.kv_cache_tokens = (int64_t)B * (a->prompt + 2 * a->tokens + 2 * MOEQ_MTP_MAX_K + 16);
    *l = (lane){.B = B, .k = k, .vocab = c->vocab_size};
    l->seqs = calloc((size_t)B, sizeof *l->seqs);
    l->items = calloc((size_t)B, sizeof *l->items);
    l->ids = malloc((size_t)B * a->prompt * sizeof(int32_t));
    l->logits = malloc((size_t)B * c->vocab_size * sizeof(float));
    l->got = calloc((size_t)B, sizeof(int64_t));
    l->rec = calloc((size_t)B, sizeof *l->rec);
    l->have = calloc((size_t)B, 1);
    if (!l->seqs || !l->items || !l->ids || !l->logits || !l->got || !l->rec || !l->have)
        return snprintf(err, err_size, "out of memory"), 1;
    if (moeq_engine_new(model, &p, &l->engine, err, err_size)) return 1;
    if (k != 0 && moeq_mtp_decoder_new(l->engine, B, k == K_AUTO ? AUTO_MAX_K : k, &l->dec, err, err_size)) return 1;
    if (k == K_AUTO) { /* as the worker sets it up: a draft pass's share of a step's weights */
        double step = (double)moeq_model_active_bytes_per_token(model);
        double share = step > 0 ? (double)moeq_model_mtp_active_bytes_per_token(model) / step : 0;
        if (moeq_mtp_auto_new(p.max_step_tokens, share > 1 ? 1 : share, &l->choice, err, err_size)) return 1;
        l->depths = calloc((size_t)B, sizeof *l->depths);
        l->jobs = calloc((size_t)B, sizeof *l->jobs);
        l->accepted_before = calloc((size_t)B, sizeof *l->accepted_before);
        if (!l->depths || !l->jobs || !l->accepted_before) return snprintf(err, err_size, "out of memory"), 1;
    }
    for (int b = 0; b < B; b++) {
        if (moeq_engine_seq_new(l->engine, &l->seqs[b].seq_id)) return snprintf(err, err_size, "seq_new"), 1;
        if (k != 0 && moeq_engine_seq_set_mtp(l->engine, l->seqs[b].seq_id, 1))
            return snprintf(err, err_size, "the model has no MTP layer"), 1;
        for (int i = 0; i < a->prompt; i++)
            l->ids[b * a->prompt + i] = (int32_t)((i * 37 + b * 101 + 5) % c->vocab_size);
        l->items[b] = (moeq_step_item){l->seqs[b].seq_id, l->ids + b * a->prompt, a->prompt, 0};
        l->seqs[b].sampling = moeq_sampling_default_params();
    }
    if (moeq_engine_step(l->engine, l->items, B, l->logits, (size_t)B, err, err_size)) return 1;
    for (int b = 0; b < B; b++) l->seqs[b].next_token = argmax(l->logits + (size_t)b * l->vocab, l->vocab);
    return 0;
}

static int lane_done(const lane *l, int tokens) {
    int done = l->round > 0;
    for (int b = 0; b < l->B; b++) done &= l->got[b] >= tokens;
    return done;
}

/* One round of the lane (one plain step at k = 0); round 0 is the untimed warm-up. */
static int lane_round(lane *l, char *err, size_t err_size) {
    if (l->round == 1) {
        memset(&l->r, 0, sizeof l->r);
        for (int b = 0; b < l->B; b++) l->got[b] = 0, l->seqs[b].drafted = l->seqs[b].accepted = 0;
    }
    int64_t t0 = moeq_mono_ns();
    if (l->k == 0) {
        for (int b = 0; b < l->B; b++) l->items[b] = (moeq_step_item){l->seqs[b].seq_id, &l->seqs[b].next_token, 1, 0};
        /* greedy rows as a server steps them (records: the screened head where it applies, as the MTP rounds'
         * verify rows), so that the ratio is the speculation's alone */
        moeq_step_out out = {l->logits, (size_t)l->B, l->rec, NULL, l->have};
        if (moeq_engine_step_out(l->engine, l->items, l->B, &out, err, err_size)) return 1;
        for (int b = 0; b < l->B; b++) {
            l->seqs[b].next_token =
                l->have[b] ? argmax(l->logits + (size_t)b * l->vocab, l->vocab) : l->rec[b].argmax;
            l->got[b]++;
        }
    } else if (l->k == K_AUTO) { /* the scheduler's use of mtp_auto, without prompts waiting */
        for (int b = 0; b < l->B; b++) l->jobs[b] = (moeq_mtp_auto_job){.depths = &l->depths[b], .k_max = AUTO_MAX_K};
        moeq_mtp_auto_choose(l->choice, l->jobs, l->B, l->B, l->B * AUTO_MAX_K);
        int tokens = 0, passes[AUTO_MAX_K] = {0};
        for (int b = 0; b < l->B; b++) {
            int k = l->seqs[b].k = l->jobs[b].k;
            l->accepted_before[b] = l->seqs[b].accepted;
            tokens += k + 1;
            for (int j = 0; j < k; j++) passes[j]++;
            l->r.k_sum += k;
        }
        if (moeq_mtp_decode_step(l->dec, l->seqs, l->B, err, err_size)) return 1;
        for (int b = 0; b < l->B; b++) {
            l->got[b] += l->seqs[b].n_out;
            if (l->seqs[b].k > 0)
                moeq_mtp_auto_note_round(l->choice, &l->depths[b], l->seqs[b].k,
                                         (int)(l->seqs[b].accepted - l->accepted_before[b]));
        }
        moeq_mtp_auto_note_step(l->choice, tokens, passes, AUTO_MAX_K, (double)(moeq_mono_ns() - t0) * 1e-9,
                                (double)moeq_mtp_decoder_last_draft_ns(l->dec) * 1e-9);
    } else {
        for (int b = 0; b < l->B; b++) l->seqs[b].k = l->k;
        if (moeq_mtp_decode_step(l->dec, l->seqs, l->B, err, err_size)) return 1;
        for (int b = 0; b < l->B; b++) l->got[b] += l->seqs[b].n_out;
    }
    l->r.ns += moeq_mono_ns() - t0;
    l->r.rounds++;
    l->round++;
    return 0;
}

static void lane_result(lane *l) {
    result *r = &l->r;
    for (int b = 0; b < l->B; b++)
        r->tokens += l->got[b], r->drafted += l->seqs[b].drafted, r->accepted += l->seqs[b].accepted;
    r->tps = (double)r->tokens / ((double)r->ns / 1e9);
    r->tokens_per_round = (double)r->tokens / (double)(r->rounds * l->B);
    r->mean_k = l->k == K_AUTO ? (double)r->k_sum / (double)(r->rounds * l->B) : l->k;
}

/* Every k at batch B in lockstep; res[ki] per k. 0 when all worked. */
static int run_batch(const moeq_model *model, const args *a, int B, result *res) {
    lane lanes[8] = {0};
    char err[512] = "";
    int rc = 1, ki = 0, busy = 1;
    for (ki = 0; ki < a->n_lanes; ki++)
        if (lane_open(model, a, B, a->lane_k[ki], a->drafts[a->lane_draft[ki]], &lanes[ki], err, sizeof err))
            goto fail;
    while (busy) {
        busy = 0;
        for (ki = 0; ki < a->n_lanes; ki++) {
            if (lane_done(&lanes[ki], a->tokens)) continue;
            busy = 1;
            if (lane_round(&lanes[ki], err, sizeof err)) goto fail;
        }
    }
    for (ki = 0; ki < a->n_lanes; ki++) lane_result(&lanes[ki]), res[ki] = lanes[ki].r;
    rc = 0;
    goto close_all;
fail:
    fprintf(stderr, "bench-mtp: batch %d k %d: %s\n", B, ki < a->n_lanes ? a->lane_k[ki] : -1, err);
close_all:
    for (ki = 0; ki < a->n_lanes; ki++) lane_close(&lanes[ki]);
    return rc;
}

static void print_batch(int B, const args *a, result res[][8], int *first) {
    for (int ki = 0; ki < a->n_lanes; ki++) {
        double tps[15], speedup[15];
        for (int rep = 0; rep < a->repeat; rep++) {
            double base = 0;
            for (int j = 0; j < a->n_lanes; j++)
                if (a->lane_k[j] == 0) base = res[rep][j].tps;
            tps[rep] = res[rep][ki].tps;
            speedup[rep] = base > 0 ? res[rep][ki].tps / base : 0.0;
        }
        const result *r = &res[0][ki]; /* greedy: acceptance is the same every repetition (auto: the first's) */
        double acc = r->drafted ? (double)r->accepted / (double)r->drafted : 0.0;
        double sp = bench_median_sort(speedup, a->repeat); /* sorts: [0] and [repeat - 1] are the extremes */
        char k[32];
        if (a->lane_k[ki] == K_AUTO) snprintf(k, sizeof k, "\"auto\", \"mean_k\": %.3f", r->mean_k);
        else snprintf(k, sizeof k, "%d", a->lane_k[ki]);
        printf("%s\n  {\"batch\": %d, \"k\": %s, \"mtp_draft\": \"%s\", \"tokens_per_s\": %.2f, \"acceptance\": %.4f, "
               "\"tokens_per_step\": %.3f, \"zero_overhead_speedup\": %.3f, \"speedup\": %.3f, "
               "\"speedup_range\": [%.3f, %.3f]}",
               *first ? "" : ",", B, k, a->lane_k[ki] ? a->drafts[a->lane_draft[ki]] : "-",
               bench_median_sort(tps, a->repeat), acc, r->tokens_per_round,
               r->tokens_per_round, sp, speedup[0], speedup[a->repeat - 1]);
        *first = 0;
    }
    fflush(stdout);
}

/*
 * verify_step_cost: cost[n - 1] = the median over rounds of (an n-token step's time) / (the 1-token step's of the
 * same round), n = 1..max_n, batch 1. 0 when it worked.
 */
static int verify_cost(const moeq_model *model, const args *a, int max_n, double *cost, char *err, size_t err_size) {
    enum { MAX_ROUNDS = 256, MAX_N = MOEQ_MTP_MAX_K + 1 };
    const moeq_model_config *c = moeq_model_get_config(model);
    int rounds = a->cost_rounds < 3 ? 3 : a->cost_rounds > MAX_ROUNDS ? MAX_ROUNDS : a->cost_rounds, rc = 1, seq;
    if (max_n > MAX_N) max_n = MAX_N;
    moeq_engine_params p = moeq_engine_default_params();
    if (a->cpu_matrix) snprintf(p.cpu_matrix, sizeof p.cpu_matrix, "%s", a->cpu_matrix);
    p.n_threads = a->n_threads;
    p.max_seqs = 1;
    p.max_step_tokens = a->prompt > MAX_N ? a->prompt : MAX_N;
    p.kv_cache_tokens = a->prompt + MAX_N + 16;
    moeq_engine *e = NULL;
    size_t n_ids = (size_t)a->prompt + (size_t)MAX_ROUNDS * MAX_N * (MAX_N + 1) / 2;
    int32_t *ids = malloc(n_ids * sizeof(int32_t));
    float *logits = malloc((size_t)MAX_N * c->vocab_size * sizeof(float));
    static double t[MAX_N][MAX_ROUNDS], ratio[MAX_ROUNDS];
    moeq_logits_record rec[MAX_N];
    uint8_t have[MAX_N];
    if (!ids || !logits) {
        snprintf(err, err_size, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n_ids; i++) ids[i] = (int32_t)((i * 37 + 5) % c->vocab_size);
    if (moeq_engine_new(model, &p, &e, err, err_size)) goto done;
    if (moeq_engine_seq_new(e, &seq)) {
        snprintf(err, err_size, "seq_new");
        goto done;
    }
    moeq_step_item prefill = {seq, ids, a->prompt, 0};
    if (moeq_engine_step(e, &prefill, 1, logits, 1, err, err_size)) goto done;
    /* fresh tokens every step: a step that repeated the previous one's would find its experts' weights in the
     * last-level cache (MoE models), which flatters whichever step comes second */
    const int32_t *next = ids + a->prompt;
    for (int r = 0; r < rounds; r++)
        for (int n = 1; n <= max_n; n++) {
            moeq_step_item it = {seq, next, n, 1};
            moeq_step_out out = {logits, (size_t)n, rec, NULL, have};
            next += n;
            int64_t t0 = moeq_mono_ns();
            if (moeq_engine_step_out(e, &it, 1, &out, err, err_size)) goto done;
            t[n - 1][r] = (double)(moeq_mono_ns() - t0);
            if (moeq_engine_seq_truncate(e, seq, a->prompt)) {
                snprintf(err, err_size, "truncate");
                goto done;
            }
        }
    for (int n = 1; n <= max_n; n++) {
        int m = 0;
        for (int r = 2; r < rounds; r++) ratio[m++] = t[n - 1][r] / t[0][r]; /* rounds 0-1 warm up */
        cost[n - 1] = bench_median_sort(ratio, m);
    }
    rc = 0;
done:
    moeq_engine_destroy(e);
    free(ids);
    free(logits);
    return rc;
}

int main(int argc, char **argv) {
    args a;
    if (parse(argc, argv, &a)) {
        fprintf(stderr, "usage: bench-mtp --model DIR [--threads N] [--batches 1,8,32] [--ks 0,1,2,3,auto] "
                        "[--tokens N] "
                        "[--repeat R (1-15)] [--mtp-draft f8|e4m3|exact|f8,e4m3,exact] [--cost-rounds R (0: none)] "
                        "[--cpu-matrix auto|lanes|amx]\n");
        return 2;
    }
    moeq_model *model = NULL;
    char err[512] = "";
    if (moeq_model_load(a.model, NULL, &model, err, sizeof err)) {
        fprintf(stderr, "bench-mtp: %s\n", err);
        return 1;
    }
    printf("{\"model\": \"%s\", \"tokens_per_seq\": %d, \"repeat\": %d, \"runs\": [", a.model, a.tokens, a.repeat);
    int first = 1;
    static result res[15][8];
    for (int bi = 0; bi < a.n_batches; bi++) {
        int ok = 1;
        for (int rep = 0; ok && rep < a.repeat; rep++) ok = !run_batch(model, &a, a.batches[bi], res[rep]);
        if (ok) print_batch(a.batches[bi], &a, res, &first);
    }
    printf("\n]");
    int max_n = 2;
    for (int i = 0; i < a.n_ks; i++) {
        int k = a.ks[i] == K_AUTO ? AUTO_MAX_K : a.ks[i];
        if (k + 1 > max_n) max_n = k + 1;
    }
    double cost[MOEQ_MTP_MAX_K + 1];
    if (max_n > MOEQ_MTP_MAX_K + 1) max_n = MOEQ_MTP_MAX_K + 1;
    if (a.cost_rounds > 0 && !verify_cost(model, &a, max_n, cost, err, sizeof err)) {
        printf(",\n \"verify_step_cost\": {\"tokens\": [");
        for (int n = 1; n <= max_n; n++) printf("%s%d", n > 1 ? ", " : "", n);
        printf("], \"plain_steps\": [");
        for (int n = 1; n <= max_n; n++) printf("%s%.3f", n > 1 ? ", " : "", cost[n - 1]);
        printf("]}");
    } else if (a.cost_rounds > 0)
        fprintf(stderr, "bench-mtp: verify_step_cost: %s\n", err);
    printf("\n}\n");
    moeq_model_destroy(model);
    return 0;
}
