/*
 * attention.c — MLA attention (see attention.h).
 *
 * The absorbed form is three passes per (query token, block of heads), each
 * with one arithmetic order per output element that no ISA, tile or split
 * changes (so prefill == decode and every worker gives the same bits):
 *
 *   scores   s[h][j] = moeq_tree16(lanes) * scale, where lane l accumulates, with
 *            one fma each, q_lat[h][d] * c_j[d] for d = l, l+16, ... (the
 *            latent part, zero padded to a multiple of 16), then q_pe[h][d]
 *            * kpe_j[d] the same way (the rope part, padded likewise) —
 *            the lanes and tree of the matmul kernels (ops_matmul.c).
 *   softmax  max; e = moeq_exp_nonpos(s - max) (a fixed polynomial, ops_exp.h); sum in
 *            the same 16 lanes + tree; p = e / sum.
 *   output   o[h][d] = fma chain over j = 0, 1, ... of p[h][j] * c_j[d],
 *            from 0 (each element on its own: vectorises without a tree).
 *
 * Implementations: AVX-512 (4 heads x 4 context rows per score tile, 16
 * accumulators reduced together by a shuffle network that pairs lanes exactly
 * as tree16 does; 4 heads x 64 latent columns per output tile), AVX2 (the
 * 16 lanes as two ymm halves; 2 x 2 score tiles, 2 heads x 32 columns), and
 * the scalar emulation. Why tiles: a score computed as its own dot product
 * is a 16-deep FMA latency chain, and an output row updated per (head, row)
 * goes through memory; that form took ~57 ns per (head, context row) on the
 * Zen 5 development VM against 5.5 ns for the tiles, and made attention
 * dominate prefill and long-context decode and a 2-token MTP verify step
 * cost ~9 % more than a 1-token step at 80 tokens of context.
 *
 * The naive form widens kv_b_proj with moeq_tensor_rows_to_f32 and is slow on
 * purpose: it exists to check the absorbed form.
 */
#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "ops_exp.h"
#include "ops_lanes.h"
#include "ops_matmul.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define ATTN_X86 1
#include <immintrin.h>
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define T256 __attribute__((target("avx2,fma")))
#endif

#define LANES MOEQ_LANES
#define ATTN_SLAB_ROWS 128 /* context rows per output slab: 147 KiB of cache for kv_lora 256, 295 KiB for V3 */
#define ZERO_FLOATS 2048 /* padding rows for tile tails: covers kv_lora + rope of every DeepSeek model */

static const float zeros[ZERO_FLOATS];

/* ---- the fixed arithmetic, scalar (the emulation every ISA matches) -------- */

static void softmax_scalar(float *x, int64_t n) {
    float m = -INFINITY, lanes[LANES] = {0};
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int64_t i = 0; i < n; i++) {
        x[i] = moeq_exp_nonpos(x[i] - m);
        lanes[i % LANES] += x[i];
    }
    float sum = moeq_tree16(lanes);
    for (int64_t i = 0; i < n; i++) x[i] /= sum;
}

/* One score: the latent part, then the rope part, in the same 16 lanes (tails padded with fma(0, 0, lane)). */
static float score_scalar(const float *ql, const float *qp, const float *e, int L, int R) {
    float lanes[LANES] = {0};
    for (int k = 0; k < L; k += LANES)
        for (int l = 0; l < LANES; l++) lanes[l] = k + l < L ? fmaf(ql[k + l], e[k + l], lanes[l]) : fmaf(0.0f, 0.0f, lanes[l]);
    for (int k = 0; k < R; k += LANES)
        for (int l = 0; l < LANES; l++)
            lanes[l] = k + l < R ? fmaf(qp[k + l], e[L + k + l], lanes[l]) : fmaf(0.0f, 0.0f, lanes[l]);
    return moeq_tree16(lanes);
}

static void block_scalar(const moeq_mla_params *a, int64_t t, int h0, int h1, float *scores) {
    int64_t n_ctx = a->pos[t] + 1;
    int L = a->kv_lora, R = a->rope, H = a->n_heads;
    moeq_kv_view kv = moeq_kv_paged_view(&a->kv, a->seq[t]);
    const float *ql = a->q_lat + t * H * L, *qp = a->q_pe + t * H * R;
    for (int64_t j = 0; j < n_ctx; j++) {
        const float *e = moeq_kv_view_entry(&kv, j);
        for (int h = h0; h < h1; h++)
            scores[(h - h0) * n_ctx + j] = score_scalar(ql + (int64_t)h * L, qp + (int64_t)h * R, e, L, R) * a->scale;
    }
    for (int h = h0; h < h1; h++) {
        softmax_scalar(scores + (h - h0) * n_ctx, n_ctx);
        memset(a->out_lat + (t * H + h) * L, 0, (size_t)L * sizeof(float));
    }
    for (int64_t j = 0; j < n_ctx; j++) {
        const float *c = moeq_kv_view_entry(&kv, j);
        for (int h = h0; h < h1; h++) {
            float p = scores[(h - h0) * n_ctx + j], *o = a->out_lat + (t * H + h) * L;
            for (int d = 0; d < L; d++) o[d] = fmaf(p, c[d], o[d]);
        }
    }
}

#ifdef ATTN_X86

/* ---- AVX-512 ---------------------------------------------------------------- */

static T512 void softmax512(float *x, int64_t n) {
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += LANES) {
        __mmask16 k = moeq_tail_mask16(n - i);
        mv = _mm512_mask_max_ps(mv, k, mv, _mm512_maskz_loadu_ps(k, x + i)); /* masked: never read past the row */
    }
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv)), sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += LANES) {
        __mmask16 k = moeq_tail_mask16(n - i);
        __m512 e = moeq_exp_nonpos512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m));
        _mm512_mask_storeu_ps(x + i, k, e);
        sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    __m512 s = _mm512_set1_ps(moeq_hsum512(sum));
    for (int64_t i = 0; i < n; i += LANES) {
        __mmask16 k = moeq_tail_mask16(n - i);
        _mm512_mask_storeu_ps(x + i, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), s));
    }
}

/*
 * 16 accumulators A[i] (i = 4 * row + head) reduced at once, each along
 * tree16's pairs: lanes i and i+8, then i and i+4, i+2, i+1. The result's lane
 * 4 * head + row holds moeq_tree16(A[4 * row + head]).
 */
static T512 ALWAYS_INLINE __m512 reduce16x16(const __m512 A[16]) {
    __m512 S[8], T[4], U[2];
#pragma GCC unroll 16
    for (int p = 0; p < 8; p++)
        S[p] = _mm512_add_ps(_mm512_shuffle_f32x4(A[2 * p], A[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(A[2 * p], A[2 * p + 1], 0xEE));
#pragma GCC unroll 16
    for (int q = 0; q < 4; q++)
        T[q] = _mm512_add_ps(_mm512_shuffle_f32x4(S[2 * q], S[2 * q + 1], 0x88),
                             _mm512_shuffle_f32x4(S[2 * q], S[2 * q + 1], 0xDD));
#pragma GCC unroll 16
    for (int u = 0; u < 2; u++)
        U[u] = _mm512_add_ps(_mm512_shuffle_ps(T[2 * u], T[2 * u + 1], 0x44),
                             _mm512_shuffle_ps(T[2 * u], T[2 * u + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(U[0], U[1], 0x88), _mm512_shuffle_ps(U[0], U[1], 0xDD));
}

/* Scores of 4 heads x 4 context rows (padding rows and heads point at zeros); out[4 * head + row]. */
static T512 ALWAYS_INLINE void score_tile512(const float *const ql[4], const float *const qp[4],
                                             const float *const e[4], int L, int R, float out[16]) {
    __m512 A[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) A[i] = _mm512_setzero_ps();
    for (int k = 0; k < L; k += LANES) {
        __mmask16 m = moeq_tail_mask16(L - k);
        __m512 ev[4], qv[4];
#pragma GCC unroll 16
        for (int r = 0; r < 4; r++) ev[r] = _mm512_maskz_loadu_ps(m, e[r] + k);
#pragma GCC unroll 16
        for (int h = 0; h < 4; h++) qv[h] = _mm512_maskz_loadu_ps(m, ql[h] + k);
#pragma GCC unroll 16
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 16
            for (int h = 0; h < 4; h++) A[4 * r + h] = _mm512_fmadd_ps(qv[h], ev[r], A[4 * r + h]);
    }
    for (int k = 0; k < R; k += LANES) {
        __mmask16 m = moeq_tail_mask16(R - k);
        __m512 ev[4], qv[4];
#pragma GCC unroll 16
        for (int r = 0; r < 4; r++) ev[r] = _mm512_maskz_loadu_ps(m, e[r] + L + k);
#pragma GCC unroll 16
        for (int h = 0; h < 4; h++) qv[h] = _mm512_maskz_loadu_ps(m, qp[h] + k);
#pragma GCC unroll 16
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 16
            for (int h = 0; h < 4; h++) A[4 * r + h] = _mm512_fmadd_ps(qv[h], ev[r], A[4 * r + h]);
    }
    _mm512_storeu_ps(out, reduce16x16(A));
}

/*
 * o[h][c0 .. c0+64) for nh heads: the fma chains over context rows [j0, j1), walked block by block, continuing
 * from what o holds unless j0 == 0 (a float32 store and reload is exact, so slabs do not change the bits).
 */
static T512 ALWAYS_INLINE void out_tile512(const int nh, const moeq_kv_view *kv, int64_t j0, int64_t j1,
                                           const float *p, int64_t ldp, float *o, int64_t ldo, int c0, int L) {
    __m512 acc[4][4];
    __mmask16 m[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) m[v] = moeq_tail_mask16(L - c0 - v * LANES);
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            acc[h][v] = j0 ? _mm512_maskz_loadu_ps(m[v], o + h * ldo + c0 + v * LANES) : _mm512_setzero_ps();
    for (int64_t j = j0; j < j1;) {
        int64_t blk = j / kv->block_tokens, off = j % kv->block_tokens;
        int64_t nb = kv->block_tokens - off < j1 - j ? kv->block_tokens - off : j1 - j;
        const float *c = moeq_kv_view_block(kv, blk) + off * kv->entry_floats + c0;
        for (int64_t r = 0; r < nb; r++, c += kv->entry_floats) {
            __m512 cv[4];
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) cv[v] = _mm512_maskz_loadu_ps(m[v], c + v * LANES);
#pragma GCC unroll 4
            for (int h = 0; h < nh; h++) {
                __m512 pv = _mm512_set1_ps(p[h * ldp + j + r]);
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) acc[h][v] = _mm512_fmadd_ps(pv, cv[v], acc[h][v]);
            }
        }
        j += nb;
    }
#pragma GCC unroll 4
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(o + h * ldo + c0 + v * LANES, m[v], acc[h][v]);
}

/*
 * nt consecutive query tokens t0.. of one sequence (positions consecutive), heads [h0, h1): each cache row
 * tile is read once for all of them (prefill re-streamed the whole context from L3 for every token), and
 * each output slab stays in L2 while every token's tiles pass over it. Per (token, head) the scores, the
 * softmax and the output chains do not depend on nt: the bits of one token alone (block512, nt = 1) are
 * the same. Scores: token i's rows at scores + i * (h1 - h0) * ld, ld = the last token's context length.
 */
static T512 void group512(const moeq_mla_params *a, int64_t t0, int nt, int h0, int h1, float *scores) {
    const int L = a->kv_lora, R = a->rope, H = a->n_heads, nh = h1 - h0;
    const int64_t ld = a->pos[t0 + nt - 1] + 1;
    moeq_kv_view kv = moeq_kv_paged_view(&a->kv, a->seq[t0]);
    const int64_t entry_bytes = (int64_t)(L + R) * (int64_t)sizeof(float);
    for (int64_t j0 = 0; j0 < ld; j0 += 4) {
        const float *e[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) e[r] = j0 + r < ld ? moeq_kv_view_entry(&kv, j0 + r) : zeros;
        /* The cache was evicted by the step's weight stream and its blocks are scattered, so the hardware
         * prefetcher restarts every block: request the rows two tiles ahead. */
        for (int64_t j = j0 + 8; j < j0 + 12 && j < ld; j++) {
            const char *pe = (const char *)moeq_kv_view_entry(&kv, j);
            for (int64_t b = 0; b < entry_bytes; b += 64) _mm_prefetch(pe + b, _MM_HINT_T0);
        }
        for (int i = 0; i < nt; i++) {
            const int64_t t = t0 + i, n_ctx = a->pos[t] + 1;
            if (j0 >= n_ctx) continue;
            const float *qlat = a->q_lat + t * H * L, *qpe = a->q_pe + t * H * R;
            float *sc = scores + (int64_t)i * nh * ld;
            for (int hg = h0; hg < h1; hg += 4) {
                const float *ql[4], *qp[4];
                float s[16];
#pragma GCC unroll 16
                for (int h = 0; h < 4; h++) {
                    ql[h] = hg + h < h1 ? qlat + (int64_t)(hg + h) * L : zeros;
                    qp[h] = hg + h < h1 ? qpe + (int64_t)(hg + h) * R : zeros;
                }
                score_tile512(ql, qp, e, L, R, s);
                for (int h = 0; h < 4 && hg + h < h1; h++)
                    for (int r = 0; r < 4 && j0 + r < n_ctx; r++) sc[(hg + h - h0) * ld + j0 + r] = s[4 * h + r] * a->scale;
            }
        }
    }
    for (int i = 0; i < nt; i++)
        for (int h = 0; h < nh; h++) softmax512(scores + ((int64_t)i * nh + h) * ld, a->pos[t0 + i] + 1);
    /* Slabs of context rows small enough to stay in L2 while every (head group, column chunk) tile passes
     * over them; tiles over the whole context re-read it from L3 or DRAM once per tile at long context. */
    for (int64_t s0 = 0; s0 == 0 || s0 < ld; s0 += ATTN_SLAB_ROWS) { /* n_ctx 0 (never served): zeros */
        for (int i = 0; i < nt; i++) {
            const int64_t t = t0 + i, n_ctx = a->pos[t] + 1;
            if (s0 && s0 >= n_ctx) continue;
            int64_t s1 = s0 + ATTN_SLAB_ROWS < n_ctx ? s0 + ATTN_SLAB_ROWS : n_ctx;
            float *o = a->out_lat + (t * H) * L;
            for (int hg = h0; hg < h1; hg += 4) {
                const float *p = scores + ((int64_t)i * nh + (hg - h0)) * ld;
                float *og = o + (int64_t)hg * L;
                for (int c0 = 0; c0 < L; c0 += 4 * LANES) switch (h1 - hg < 4 ? h1 - hg : 4) {
                    case 1: out_tile512(1, &kv, s0, s1, p, ld, og, L, c0, L); break;
                    case 2: out_tile512(2, &kv, s0, s1, p, ld, og, L, c0, L); break;
                    case 3: out_tile512(3, &kv, s0, s1, p, ld, og, L, c0, L); break;
                    default: out_tile512(4, &kv, s0, s1, p, ld, og, L, c0, L); break;
                    }
            }
        }
    }
}

static T512 void block512(const moeq_mla_params *a, int64_t t, int h0, int h1, float *scores) {
    group512(a, t, 1, h0, h1, scores);
}

/* ---- AVX2 + FMA: 16 lanes as two ymm halves ----------------------------------- */

/* Lanes [k, k+8) of a row of n floats, zero past n. */
static T256 ALWAYS_INLINE __m256 load8z(const float *x, int64_t k, int64_t n) {
    if (k + 8 <= n) return _mm256_loadu_ps(x + k);
    float tmp[8] = {0};
    for (int64_t i = k; i < n; i++) tmp[i - k] = x[i];
    return _mm256_loadu_ps(tmp);
}

/* Scores of 2 heads x 2 rows; out[2 * head + row]. */
static T256 void score_tile256(const float *const ql[2], const float *const qp[2], const float *const e[2], int L,
                               int R, float out[4]) {
    __m256 A[4][2];
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) A[i][0] = A[i][1] = _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int seg = 0; seg < 2; seg++) {
        int n = seg ? R : L, off = seg ? L : 0;
        for (int k = 0; k < n; k += LANES)
#pragma GCC unroll 16
            for (int half = 0; half < 2; half++) {
                __m256 ev[2], qv[2];
#pragma GCC unroll 16
                for (int r = 0; r < 2; r++) ev[r] = load8z(e[r] + off, k + 8 * half, n);
#pragma GCC unroll 16
                for (int h = 0; h < 2; h++) qv[h] = load8z(seg ? qp[h] : ql[h], k + 8 * half, n);
#pragma GCC unroll 16
                for (int h = 0; h < 2; h++)
#pragma GCC unroll 16
                    for (int r = 0; r < 2; r++) A[2 * h + r][half] = _mm256_fmadd_ps(qv[h], ev[r], A[2 * h + r][half]);
            }
    }
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) out[i] = moeq_hsum256(A[i][0], A[i][1]);
}

static T256 void block256(const moeq_mla_params *a, int64_t t, int h0, int h1, float *scores) {
    int64_t n_ctx = a->pos[t] + 1;
    int L = a->kv_lora, R = a->rope, H = a->n_heads;
    moeq_kv_view kv = moeq_kv_paged_view(&a->kv, a->seq[t]);
    const float *qlat = a->q_lat + t * H * L, *qpe = a->q_pe + t * H * R;
    for (int64_t j0 = 0; j0 < n_ctx; j0 += 2) {
        const float *e[2];
#pragma GCC unroll 16
        for (int r = 0; r < 2; r++) e[r] = j0 + r < n_ctx ? moeq_kv_view_entry(&kv, j0 + r) : zeros;
        for (int hg = h0; hg < h1; hg += 2) {
            const float *ql[2], *qp[2];
            float s[4];
#pragma GCC unroll 16
            for (int h = 0; h < 2; h++) {
                ql[h] = hg + h < h1 ? qlat + (int64_t)(hg + h) * L : zeros;
                qp[h] = hg + h < h1 ? qpe + (int64_t)(hg + h) * R : zeros;
            }
            score_tile256(ql, qp, e, L, R, s);
            for (int h = 0; h < 2 && hg + h < h1; h++)
                for (int r = 0; r < 2 && j0 + r < n_ctx; r++) scores[(hg + h - h0) * n_ctx + j0 + r] = s[2 * h + r] * a->scale;
        }
    }
    for (int h = h0; h < h1; h++) softmax_scalar(scores + (h - h0) * n_ctx, n_ctx);
    float *o = a->out_lat + (t * H) * L;
    int cv = L / 32 * 32;
    for (int h = h0; h < h1; h += 2) {
        int nh = h1 - h < 2 ? h1 - h : 2;
        for (int c0 = 0; c0 < cv; c0 += 32) {
            __m256 acc[2][4];
#pragma GCC unroll 16
            for (int i = 0; i < 2; i++)
#pragma GCC unroll 16
                for (int v = 0; v < 4; v++) acc[i][v] = _mm256_setzero_ps();
            for (int64_t j = 0; j < n_ctx; j++) {
                const float *c = moeq_kv_view_entry(&kv, j) + c0;
                __m256 cvv[4];
#pragma GCC unroll 16
                for (int v = 0; v < 4; v++) cvv[v] = _mm256_loadu_ps(c + 8 * v);
#pragma GCC unroll 16
                for (int i = 0; i < nh; i++) {
                    __m256 pv = _mm256_set1_ps(scores[(h + i - h0) * n_ctx + j]);
#pragma GCC unroll 16
                    for (int v = 0; v < 4; v++) acc[i][v] = _mm256_fmadd_ps(pv, cvv[v], acc[i][v]);
                }
            }
#pragma GCC unroll 16
            for (int i = 0; i < nh; i++)
#pragma GCC unroll 16
                for (int v = 0; v < 4; v++) _mm256_storeu_ps(o + (int64_t)(h + i) * L + c0 + 8 * v, acc[i][v]);
        }
        for (int i = 0; i < nh && cv < L; i++) { /* the columns past the last 32 */
            float *oh = o + (int64_t)(h + i) * L;
            const float *p = scores + (h + i - h0) * n_ctx;
            for (int d = cv; d < L; d++) oh[d] = 0.0f;
            for (int64_t j = 0; j < n_ctx; j++) {
                const float *c = moeq_kv_view_entry(&kv, j);
                for (int d = cv; d < L; d++) oh[d] = fmaf(p[j], c[d], oh[d]);
            }
        }
    }
}
#endif /* ATTN_X86 */

void moeq_mla_block_isa(moeq_mm_isa isa, const moeq_mla_params *a, int64_t t, int h0, int h1, float *scores) {
#ifdef ATTN_X86
    if (a->kv_lora + a->rope <= ZERO_FLOATS) switch (isa) {
        case MOEQ_MM_ISA_AVX512: block512(a, t, h0, h1, scores); return;
        case MOEQ_MM_ISA_AVX2: block256(a, t, h0, h1, scores); return;
        default: break;
        }
#else
    (void)isa;
#endif
    block_scalar(a, t, h0, h1, scores);
}

void moeq_mla_softmax(float *x, int64_t n) {
#ifdef ATTN_X86
    if (moeq_mm_isa_best() == MOEQ_MM_ISA_AVX512) {
        softmax512(x, n);
        return;
    }
#endif
    softmax_scalar(x, n);
}

void moeq_mla_block(const moeq_mla_params *a, int64_t t, int h0, int h1, float *scores) {
    moeq_mla_block_isa(moeq_mm_isa_best(), a, t, h0, h1, scores);
}

void moeq_mla_group_isa(moeq_mm_isa isa, const moeq_mla_params *a, int64_t t0, int nt, int h0, int h1,
                        float *scores) {
#ifdef ATTN_X86
    if (isa == MOEQ_MM_ISA_AVX512 && nt > 1 && a->kv_lora + a->rope <= ZERO_FLOATS) {
        group512(a, t0, nt, h0, h1, scores);
        return;
    }
#endif
    for (int i = 0; i < nt; i++) moeq_mla_block_isa(isa, a, t0 + i, h0, h1, scores);
}

void moeq_mla_group(const moeq_mla_params *a, int64_t t0, int nt, int h0, int h1, float *scores) {
    moeq_mla_group_isa(moeq_mm_isa_best(), a, t0, nt, h0, h1, scores);
}

/* The cache object's layer as the kernels' plain data. */
static moeq_mla_params plain(const moeq_attn_args *a) {
    return (moeq_mla_params){moeq_kv_cache_paged(a->cache, a->layer), a->n_tok, a->seq, a->pos, a->n_heads,
                             a->kv_lora, a->rope, a->q_lat, a->q_pe, a->out_lat, a->scale};
}

void moeq_attention_absorbed_block_isa(moeq_mm_isa isa, const moeq_attn_args *a, int64_t t, int h0, int h1,
                                       float *scores) {
    moeq_mla_params p = plain(a);
    moeq_mla_block_isa(isa, &p, t, h0, h1, scores);
}

void moeq_attention_absorbed_block(const moeq_attn_args *a, int64_t t, int h0, int h1, float *scores) {
    moeq_mla_params p = plain(a);
    moeq_mla_block(&p, t, h0, h1, scores);
}

float moeq_attention_exp(float x) { return moeq_exp_nonpos(x); }

void moeq_attention_naive_token(const moeq_kv_paged *cache, int seq, int64_t pos, const moeq_tensor *kv_b,
                                int n_heads, int nope, int v_dim, int kv_lora, int rope, float scale,
                                const float *q_nope, const float *q_pe, float *out_v, float *scratch) {
    int64_t n_ctx = pos + 1, kvw = (int64_t)n_heads * (nope + v_dim);
    float *kv = scratch;                 /* (n_ctx, H*(nope+v)) expanded k_nope | v */
    float *s = scratch + n_ctx * kvw;    /* (n_ctx)                                  */
    float *w = malloc((size_t)kvw * kv_lora * sizeof(float));
    if (!w) return;
    moeq_kv_view view = moeq_kv_paged_view(cache, seq);
    moeq_tensor_rows_to_f32(kv_b, 0, kvw, w);
    for (int64_t j = 0; j < n_ctx; j++) {
        const float *c = moeq_kv_view_entry(&view, j);
        for (int64_t r = 0; r < kvw; r++) {
            double acc = 0;
            for (int d = 0; d < kv_lora; d++) acc += (double)w[r * kv_lora + d] * c[d];
            kv[j * kvw + r] = (float)acc;
        }
    }
    for (int h = 0; h < n_heads; h++) {
        for (int64_t j = 0; j < n_ctx; j++) {
            const float *k = kv + j * kvw + (int64_t)h * (nope + v_dim);
            const float *kpe = moeq_kv_view_entry(&view, j) + kv_lora;
            double acc = 0;
            for (int d = 0; d < nope; d++) acc += (double)q_nope[h * nope + d] * k[d];
            for (int d = 0; d < rope; d++) acc += (double)q_pe[h * rope + d] * kpe[d];
            s[j] = (float)(acc * scale);
        }
        moeq_ops_softmax(s, n_ctx);
        for (int d = 0; d < v_dim; d++) {
            double acc = 0;
            for (int64_t j = 0; j < n_ctx; j++) acc += (double)s[j] * kv[j * kvw + (int64_t)h * (nope + v_dim) + nope + d];
            out_v[h * v_dim + d] = (float)acc;
        }
    }
    free(w);
}
