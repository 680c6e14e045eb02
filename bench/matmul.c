/*
 * bench/matmul.c — `bench-matmul`: the CPU backend's matrix kernels against
 * this CPU's arithmetic peak, measured in the same run.
 *
 * Peaks: a microkernel of independent 512-bit (or 256-bit) float32 FMAs, and
 * where the CPU has AVX512-BF16 one of `vdpbf16ps` (32 bf16 products into 16
 * float32 lanes), each on every thread at once. The kernels: the backend's
 * matmul op (threaded by its pool, both batch_invariant modes) on weights of
 * each dtype for the shapes of prefill and batched decode. GFLOP/s counts
 * 2 * tokens * rows * cols. Prints one JSON document. A program, not a test.
 *
 * --cold: each call reads a different copy of the weight (copies filling about
 * 1 GiB), so its weights come from memory as a model's do in the engine; by
 * default the one weight stays in L2/L3 between calls, which hides what the
 * kernels do while they wait on memory (session 14: the engine's products ran
 * at half of the warm rate).
 *
 * --against-k-blocked R: then the lanes' BF16, F16 and F32 products again with
 * the K-blocked path and with the direct tiles for blocks of 5-32 tokens
 * (cpu_tuning.h, k_blocked; the same bits; more tokens are K-blocked either
 * way), alternated ABBA for R rounds in this process;
 * "direct_over_blocked" is the median of the rounds' ratios of GFLOP/s, with
 * its range. This is the figure that decides the choice for a CPU family.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu/cpu_tuning.h"
#include "moeq/util.h"
#include "tensor.h"

#include "peak.h"
#include "stats.h"

/* ---- kernels ----------------------------------------------------------------- */

typedef struct weight {
    moeq_tensor t, scale;
    void *data;     /* `copies` copies of the weight, `bytes` apart */
    size_t bytes;
    int copies;
    float *scales;
} weight;

static uint32_t rng_state = 12345;
static float urand(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return ((rng_state >> 8) * (1.0f / 16777216.0f)) * 2.0f - 1.0f;
}

static int weight_make(weight *w, moeq_dtype dt, int64_t rows, int64_t cols, int cold) {
    size_t es = moeq_dtype_size(dt), n = (size_t)rows * (size_t)cols;
    memset(w, 0, sizeof *w);
    w->bytes = (n * es + 4095) / 4096 * 4096;
    w->copies = cold ? (int)(((size_t)1 << 30) / w->bytes) : 1;
    w->copies = w->copies < 2 && cold ? 2 : w->copies;
    w->data = aligned_alloc(4096, w->bytes * (size_t)w->copies);
    if (!w->data) return -1;
    for (size_t i = 0; i < n; i++) {
        float f = urand() * 0.05f;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        switch (dt) {
        case MOEQ_DTYPE_F32: ((float *)w->data)[i] = f; break;
        case MOEQ_DTYPE_BF16: ((uint16_t *)w->data)[i] = (uint16_t)(bits >> 16); break;
        case MOEQ_DTYPE_F16: ((uint16_t *)w->data)[i] = 0x2000 | (uint16_t)(rng_state & 0x3ff); break;
        case MOEQ_DTYPE_F8_E4M3: ((uint8_t *)w->data)[i] = (uint8_t)((rng_state >> 9) & 0x77); break;
        case MOEQ_DTYPE_Q8R: ((uint8_t *)w->data)[i] = (uint8_t)(1 + (rng_state >> 9) % 255); break;
        }
    }
    for (int c = 1; c < w->copies; c++) memcpy((uint8_t *)w->data + (size_t)c * w->bytes, w->data, n * es);
    w->t = (moeq_tensor){.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = w->data,
                         .nbytes = n * es};
    if (dt == MOEQ_DTYPE_Q8R) { /* a draft copy: one scale per row */
        w->scales = malloc((size_t)rows * sizeof(float));
        if (!w->scales) return -1;
        for (int64_t i = 0; i < rows; i++) w->scales[i] = 0.001f + 0.0001f * (float)(i % 7);
        w->scale = (moeq_tensor){.name = "s", .dtype = MOEQ_DTYPE_F32, .ndim = 1, .shape = {rows},
                                 .data = w->scales, .nbytes = (size_t)rows * sizeof(float)};
        w->t.scale_inv = &w->scale;
    }
    if (dt == MOEQ_DTYPE_F8_E4M3) {
        int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
        w->scales = malloc((size_t)(rb * cb) * sizeof(float));
        if (!w->scales) return -1;
        for (int64_t i = 0; i < rb * cb; i++) w->scales[i] = 0.01f + 0.001f * (float)(i % 7);
        w->scale = (moeq_tensor){.name = "s", .dtype = MOEQ_DTYPE_F32, .ndim = 2, .shape = {rb, cb},
                                 .data = w->scales, .nbytes = (size_t)(rb * cb) * sizeof(float)};
        w->t.scale_inv = &w->scale;
    }
    return 0;
}

static void weight_free(weight *w) {
    free(w->data);
    free(w->scales);
}

static const char *dtype_name(moeq_dtype dt) {
    switch (dt) {
    case MOEQ_DTYPE_F32: return "f32";
    case MOEQ_DTYPE_BF16: return "bf16";
    case MOEQ_DTYPE_F16: return "f16";
    case MOEQ_DTYPE_F8_E4M3: return "f8";
    case MOEQ_DTYPE_Q8R: return "q8r";
    }
    return "?";
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * GFLOP/s of one (tokens x rows x cols) product through the backend, repeated for at least min_s; *per_cpu:
 * the same per CPU-second the process used (less disturbed by other load on a shared machine; times the
 * thread count it is the rate the threads reach while they run).
 */
static double kernel_gflops(moeq_backend *b, weight *w, int64_t tokens, const float *x, float *y, double min_s,
                            double *per_cpu) {
    int64_t rows = w->t.shape[0], cols = w->t.shape[1];
    moeq_mm_job job = {.w = &w->t, .row0 = 0, .n_rows = rows, .x = x, .ldx = cols, .y = y, .ldy = rows,
                       .n_tok = tokens};
    b->matmul(b, &job, 1); /* warm-up: caches, pages */
    int reps = 0;
    int64_t t0 = moeq_mono_ns();
    double s, c0 = cpu_seconds();
    do {
        w->t.data = (uint8_t *)w->data + (size_t)((reps + 1) % w->copies) * w->bytes; /* --cold: the next copy */
        b->matmul(b, &job, 1);
        reps++;
        s = (moeq_mono_ns() - t0) * 1e-9;
    } while (s < min_s);
    double flop = 2.0 * (double)tokens * (double)rows * (double)cols * reps;
    *per_cpu = flop / (cpu_seconds() - c0) / 1e9;
    return flop / s / 1e9;
}

/* --against-k-blocked: the lanes' products of each dtype the choice touches, both ways, ABBA rounds. */
static int k_blocked_rounds(int n_threads, int64_t rows, int64_t cols, const int *toks, int n_toks, int max_tok,
                            int rounds, int cold, double min_s, const float *x, float *y) {
    if (rounds < 1 || rounds > 64) return 1;
    moeq_backend_config cfg = {.n_threads = n_threads, .batch_invariant = 1, .blas_min_tokens = 16, .max_k = cols,
                               .max_ctx = 64, .max_jobs = 4, .max_tokens = max_tok};
    moeq_backend *b = moeq_backend_cpu_new(&cfg);
    if (!b) return 1;
    int mine = moeq_cpu_k_blocked(), first = 1;
    printf(",\n  \"k_blocked\": {\"this_cpu\": %s, \"rounds\": %d, \"order\": \"ABBA\", \"products\": [",
           mine ? "true" : "false", rounds);
    moeq_dtype dts[] = {MOEQ_DTYPE_BF16, MOEQ_DTYPE_F16, MOEQ_DTYPE_F32};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        weight w;
        if (weight_make(&w, dts[d], rows, cols, cold)) return 1;
        for (int i = 0; i < n_toks; i++) {
            double g[2][64], ratio[64], pc;
            for (int r = 0; r < rounds; r++)
                for (int t = 0; t < 2; t++) {
                    int blocked = t ^ (r & 1) ^ 1; /* blocked first in even rounds */
                    moeq_cpu_set_k_blocked(blocked);
                    g[blocked][r] = kernel_gflops(b, &w, toks[i], (float *)x, y, min_s, &pc);
                }
            for (int r = 0; r < rounds; r++) ratio[r] = g[0][r] / g[1][r];
            double med = bench_median_sort(ratio, rounds);
            printf("%s\n    {\"dtype\": \"%s\", \"tokens\": %d, \"blocked_gflops\": %.1f, \"direct_gflops\": %.1f, "
                   "\"direct_over_blocked\": %.3f, \"range\": [%.3f, %.3f]}",
                   first ? "" : ",", dtype_name(dts[d]), toks[i], bench_median(g[1], rounds),
                   bench_median(g[0], rounds), med, ratio[0], ratio[rounds - 1]);
            first = 0;
            fflush(stdout);
        }
        weight_free(&w);
    }
    printf("\n  ]}");
    moeq_cpu_set_k_blocked(mine);
    moeq_backend_destroy(b);
    return 0;
}

int main(int argc, char **argv) {
    int n_threads = 2, inv_min = 0, cold = 0, kb_rounds = 0;
    double min_s = 0.5;
    int64_t rows = 4096, cols = 1024;
    const char *tokens_list = "1,8,32,128,512";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-seconds") && i + 1 < argc) min_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--cols") && i + 1 < argc) cols = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens_list = argv[++i];
        else if (!strcmp(argv[i], "--invariant-only")) inv_min = 1;
        else if (!strcmp(argv[i], "--cold")) cold = 1;
        else if (!strcmp(argv[i], "--against-k-blocked") && i + 1 < argc) {
            kb_rounds = atoi(argv[++i]);
            if (kb_rounds < 1 || kb_rounds > 64) {
                fprintf(stderr, "bench-matmul: --against-k-blocked takes 1 to 64 rounds, not '%s'\n", argv[i]);
                return 2;
            }
        }
        else {
            fprintf(stderr, "usage: bench-matmul [--threads N] [--rows N] [--cols K] [--tokens 1,8,32,128,512]"
                            " [--min-seconds S] [--invariant-only] [--cold] [--against-k-blocked ROUNDS]\n");
            return 2;
        }
    }
    int toks[16], n_toks = 0;
    for (const char *p = tokens_list; *p && n_toks < 16;) {
        toks[n_toks++] = atoi(p);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    int max_tok = 1;
    for (int i = 0; i < n_toks; i++) max_tok = toks[i] > max_tok ? toks[i] : max_tok;

    printf("{\n  \"threads\": %d, \"rows\": %lld, \"cols\": %lld, \"cold\": %s,\n  \"peak_gflops\": {", n_threads,
           (long long)rows, (long long)cols, cold ? "true" : "false");
    static const char *names[] = {"fp32_fma_avx512", "fp32_fma_avx2", "bf16_dp_avx512", "amx_bf16"};
    for (int k = 0, n = 0; k < 4; k++)
        if (peak_supported(k)) printf("%s\"%s\": %.1f", n++ ? ", " : "", names[k], peak_gflops(k, n_threads));
    printf("},\n  \"kernels\": [");
    float *x = malloc((size_t)max_tok * (size_t)cols * sizeof(float));
    float *y = malloc((size_t)max_tok * (size_t)rows * sizeof(float));
    if (!x || !y) return 1;
    for (int64_t i = 0; i < (int64_t)max_tok * cols; i++) x[i] = urand();
    moeq_dtype dts[] = {MOEQ_DTYPE_BF16, MOEQ_DTYPE_F8_E4M3, MOEQ_DTYPE_F16, MOEQ_DTYPE_F32};
    int first = 1;
    /* invariant on the float32 lanes, invariant on AMX tiles where the CPU has them, then OpenBLAS; last the
     * draft products (Q8R copies on AVX512-VNNI int8 dot products, where the CPU has them) */
    for (int mode = 0; mode < 4; mode++) {
        int inv = mode != 2, amx = mode == 1, draft = mode == 3;
        if ((amx && !moeq_engine_cpu_amx()) || (!inv && inv_min) || (draft && !moeq_engine_cpu_draft())) continue;
        moeq_backend_config cfg = {.n_threads = n_threads, .batch_invariant = inv, .blas_min_tokens = 16,
                                   .max_k = cols, .max_ctx = 64, .max_jobs = 4, .max_tokens = max_tok, .amx = amx};
        moeq_backend *b = moeq_backend_cpu_new(&cfg);
        if (!b) return 1;
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            weight w;
            moeq_dtype dt = draft ? MOEQ_DTYPE_Q8R : dts[d];
            if (draft && dts[d] != MOEQ_DTYPE_F8_E4M3) continue; /* once, in place of F8 */
            if (weight_make(&w, dt, rows, cols, cold)) return 1;
            /* Q8R twice: hi and lo activation codes (drafts, the screen's refinement), then the hi codes alone
             * (the screened head's first pass: half the products, counted as the same product here) */
            for (int hi_only = 0; hi_only <= draft; hi_only++) {
                w.t.q8r_hi_only = hi_only;
                for (int i = 0; i < n_toks; i++) {
                    double pc, g = kernel_gflops(b, &w, toks[i], x, y, min_s, &pc);
                    const char *path = hi_only ? "draft_hi_only" : draft ? "draft" : amx ? "amx" : inv ? "lanes"
                                                                                                     : "openblas";
                    printf("%s\n    {\"batch_invariant\": %d, \"path\": \"%s\", \"dtype\": \"%s\", \"tokens\": %d, "
                           "\"gflops\": %.1f, \"gflops_per_cpu_s\": %.1f}",
                           first ? "" : ",", inv, path, dtype_name(dt), toks[i], g, pc);
                    first = 0;
                    fflush(stdout);
                }
            }
            weight_free(&w);
        }
        moeq_backend_destroy(b);
    }
    printf("\n  ]");
    if (kb_rounds && k_blocked_rounds(n_threads, rows, cols, toks, n_toks, max_tok, kb_rounds, cold, min_s, x, y))
        return 1;
    printf("\n}\n");
    free(x), free(y);
    return 0;
}
