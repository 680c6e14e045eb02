/*
 * bench/engine.c — `bench-engine --model DIR`: load time, prefill and decode
 * throughput (batch 1, 8, 32, 128) in both batch_invariant modes, peak RSS,
 * KV bytes per token, and the decode roofline: active weight bytes per token
 * over the memory bandwidth measured here (STREAM triad, same thread count;
 * on --backend cuda, bench-cuda-peak's device-to-device bandwidth, and each
 * prefill's weight-product TFLOP/s against a cuBLAS BF16 GEMM of its size).
 * Decode at long context (`--contexts`, batch 1 after a prompt of that many
 * tokens, prefilled in 2048-token chunks) shows what attention over the
 * cache adds to a step. Decode steps bring logits records back, as the
 * worker does (a device then copies no whole rows). Prints one JSON
 * document. A program, not a test: numbers depend on the machine and on
 * what else runs on it.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "moeq/engine.h"
#include "moeq/model_config.h"
#include "moeq/util.h"
#include "peak.h"
#include "stats.h"
#include "cpu_tuning.h" /* engine/cpu: --against-prefetch, --against-f8-widen, --against-k-blocked, --tune */
#include "model.h"      /* engine: --tune asks which weights the model has                           */
#ifdef MOEQ_BENCH_GENMODEL
#include "moeq/genmodel.h"
#endif

typedef struct bench_args {
    const char *model_dir, *preset, *backend;
    const char *cpu_matrix;       /* --cpu-matrix auto|lanes|amx (the engine's cpu_matrix; NULL: its default)    */
    const char *cuda_graphs;      /* --cuda-graphs off|auto|on|both (engine key; both: decode again with auto)   */
    const char *cuda_matrix;      /* --cuda-matrix auto|lanes|both (engine key; both: the prefills and decode
                                     batches again with lanes, in the same run)                                */
    const char *head_screen;      /* --head-screen auto|off|both (engine key; both: the decode batches again with
                                     off, in the same run)                                                     */
    int device, max_batch;
    int n_threads, prefill_tokens, decode_prompt, batches[8], n_batches;
    int prefills[4], n_prefills;  /* prompt lengths timed (--prefill-tokens 512,2048); prefill_tokens: the longest */
    int modes[2], n_modes;        /* batch_invariant values to run (--modes 1,0)                                 */
    double peak_fp32_gflops;      /* this CPU's float32 FMA peak on n_threads, measured (0: not a CPU run)       */
    double matmul_flops_per_token;
    double cublas_tflops[4];      /* bench-cuda-peak's BF16 GEMM at (prefills[i], hidden, hidden); 0: not run   */
    int contexts[8], n_contexts; /* batch-1 decode after this many tokens of context */
    double min_seconds;
    const char *against;          /* --against DIR: a second checkpoint, timed alternated with --model's          */
    const char *against_prefetch; /* --against-prefetch l1|l2: the second side's weight-stream prefetches       */
    const char *against_f8_widen; /* --against-f8-widen f16|f32: the second side's F8 widening (cpu_tuning.h)   */
    const char *against_k_blocked; /* --against-k-blocked on|off: the second side's K blocking at 5-32 tokens    */
    const char *tune;             /* --tune all|prefetch,f8-widen,k-blocked: this CPU's kernel choices measured    */
    int rounds;                   /* --rounds R: paired rounds of --against and --tune (default 3)              */
} bench_args;

/* ---- STREAM triad ------------------------------------------------------------ */

typedef struct triad_arg {
    float *a, *b, *c;
    size_t n;
} triad_arg;

static void *triad_part(void *p) {
    triad_arg *t = p;
    for (size_t i = 0; i < t->n; i++) t->a[i] = t->b[i] + 3.0f * t->c[i];
    return NULL;
}

/* Best of 5 triads over 3 x 256 MiB, split over n_threads; bytes counted as STREAM does (3 per element). */
static double stream_triad_gbs(int n_threads) {
    size_t n = (size_t)64 << 20;
    float *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
    if (!a || !b || !c) return 0;
    for (size_t i = 0; i < n; i++) a[i] = 0, b[i] = 1, c[i] = 2;
    double best = 0;
    pthread_t th[64];
    triad_arg args[64];
    if (n_threads > 64) n_threads = 64;
    for (int rep = 0; rep < 5; rep++) {
        int64_t t0 = moeq_mono_ns();
        for (int i = 0; i < n_threads; i++) {
            size_t lo = n * i / n_threads, hi = n * (i + 1) / n_threads;
            args[i] = (triad_arg){a + lo, b + lo, c + lo, hi - lo};
            pthread_create(&th[i], NULL, triad_part, &args[i]);
        }
        for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
        double s = (moeq_mono_ns() - t0) * 1e-9, gbs = 3.0 * n * 4 / s / 1e9;
        if (gbs > best) best = gbs;
    }
    free(a), free(b), free(c);
    return best;
}

/*
 * FLOPs of the weight products one prompt token costs (2 per multiply-add): MLA's projections with the
 * absorbed kv_b (q side and v side), dense SwiGLU layers, and in MoE layers the router, the top-k routed
 * and the shared experts. Attention over the context and the lm_head (the last position only) are left
 * out, so a fraction of peak computed from it is a lower bound.
 */
static double matmul_flops_per_token(const moeq_model_config *c) {
    double D = c->hidden_size, H = c->num_attention_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    double q = c->q_lora_rank ? D * c->q_lora_rank + (double)c->q_lora_rank * H * qk : D * H * qk;
    double attn = q + D * (c->kv_lora_rank + c->qk_rope_head_dim) + H * c->qk_nope_head_dim * c->kv_lora_rank +
                  H * c->v_head_dim * c->kv_lora_rank + H * c->v_head_dim * D;
    double dense = 3.0 * D * c->intermediate_size;
    double moe = (double)(c->num_experts_per_tok + c->n_shared_experts) * 3.0 * D * c->moe_intermediate_size +
                 D * c->n_routed_experts;
    /* which layers are MoE: the rule of engine/model.c (moeq_model_layer_is_moe, internal; the loader bounds
     * moe_layer_freq to >= 1). first_k_dense_replace may exceed the layer count: the bench-mtp preset's 1000. */
    int L = c->num_hidden_layers, n_moe = 0;
    for (int i = 0; i < L; i++)
        n_moe += c->n_routed_experts > 0 && i >= c->first_k_dense_replace && i % c->moe_layer_freq == 0;
    return 2.0 * (L * attn + (double)(L - n_moe) * dense + (double)n_moe * moe);
}

/* ---- engine runs -------------------------------------------------------------- */

static void ids_for(int32_t *ids, int n, int salt, int vocab) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(((int64_t)i * 7919 + salt * 104729 + 3) % (vocab - 2) + 2);
}

/* A decode step as a server runs it: on a device the rows come back as records (greedy needs nothing else);
 * on the CPU this is moeq_engine_step. */
static moeq_err step_records(moeq_engine *e, const moeq_step_item *items, int n, float *logits) {
    static moeq_logits_record rec[256];
    static uint8_t have[256];
    moeq_step_out out = {logits, 256, rec, NULL, have};
    return moeq_engine_step_out(e, items, n, &out, NULL, 0);
}

static double prefill_tps(moeq_engine *e, int vocab, int n, float *logits) {
    int seq;
    int32_t *ids = malloc((size_t)n * sizeof(int32_t));
    ids_for(ids, n, 1, vocab);
    /* warm-up at the full length: a first step touches every mapped weight page (and reads the file when the
     * page cache lost it), and the first step of this length the arena, activation pack and cache pages it
     * needs; that is load cost, not prefill (a worker pays it once) */
    if (moeq_engine_seq_new(e, &seq)) return 0;
    moeq_step_item warm = {seq, ids, n, 0};
    moeq_engine_step(e, &warm, 1, logits, 1, NULL, 0);
    moeq_engine_seq_free(e, seq);
    if (moeq_engine_seq_new(e, &seq)) return 0;
    /* best of up to 3 runs within ~2 s: one run on a shared machine can lose a slice to another process */
    double best = 0, spent = 0;
    for (int rep = 0; rep < 3 && (rep == 0 || spent < 2.0); rep++) {
        moeq_step_item it = {seq, ids, n, 0};
        int64_t t0 = moeq_mono_ns();
        moeq_err rc = moeq_engine_step(e, &it, 1, logits, 1, NULL, 0);
        double s = (moeq_mono_ns() - t0) * 1e-9;
        moeq_engine_seq_free(e, seq);
        if (rc || moeq_engine_seq_new(e, &seq)) break;
        spent += s;
        if (n / s > best) best = n / s;
    }
    moeq_engine_seq_free(e, seq);
    free(ids);
    return best;
}

/* B sequences with short prompts, then decode steps of B tokens until min_seconds. */
static double decode_tps(moeq_engine *e, int vocab, int B, int prompt, double min_seconds, float *logits,
                         int *steps_out) {
    int seqs[256];
    int32_t ids[256 * 16], next[256];
    moeq_step_item items[256];
    if (B > 256 || B * prompt > 256 * 16) return 0;
    for (int b = 0; b < B; b++) {
        if (moeq_engine_seq_new(e, &seqs[b])) return 0;
        ids_for(ids + b * prompt, prompt, 10 + b, vocab);
        items[b] = (moeq_step_item){seqs[b], ids + b * prompt, prompt, 0};
    }
    int per_step = 2048 / prompt; /* prefill the prompts in steps that fit max_step_tokens */
    for (int b = 0; b < B; b += per_step)
        if (moeq_engine_step(e, items + b, B - b < per_step ? B - b : per_step, logits, 256, NULL, 0)) return 0;
    for (int b = 0; b < B; b++) next[b] = (int32_t)(b + 2);
    int steps = 0;
    int64_t t0 = 0;
    for (;;) {
        for (int b = 0; b < B; b++) items[b] = (moeq_step_item){seqs[b], &next[b], 1, 0};
        if (step_records(e, items, B, logits)) return 0;
        if (steps == 0) t0 = moeq_mono_ns(); /* the first step is warm-up */
        steps++;
        double s = (moeq_mono_ns() - t0) * 1e-9;
        if (steps > 1 && (s >= min_seconds || steps >= 200)) {
            for (int b = 0; b < B; b++) moeq_engine_seq_free(e, seqs[b]);
            *steps_out = steps - 1;
            return (double)B * (steps - 1) / s;
        }
    }
}

/* Batch-1 decode steps after a ctx-token prompt (prefilled in chunks), until min_seconds or 100 steps. */
static double decode_at_context_tps(moeq_engine *e, int vocab, int ctx, double min_seconds, float *logits,
                                    int *steps_out) {
    int seq, chunk = 2048;
    int32_t *ids = malloc((size_t)chunk * sizeof(int32_t)), next = 2;
    if (!ids || moeq_engine_seq_new(e, &seq)) return free(ids), 0;
    for (int done = 0, salt = 0; done < ctx; done += chunk, salt++) {
        int n = ctx - done < chunk ? ctx - done : chunk;
        ids_for(ids, n, 50 + salt, vocab);
        moeq_step_item it = {seq, ids, n, 0};
        if (moeq_engine_step(e, &it, 1, logits, 1, NULL, 0)) return moeq_engine_seq_free(e, seq), free(ids), 0;
    }
    free(ids);
    int steps = 0;
    int64_t t0 = 0;
    for (;;) {
        moeq_step_item it = {seq, &next, 1, 0};
        if (step_records(e, &it, 1, logits)) return moeq_engine_seq_free(e, seq), 0;
        if (steps++ == 0) t0 = moeq_mono_ns(); /* the first step is warm-up */
        double s = (moeq_mono_ns() - t0) * 1e-9;
        if (steps > 1 && (s >= min_seconds || steps > 100)) {
            moeq_engine_seq_free(e, seq);
            *steps_out = steps - 1;
            return (steps - 1) / s;
        }
    }
}

/*
 * A device backend's own figures, from bench-cuda-peak beside this program (the same run, as bench-ep runs
 * ucx_perftest): device-to-device bandwidth (the decode roofline's denominator) and a cuBLAS BF16 GEMM of each
 * prefill's size. The JSON line goes into *json (malloc'd; NULL when it did not run). Returns the D2D GB/s.
 */
static double device_peak(bench_args *a, int hidden, char **json) {
    char self[1024], cmd[2048];
    *json = NULL;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 0;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    int at = snprintf(cmd, sizeof cmd, "'%s/bench-cuda-peak' --device %d", self, a->device);
    for (int i = 0; i < a->n_prefills && at < (int)sizeof cmd - 64; i++)
        at += snprintf(cmd + at, sizeof cmd - (size_t)at, " --gemm %d,%d,%d", a->prefills[i], hidden, hidden);
    snprintf(cmd + at, sizeof cmd - (size_t)at, " 2>&1");
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len = getline(&line, &cap, f);
    pclose(f);
    if (len <= 0 || line[0] != '{') {
        fprintf(stderr, "bench-engine: bench-cuda-peak gave no figures%s%s", len > 0 ? ": " : "\n", len > 0 ? line : "");
        free(line);
        return 0;
    }
    if (line[len - 1] == '\n') line[len - 1] = 0;
    *json = line;
    const char *d2d = strstr(line, "\"d2d_copy_gb_s\": ");
    const char *g = strstr(line, "\"cublas_bf16\": [");
    for (int i = 0; g && i < a->n_prefills; i++) {
        g = strstr(g, "\"tflops\": ");
        if (g) a->cublas_tflops[i] = strtod(g += 10, NULL);
    }
    return d2d ? strtod(d2d + 17, NULL) : 0;
}

static long peak_rss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* The decode list: tokens/s per batch size (batch 1 against the roofline where there is one). */
static void print_decode(moeq_engine *e, const bench_args *a, int vocab, float *logits, double bw_gbs,
                         size_t active) {
    for (int i = 0; i < a->n_batches; i++) {
        int steps = 0, B = a->batches[i];
        double tps = decode_tps(e, vocab, B, a->decode_prompt, a->min_seconds, logits, &steps);
        double step_s = tps > 0 ? B / tps : 0;
        printf("%s\n      {\"batch\": %d, \"steps\": %d, \"tokens_per_s\": %.2f, \"step_ms\": %.2f", i ? "," : "", B,
               steps, tps, step_s * 1e3);
        if (B == 1 && bw_gbs > 0) { /* a screened head reads its int8 copy instead of the head */
            moeq_head_screen_stats st = moeq_engine_head_screen_stats(e);
            double bytes = (double)active - (st.bytes ? (double)st.head_bytes - (double)st.bytes : 0.0);
            printf(", \"roofline_tokens_per_s\": %.2f, \"fraction_of_roofline\": %.3f", bw_gbs * 1e9 / bytes,
                   tps * bytes / (bw_gbs * 1e9));
        }
        printf("}");
        fflush(stdout);
    }
}

/* What the screened head did (engine key head_screen): rows it decided, candidates per row, rows made whole,
 * rows that took the second pass. */
static void print_screen(const moeq_engine *e) {
    moeq_head_screen_stats st = moeq_engine_head_screen_stats(e);
    printf(", \"head_screen\": {\"state\": \"%s\", \"rows\": %lld, \"candidates_per_row\": %.2f, \"fallbacks\": %lld, "
           "\"refined\": %lld, \"bytes\": %zu}", st.state, (long long)st.rows,
           st.rows ? (double)st.candidates / (double)st.rows : 0.0, (long long)st.fallbacks, (long long)st.refined,
           st.bytes);
}

/* A second engine of the run (one key changed in p) for the figures printed as `name`; NULL after printing
 * `name`_error when it cannot be made. */
static moeq_engine *engine_variant(const moeq_model *model, const moeq_engine_params *p, const char *name) {
    moeq_engine *e = NULL;
    char err[256] = "";
    if (moeq_engine_new(model, p, &e, err, sizeof(err))) {
        printf(", \"%s_error\": \"%s\"", name, err);
        return NULL;
    }
    return e;
}

/* --head-screen both: the same decode batches on an engine with head_screen = off (every logits row whole, as
 * llama.cpp computes them): the screen's gain in one run. */
static void decode_head_whole(const moeq_model *model, const bench_args *a, moeq_engine_params p, int vocab,
                              float *logits, double bw_gbs, size_t active) {
    snprintf(p.head_screen, sizeof p.head_screen, "off");
    moeq_engine *e = engine_variant(model, &p, "decode_head_whole");
    if (!e) return;
    printf(", \"decode_head_whole\": [");
    print_decode(e, a, vocab, logits, bw_gbs, active);
    printf("]");
    moeq_engine_destroy(e);
}

/* --cuda-graphs both: the same decode batches on an engine with cuda_graphs = auto (the first engine ran off). */
static void decode_with_graphs(const moeq_model *model, const bench_args *a, moeq_engine_params p, int vocab,
                               float *logits, double bw_gbs, size_t active) {
    snprintf(p.cuda_graphs, sizeof p.cuda_graphs, "auto");
    moeq_engine *e = engine_variant(model, &p, "decode_with_cuda_graphs");
    if (!e) return;
    printf(", \"decode_with_cuda_graphs\": [");
    print_decode(e, a, vocab, logits, bw_gbs, active);
    /* after the steps: the description counts the captures, replays and eager reruns */
    printf("], \"cuda_graphs_backend_info\": \"%s\"", moeq_engine_backend_info(e));
    moeq_engine_destroy(e);
}

/* --cuda-matrix both: the prefills and decode batches again on an engine with cuda_matrix = lanes (the first ran
 * auto, whatever the key's default): the two kernel sets side by side in one run. */
static void again_with_lanes(const moeq_model *model, const bench_args *a, moeq_engine_params p, int vocab,
                             float *logits, double bw_gbs, size_t active) {
    snprintf(p.cuda_matrix, sizeof p.cuda_matrix, "lanes");
    moeq_engine *e = engine_variant(model, &p, "with_cuda_matrix_lanes");
    if (!e) return;
    printf(", \"with_cuda_matrix_lanes\": {\"prefill\": [");
    for (int i = 0; i < a->n_prefills; i++)
        printf("%s{\"tokens\": %d, \"tokens_per_s\": %.2f}", i ? ", " : "", a->prefills[i],
               prefill_tps(e, vocab, a->prefills[i], logits));
    printf("], \"decode\": [");
    print_decode(e, a, vocab, logits, bw_gbs, active);
    printf("]}");
    moeq_engine_destroy(e);
}

/* The engine parameters every run of this program uses; the three `both` keys take their first value. */
static moeq_engine_params engine_params(const bench_args *a, int invariant) {
    moeq_engine_params p = moeq_engine_default_params();
    p.n_threads = a->n_threads;
    p.batch_invariant = invariant;
    snprintf(p.backend, sizeof p.backend, "%s", a->backend);
    if (a->cpu_matrix) snprintf(p.cpu_matrix, sizeof p.cpu_matrix, "%s", a->cpu_matrix);
    int both = a->cuda_graphs && !strcmp(a->cuda_graphs, "both");
    if (a->cuda_graphs) snprintf(p.cuda_graphs, sizeof p.cuda_graphs, "%s", both ? "off" : a->cuda_graphs);
    int both_screen = a->head_screen && !strcmp(a->head_screen, "both");
    if (a->head_screen) snprintf(p.head_screen, sizeof p.head_screen, "%s", both_screen ? "auto" : a->head_screen);
    int both_matrix = a->cuda_matrix && !strcmp(a->cuda_matrix, "both");
    if (a->cuda_matrix) snprintf(p.cuda_matrix, sizeof p.cuda_matrix, "%s", both_matrix ? "auto" : a->cuda_matrix);
    p.device = a->device;
    p.max_seqs = a->max_batch > 128 ? a->max_batch : 128;
    p.max_step_tokens = a->prefill_tokens > 2048 ? a->prefill_tokens : 2048;
    p.kv_cache_tokens = (int64_t)p.max_seqs * (a->decode_prompt + 256) + a->prefill_tokens;
    for (int i = 0; i < a->n_contexts; i++)
        if (p.kv_cache_tokens < a->contexts[i] + 256) p.kv_cache_tokens = a->contexts[i] + 256;
    return p;
}

static void run_mode(const moeq_model *model, const bench_args *a, int invariant, double bw_gbs, size_t active,
                     int first) {
    moeq_engine_params p = engine_params(a, invariant);
    int both = a->cuda_graphs && !strcmp(a->cuda_graphs, "both");
    int both_screen = a->head_screen && !strcmp(a->head_screen, "both");
    int both_matrix = a->cuda_matrix && !strcmp(a->cuda_matrix, "both");
    int vocab = moeq_model_get_config(model)->vocab_size;
    moeq_engine *e = NULL;
    char err[256] = "";
    if (moeq_engine_new(model, &p, &e, err, sizeof(err))) {
        fprintf(stderr, "bench-engine: %s\n", err);
        return;
    }
    float *logits = malloc((size_t)(p.max_seqs > 256 ? p.max_seqs : 256) * vocab * sizeof(float));
    printf("%s    \"batch_invariant_%d\": {\"backend_info\": \"%s\", \"kv_bytes_per_token\": %zu, \"prefill\": [",
           first ? "" : ",\n", invariant, moeq_engine_backend_info(e), moeq_engine_kv_bytes_per_token(e));
    double pre = 0;
    for (int i = 0; i < a->n_prefills; i++) {
        double tps = prefill_tps(e, vocab, a->prefills[i], logits), gflops = tps * a->matmul_flops_per_token / 1e9;
        printf("%s\n      {\"tokens\": %d, \"tokens_per_s\": %.2f, \"matmul_gflops\": %.1f", i ? "," : "",
               a->prefills[i], tps, gflops);
        if (a->peak_fp32_gflops > 0)
            printf(", \"fraction_of_fp32_peak\": %.3f", gflops / a->peak_fp32_gflops);
        if (a->cublas_tflops[i] > 0)
            printf(", \"cublas_bf16_gemm_tflops\": %.1f, \"fraction_of_cublas_bf16\": %.3f", a->cublas_tflops[i],
                   gflops / (a->cublas_tflops[i] * 1e3));
        printf("}");
        fflush(stdout);
        if (i == 0) pre = tps;
    }
    printf("], \"prefill_tokens\": %d, \"prefill_tokens_per_s\": %.2f, \"decode\": [", a->prefills[0], pre);
    print_decode(e, a, vocab, logits, bw_gbs, active);
    printf("]");
    print_screen(e);
    if (invariant && a->n_contexts > 0) {
        printf(", \"decode_at_context\": [");
        for (int i = 0; i < a->n_contexts; i++) {
            int steps = 0;
            double tps = decode_at_context_tps(e, vocab, a->contexts[i], a->min_seconds, logits, &steps);
            printf("%s\n      {\"context\": %d, \"batch\": 1, \"steps\": %d, \"tokens_per_s\": %.2f, \"step_ms\": %.2f}",
                   i ? "," : "", a->contexts[i], steps, tps, tps > 0 ? 1e3 / tps : 0.0);
            fflush(stdout);
        }
        printf("]");
    }
    moeq_engine_destroy(e);
    if (both_screen) decode_head_whole(model, a, p, vocab, logits, bw_gbs, active);
    if (both) decode_with_graphs(model, a, p, vocab, logits, bw_gbs, active);
    if (both_matrix) again_with_lanes(model, a, p, vocab, logits, bw_gbs, active);
    printf("}");
    free(logits);
}

/* ---- --against: two checkpoints, alternated ---------------------------------------------------------- */

/* One figure of both sides over the rounds: each side's median, the median of the paired rounds' ratios (against
 * over model) with their range, and every round's pair. A round where either side gave nothing has no ratio. */
static void print_paired(const double *model_v, const double *against_v, int rounds) {
    double ratio[64], lo = 0, hi = 0;
    int n = 0;
    for (int r = 0; r < rounds; r++) {
        if (model_v[r] <= 0 || against_v[r] <= 0) continue;
        ratio[n] = against_v[r] / model_v[r];
        lo = n == 0 || ratio[n] < lo ? ratio[n] : lo;
        hi = n == 0 || ratio[n] > hi ? ratio[n] : hi;
        n++;
    }
    printf("\"model_tokens_per_s\": %.2f, \"against_tokens_per_s\": %.2f, \"ratio\": %.3f, "
           "\"ratio_range\": [%.3f, %.3f], \"rounds\": [",
           bench_median(model_v, rounds), bench_median(against_v, rounds), bench_median(ratio, n), lo, hi);
    for (int r = 0; r < rounds; r++) printf("%s[%.2f, %.2f]", r ? ", " : "", model_v[r], against_v[r]);
    printf("]}");
    fflush(stdout);
}

/* One side's CPU tuning (cpu_tuning.h): process-wide choices, set before each of its figures. */
enum { CHOICE_PREFETCH, CHOICE_F8_WIDEN, CHOICE_K_BLOCKED, N_CHOICES };

/* Each choice: its engine key, its --tune name, its values 0 and 1 (as cpu_tuning.h numbers them). */
static const struct {
    const char *key, *name, *value[2];
} choices[N_CHOICES] = {{"cpu_prefetch", "prefetch", {"l1", "l2"}},
                        {"cpu_f8_widen", "f8-widen", {"f16", "f32"}},
                        {"cpu_k_blocked", "k-blocked", {"off", "on"}}};

typedef struct side_tuning {
    int v[N_CHOICES]; /* indexed by CHOICE_* */
} side_tuning;

/* This CPU's choices as they stand. */
static side_tuning side_tuning_now(void) {
    return (side_tuning){{moeq_cpu_stream_l2(), moeq_cpu_f8_widen32(), moeq_cpu_k_blocked()}};
}

static void side_tuning_set(const side_tuning *t) {
    moeq_cpu_set_stream_l2(t->v[CHOICE_PREFETCH]);
    moeq_cpu_set_f8_widen32(t->v[CHOICE_F8_WIDEN]);
    moeq_cpu_set_k_blocked(t->v[CHOICE_K_BLOCKED]);
}

/* Figure f (the prefills, then the decode batches) of both sides over a->rounds, taking turns ABBA, each side under
 * its own tuning: v[side][round] in tokens/s. */
static void pair_rounds(moeq_engine *const e[2], const int vocab[2], float *logits, const bench_args *a,
                        const side_tuning tune[2], int f, double v[2][64]) {
    for (int r = 0; r < a->rounds; r++)
        for (int t = 0; t < 2; t++) {
            int s = t ^ (r & 1), steps = 0;
            side_tuning_set(&tune[s]);
            v[s][r] = f < a->n_prefills ? prefill_tps(e[s], vocab[s], a->prefills[f], logits)
                                        : decode_tps(e[s], vocab[s], a->batches[f - a->n_prefills], a->decode_prompt,
                                                     a->min_seconds, logits, &steps);
        }
}

/*
 * --against DIR: every prefill and decode batch timed on both checkpoints in one process, the two engines taking
 * turns ABBA (model, against, against, model, ...) so that a shared machine's drift over minutes falls on both
 * sides alike; each ratio is the median of the paired rounds' ratios (session 25 found a single pair on the Zen 5
 * VM off by up to 20 %). This is how FP8 is measured against BF16 of the same weights (issue 18: within 10 %).
 */
static void run_against(const moeq_model *model, const moeq_model *other, const bench_args *a) {
    moeq_engine_params p = engine_params(a, a->modes[0]);
    /* this CPU's own choices on the first side; the second's as --against-prefetch, -f8-widen, -k-blocked say */
    side_tuning tune[2];
    tune[0] = side_tuning_now();
    tune[1] = tune[0];
    const char *second[N_CHOICES] = {a->against_prefetch, a->against_f8_widen, a->against_k_blocked};
    for (int c = 0; c < N_CHOICES; c++)
        if (second[c]) tune[1].v[c] = !strcmp(second[c], choices[c].value[1]);
    moeq_engine *e[2] = {NULL, NULL};
    const moeq_model *m[2] = {model, other};
    char err[256] = "";
    for (int s = 0; s < 2; s++)
        if (moeq_engine_new(m[s], &p, &e[s], err, sizeof(err))) {
            printf("  \"against_error\": \"%s: %s\"", s && a->against ? a->against : a->model_dir, err);
            if (e[0]) moeq_engine_destroy(e[0]);
            return;
        }
    int vocab[2] = {moeq_model_get_config(model)->vocab_size, moeq_model_get_config(other)->vocab_size};
    int wide = vocab[0] > vocab[1] ? vocab[0] : vocab[1];
    float *logits = malloc((size_t)(p.max_seqs > 256 ? p.max_seqs : 256) * wide * sizeof(float));
    printf("  \"against\": {\"model\": \"%s\", \"batch_invariant\": %d, \"rounds\": %d, \"order\": \"ABBA\",\n"
           "    \"stream_prefetch\": [\"%s\", \"%s\"], \"f8_widen\": [\"%s\", \"%s\"],"
           " \"k_blocked\": [\"%s\", \"%s\"],\n"
           "    \"backend_info\": [\"%s\", \"%s\"],\n",
           a->against ? a->against : a->model_dir, p.batch_invariant, a->rounds,
           choices[CHOICE_PREFETCH].value[tune[0].v[CHOICE_PREFETCH]],
           choices[CHOICE_PREFETCH].value[tune[1].v[CHOICE_PREFETCH]],
           choices[CHOICE_F8_WIDEN].value[tune[0].v[CHOICE_F8_WIDEN]],
           choices[CHOICE_F8_WIDEN].value[tune[1].v[CHOICE_F8_WIDEN]],
           choices[CHOICE_K_BLOCKED].value[tune[0].v[CHOICE_K_BLOCKED]],
           choices[CHOICE_K_BLOCKED].value[tune[1].v[CHOICE_K_BLOCKED]], moeq_engine_backend_info(e[0]),
           moeq_engine_backend_info(e[1]));
    /* backend_info is each engine's as created (both under this CPU's choices); the kernels each side runs: */
    for (int s = 0; s < 2; s++) {
        side_tuning_set(&tune[s]);
        printf("%s\"%s\"%s", s ? ", " : "    \"cpu_kernels\": [", moeq_engine_cpu_kernels(),
               s ? "], \"prefill\": [" : "");
    }
    double v[2][64];
    for (int i = 0; i < a->n_prefills; i++) {
        pair_rounds(e, vocab, logits, a, tune, i, v);
        printf("%s\n      {\"tokens\": %d, ", i ? "," : "", a->prefills[i]);
        print_paired(v[0], v[1], a->rounds);
    }
    printf("],\n    \"decode\": [");
    for (int i = 0; i < a->n_batches; i++) {
        pair_rounds(e, vocab, logits, a, tune, a->n_prefills + i, v);
        printf("%s\n      {\"batch\": %d, ", i ? "," : "", a->batches[i]);
        print_paired(v[0], v[1], a->rounds);
    }
    printf("]}");
    side_tuning_set(&tune[0]);
    free(logits);
    moeq_engine_destroy(e[0]);
    moeq_engine_destroy(e[1]);
}

/* ---- --tune: the CPU kernels' choices measured on this host ------------------------------------------------ */

/* A choice switches from this CPU's rule when the figures' ratios (the other value over the rule's) have a geometric
 * mean of at least TUNE_GAIN and none is below TUNE_WORST: the paired rounds' medians move by a few percent between
 * runs on a shared VM (session 25), so a smaller gain is not told from noise, and a switch may not buy one figure
 * with another. */
#define TUNE_GAIN 1.03
#define TUNE_WORST 0.97

/* Whether the choice can matter for this model here, and why not when it cannot. */
static const char *tune_skip(int choice, const moeq_model *model) {
    if (strncmp(moeq_engine_cpu_kernels(), "avx512 ", 7)) return "not the avx512 lanes: the choices are theirs";
    int f8 = 0, wide = 0;
    for (int i = 0; i < model->n_tensors; i++) {
        const moeq_tensor *t = &model->tensors[i];
        f8 |= t->dtype == MOEQ_DTYPE_F8_E4M3;
        wide |= t->ndim == 2 && t->dtype != MOEQ_DTYPE_F8_E4M3 && moeq_tensor_cols(t) > 1024;
    }
    if (choice == CHOICE_F8_WIDEN && !f8) return "no F8 weights";
    if (choice == CHOICE_K_BLOCKED && !wide) return "no BF16, F16 or F32 weight rows over 1,024 columns";
    return NULL;
}

/*
 * --tune LIST: each of this CPU's kernel choices (cpu_prefetch, cpu_f8_widen, cpu_k_blocked; cpu_tuning.h) that can
 * matter for --model, timed against its other value on whole engine steps as --against-* does (every prefill and
 * decode batch, ABBA over --rounds), one choice after another, each on top of the ones already decided. Prints
 * every figure's ratio and the `key = value` lines (engine and worker keys) for the choices whose other value won
 * by the rule above; none when the CPU's rules are already right.
 */
static void run_tune(const moeq_model *model, const bench_args *a) {
    moeq_engine_params p = engine_params(a, a->modes[0]);
    moeq_engine *one = NULL;
    char err[256] = "";
    if (moeq_engine_new(model, &p, &one, err, sizeof(err))) {
        printf("  \"tune_error\": \"%s\"", err);
        return;
    }
    /* one engine for both sides: the choices are the process's, so the sides differ in them alone (not in where
     * two engines' arenas and caches landed); a freed sequence's blocks are found again only by seq_new_prefix */
    moeq_engine *const e[2] = {one, one};
    int vocab[2] = {moeq_model_get_config(model)->vocab_size, moeq_model_get_config(model)->vocab_size};
    float *logits = malloc((size_t)(p.max_seqs > 256 ? p.max_seqs : 256) * vocab[0] * sizeof(float));
    side_tuning now = side_tuning_now();
    const side_tuning rule = now;
    char config[N_CHOICES][64];
    int n_config = 0;
    printf("  \"tune\": {\"batch_invariant\": %d, \"rounds\": %d, \"order\": \"ABBA\", \"gain_needed\": %.2f, "
           "\"worst_allowed\": %.2f, \"choices\": [",
           p.batch_invariant, a->rounds, TUNE_GAIN, TUNE_WORST);
    for (int c = 0, printed = 0; c < N_CHOICES; c++) {
        if (!strstr(a->tune, choices[c].name) && strcmp(a->tune, "all")) continue;
        int mine = now.v[c];
        printf("%s\n    {\"key\": \"%s\", \"auto\": \"%s\", ", printed++ ? "," : "", choices[c].key,
               choices[c].value[mine]);
        const char *skip = tune_skip(c, model);
        if (skip) {
            printf("\"skipped\": \"%s\"}", skip);
            fflush(stdout);
            continue;
        }
        side_tuning tune[2] = {now, now};
        tune[1].v[c] = !mine;
        printf("\"tried\": \"%s\", \"figures\": [", choices[c].value[!mine]);
        double log_sum = 0, worst = 0, v[2][64];
        int n_fig = a->n_prefills + a->n_batches;
        for (int f = 0; f < n_fig; f++) {
            pair_rounds(e, vocab, logits, a, tune, f, v);
            double ratio[64];
            int n = 0;
            for (int r = 0; r < a->rounds; r++)
                if (v[0][r] > 0 && v[1][r] > 0) ratio[n++] = v[1][r] / v[0][r];
            double med = bench_median(ratio, n);
            if (f < a->n_prefills) printf("%s\n      {\"prefill\": %d, ", f ? "," : "", a->prefills[f]);
            else printf("%s\n      {\"batch\": %d, ", f ? "," : "", a->batches[f - a->n_prefills]);
            print_paired(v[0], v[1], a->rounds);
            if (med <= 0) med = 1; /* a figure that gave nothing (a failed step) decides nothing */
            log_sum += log(med);
            worst = f == 0 || med < worst ? med : worst;
        }
        double gain = exp(log_sum / n_fig);
        int take = gain >= TUNE_GAIN && worst >= TUNE_WORST;
        if (take) {
            now.v[c] = !mine;
            snprintf(config[n_config++], sizeof config[0], "%s = %s", choices[c].key, choices[c].value[!mine]);
        }
        printf("],\n     \"geomean\": %.3f, \"worst\": %.3f, \"choose\": \"%s\", \"why\": \"%s\"}", gain, worst,
               choices[c].value[now.v[c]],
               take                  ? "the other value won"
               : gain >= TUNE_GAIN   ? "the other value won overall but lost a figure past worst_allowed"
                                     : "the other value did not win by gain_needed");
        fflush(stdout);
    }
    printf("],\n    \"config\": [");
    for (int i = 0; i < n_config; i++) printf("%s\"%s\"", i ? ", " : "", config[i]);
    printf("]}");
    side_tuning_set(&rule);
    free(logits);
    moeq_engine_destroy(one);
}

/* A comma-separated list of at most max ints in [lo, hi] into out: how many, or -1 (a value out of range,
 * anything but a comma between them). Values past max are not read. */
static int int_list(const char *v, int *out, int max, int lo, int hi) {
    int n = 0;
    for (char *s = (char *)v; *s && n < max;) {
        long x = strtol(s, &s, 10);
        if (x < lo || x > hi) return -1;
        out[n++] = (int)x;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static int parse(int argc, char **argv, bench_args *a) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--model")) a->model_dir = v;
        else if (!strcmp(k, "--preset")) a->preset = v;
        else if (!strcmp(k, "--backend")) a->backend = v;
        else if (!strcmp(k, "--device")) a->device = atoi(v);
        else if (!strcmp(k, "--cpu-matrix")) a->cpu_matrix = v;
        else if (!strcmp(k, "--cuda-graphs")) {
            if (strcmp(v, "off") && strcmp(v, "auto") && strcmp(v, "on") && strcmp(v, "both")) return -1;
            a->cuda_graphs = v;
        }
        else if (!strcmp(k, "--head-screen")) {
            if (strcmp(v, "off") && strcmp(v, "auto") && strcmp(v, "both")) return -1;
            a->head_screen = v;
        }
        else if (!strcmp(k, "--cuda-matrix")) {
            if (strcmp(v, "auto") && strcmp(v, "lanes") && strcmp(v, "both")) return -1;
            a->cuda_matrix = v;
        }
        else if (!strcmp(k, "--threads")) a->n_threads = atoi(v);
        else if (!strcmp(k, "--min-seconds")) a->min_seconds = atof(v);
        else if (!strcmp(k, "--against")) a->against = v;
        else if (!strcmp(k, "--against-prefetch")) {
            if (strcmp(v, "l1") && strcmp(v, "l2")) return -1;
            a->against_prefetch = v;
        }
        else if (!strcmp(k, "--against-f8-widen")) {
            if (strcmp(v, "f16") && strcmp(v, "f32")) return -1;
            a->against_f8_widen = v;
        }
        else if (!strcmp(k, "--against-k-blocked")) {
            if (strcmp(v, "on") && strcmp(v, "off")) return -1;
            a->against_k_blocked = v;
        }
        else if (!strcmp(k, "--tune")) {
            /* all, or a comma-separated list of prefetch, f8-widen, k-blocked */
            for (const char *t = v; *t;) {
                size_t n = strcspn(t, ",");
                int known = n == 3 && !strncmp(t, "all", 3);
                for (int c = 0; c < N_CHOICES; c++)
                    known |= n == strlen(choices[c].name) && !strncmp(t, choices[c].name, n);
                if (!known) return -1;
                t += n + (t[n] == ',');
            }
            if (!*v) return -1;
            a->tune = v;
        }
        else if (!strcmp(k, "--rounds")) {
            if (int_list(v, &a->rounds, 1, 1, 64) != 1) return -1;
        }
        else if (!strcmp(k, "--prefill-tokens")) {
            if ((a->n_prefills = int_list(v, a->prefills, 4, 1, 1 << 16)) < 0) return -1;
            for (int j = 0; j < a->n_prefills; j++)
                a->prefill_tokens = a->prefills[j] > a->prefill_tokens ? a->prefills[j] : a->prefill_tokens;
        } else if (!strcmp(k, "--modes")) {
            if ((a->n_modes = int_list(v, a->modes, 2, 0, 1)) < 0) return -1;
        } else if (!strcmp(k, "--batches")) {
            if ((a->n_batches = int_list(v, a->batches, 8, 1, 256)) < 0) return -1;
            for (int j = 0; j < a->n_batches; j++)
                a->max_batch = a->batches[j] > a->max_batch ? a->batches[j] : a->max_batch;
        } else if (!strcmp(k, "--contexts")) {
            a->n_contexts = 0;
            if (strcmp(v, "none") && (a->n_contexts = int_list(v, a->contexts, 8, 1, 1 << 20)) < 0) return -1;
        } else return -1;
    }
    return a->model_dir && (argc % 2) ? 0 : -1;
}

/* --preset NAME: write that preset (BF16) into --model DIR first unless DIR holds a config.json already. */
static int ensure_model(const bench_args *a) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", a->model_dir);
    if (!a->preset || access(path, R_OK) == 0) return 0;
#ifdef MOEQ_BENCH_GENMODEL
    moeq_model_config c;
    moeq_genmodel_params gp = moeq_genmodel_default_params();
    char err[512] = "";
    if (moeq_genmodel_preset(a->preset, &c, &gp.min_shards, err, sizeof err) ||
        moeq_genmodel_write(a->model_dir, &c, &gp, NULL, err, sizeof err)) {
        fprintf(stderr, "bench-engine: --preset %s: %s\n", a->preset, err);
        return -1;
    }
    return 0;
#else
    fprintf(stderr, "bench-engine: --preset needs the genmodel library, not in this build\n");
    return -1;
#endif
}

int main(int argc, char **argv) {
    bench_args a = {.prefill_tokens = 512, .prefills = {512}, .n_prefills = 1, .modes = {1, 0}, .n_modes = 2,
                    .decode_prompt = 16, .batches = {1, 8, 32, 128}, .n_batches = 4,
                    .contexts = {1024, 4096}, .n_contexts = 2, .min_seconds = 5.0, .backend = "cpu",
                    .max_batch = 128, .rounds = 3};
    if (parse(argc, argv, &a)) {
        fprintf(stderr, "usage: bench-engine --model DIR [--preset NAME] [--backend cpu|cuda] [--device N]\n"
                        "                    [--threads N] [--prefill-tokens N] [--batches 1,8,32,128,256]\n"
                        "                    [--contexts 1024,4096|none] [--min-seconds S] [--modes 1,0]\n"
                        "                    [--cpu-matrix auto|lanes|amx] [--cuda-graphs off|auto|on|both]\n"
                        "                    [--cuda-matrix auto|lanes|both] [--head-screen auto|off|both]\n"
                        "                    [--against DIR] [--against-prefetch l1|l2] [--against-f8-widen f16|f32]\n"
                        "                    [--against-k-blocked on|off] [--rounds R]\n"
                        "                    [--tune all|prefetch,f8-widen,k-blocked]\n"
                        "  --prefill-tokens  one or more prompt lengths (default 512), each timed\n"
                        "  --modes           batch_invariant values to run (default 1,0)\n"
                        "  --cpu-matrix      the CPU's matrix path (engine key cpu_matrix; default auto)\n"
                        "  --cuda-graphs     engine key cuda_graphs (default off); both: decode again with auto\n"
                        "                    (decode_with_cuda_graphs beside decode)\n"
                        "  --cuda-matrix     engine key cuda_matrix (default lanes); both: auto, then the prefills\n"
                        "                    and decode batches again with lanes (with_cuda_matrix_lanes)\n"
                        "  --head-screen     engine key head_screen (default auto); both: the decode batches\n"
                        "                    again with off (decode_head_whole: every logits row whole)\n"
                        "  --preset NAME   write that gen-model preset (bf16) into DIR first when DIR has no\n"
                        "                  config.json\n"
                        "  --against DIR   a second checkpoint (the FP8 of the same weights, say): instead of the\n"
                        "                  modes, each prefill and decode batch runs on both, alternated ABBA over\n"
                        "                  --rounds R (default 3); `against` gives each side's median and the median\n"
                        "                  of the paired rounds' ratios (DIR's over --model's). Batch-invariant mode\n"
                        "                  is the first of --modes.\n"
                        "  --against-prefetch l1|l2  the second side's CPU kernels prefetch their weight streams\n"
                        "                  into L1 or L2 (the first side: this CPU's choice, cpu_kernels); without\n"
                        "                  --against, both sides are --model.\n"
                        "  --against-f8-widen f16|f32  likewise the second side's F8 widening in the few-token\n"
                        "                  tiles: through float16, or straight into float32 bits.\n"
                        "  --against-k-blocked on|off  likewise whether BF16, F16 and F32 blocks of 5-32 tokens\n"
                        "                  with K > 1,024 walk K in steps (on) or take the direct tiles (off).\n"
                        "  --tune LIST     instead of the modes: each CPU kernel choice in LIST (all: every one)\n"
                        "                  that can matter for --model, against its other value as --against-*\n"
                        "                  times them, one after another; `tune.config` gives the engine and\n"
                        "                  worker keys (cpu_prefetch, cpu_f8_widen, cpu_k_blocked) whose other\n"
                        "                  value won: a geometric mean >= 1.03 over the figures, none < 0.97.\n");
        return 2;
    }
    if (ensure_model(&a)) return 1;
    int n_threads = a.n_threads ? a.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    /* the roofline's bandwidth: the host's (STREAM triad) for the CPU, the device's (bench-cuda-peak) for cuda */
    double bw = strcmp(a.backend, "cpu") ? 0.0 : stream_triad_gbs(n_threads);
    char err[512] = "";
    moeq_model *model = NULL;
    int64_t t0 = moeq_mono_ns();
    moeq_err rc = moeq_model_load(a.model_dir, NULL, &model, err, sizeof(err));
    double load_s = (moeq_mono_ns() - t0) * 1e-9;
    if (rc) {
        fprintf(stderr, "bench-engine: %s\n", err);
        return 1;
    }
    size_t active = moeq_model_active_bytes_per_token(model);
    const moeq_model_config *c = moeq_model_get_config(model);
    a.matmul_flops_per_token = matmul_flops_per_token(c);
    int cpu = !strcmp(a.backend, "cpu");
    char *device_json = NULL;
    if (!strcmp(a.backend, "cuda")) bw = device_peak(&a, c->hidden_size, &device_json);
    double peak_dp = 0, peak_amx_g = 0;
    if (cpu) {
        a.peak_fp32_gflops = peak_supported(PEAK_FMA512)   ? peak_gflops(PEAK_FMA512, n_threads)
                             : peak_supported(PEAK_FMA256) ? peak_gflops(PEAK_FMA256, n_threads)
                                                           : 0;
        if (peak_supported(PEAK_DPBF16)) peak_dp = peak_gflops(PEAK_DPBF16, n_threads);
        if (peak_supported(PEAK_AMX)) peak_amx_g = peak_gflops(PEAK_AMX, n_threads);
    }
    printf("{\n  \"model\": \"%s\", \"backend\": \"%s\", \"total_params\": %zu, \"threads\": %d, \"load_s\": %.4f,\n",
           a.model_dir, a.backend, moeq_model_total_params(model), n_threads, load_s);
    if (device_json)
        printf("  \"layers\": %d, \"active_weight_bytes_per_token\": %zu, \"device_d2d_gb_s\": %.1f,\n"
               "  \"device_peak\": %s,\n", c->num_hidden_layers, active, bw, device_json);
    else
        printf("  \"layers\": %d, \"active_weight_bytes_per_token\": %zu, \"stream_triad_gb_s\": %.2f,\n",
               c->num_hidden_layers, active, bw);
    free(device_json);
    if (cpu)
        printf("  \"cpu_kernels\": \"%s\", \"cpu_matrix\": \"%s\", \"amx\": \"%s\",\n"
               "  \"peak_gflops\": {\"fp32_fma\": %.1f, \"bf16_dp\": %.1f, \"amx_bf16\": %.1f},\n",
               moeq_engine_cpu_kernels(), a.cpu_matrix ? a.cpu_matrix : "auto", moeq_engine_cpu_amx_describe(),
               a.peak_fp32_gflops, peak_dp, peak_amx_g);
    printf("  \"matmul_flops_per_token\": %.0f,\n", a.matmul_flops_per_token);
    if (a.tune && !cpu) {
        printf("  \"tune_error\": \"--tune measures the CPU kernels' choices: --backend cpu\",\n"
               "  \"peak_rss_mb\": %.1f\n}\n", peak_rss_kb() / 1024.0);
        moeq_model_destroy(model);
        return 1;
    }
    if (a.tune) run_tune(model, &a);
    else if (a.against || a.against_prefetch || a.against_f8_widen || a.against_k_blocked) {
        moeq_model *other = NULL; /* --against-prefetch / -f8-widen / -k-blocked alone: both sides are --model */
        if (a.against && moeq_model_load(a.against, NULL, &other, err, sizeof(err))) {
            fprintf(stderr, "bench-engine: --against %s: %s\n", a.against, err);
            printf("  \"against_error\": \"%s\",\n  \"peak_rss_mb\": %.1f\n}\n", err, peak_rss_kb() / 1024.0);
            moeq_model_destroy(model);
            return 1;
        }
        run_against(model, other ? other : model, &a);
        moeq_model_destroy(other);
    } else {
        printf("  \"modes\": {\n");
        for (int i = 0; i < a.n_modes; i++) run_mode(model, &a, a.modes[i], bw, active, i == 0);
        printf("\n  }");
    }
    printf(",\n  \"peak_rss_mb\": %.1f\n}\n", peak_rss_kb() / 1024.0);
    moeq_model_destroy(model);
    return 0;
}
