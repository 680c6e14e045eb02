/*
 * ops_matmul.c — the CPU matrix kernels (see ops_matmul.h for the contract).
 *
 * Three implementations of one reduction order, chosen at run time from what
 * the CPU has (so a portable build is fast everywhere):
 *   AVX-512  4x6 register tiles (4 tokens x 6 weight rows, 24 zmm
 *            accumulators, no spills) for NT, 8 rows for blocks of 1-3
 *            tokens (every weight vector widened once and used by all the
 *            tokens); many tokens walk K in steps (see ops_matmul.h);
 *            4 tokens x 64 columns for NN.
 *   AVX2     each 16-lane accumulator held as two ymm halves (lanes 0-7 and
 *            8-15); 2 tokens x 3 rows (1 token x 4 rows); NN 4 tokens x 16
 *            columns. The tree's first level adds the two halves, which is
 *            exactly moeq_tree16()'s first level.
 *   scalar   the emulation: 16 float lanes, one fmaf per lane, the same tree.
 * All three give bit-identical results; the tests compare every one the CPU
 * can run against the emulation. Weights are widened in registers (bf16:
 * shift, f16: vcvtph2ps, f8 e4m3: bit placement into an f16, the value
 * q / 256, with x256 and the block scale on the activations; AVX-512's
 * few-token tiles take those activations scaled once per scale block and,
 * where cpu_tuning.h says so, place the bits straight into a float32,
 * q * 2^-120, against activations x 2^112 more: the same products). The K
 * tail is zero padded (masked loads on AVX-512, a copy into a zeroed buffer
 * on AVX2, explicit zeros in the emulation).
 *
 * Decode streams every weight once. Blocks of at most 16 tokens read row
 * stretches and prefetch each STREAM_PF_BYTES ahead (nt_streams512); the
 * adjacent-row tiles of larger blocks (and the rows the stretches leave) prefetch the
 * same rows one or more tiles ahead (PF_BYTES of weights), clamped to the
 * block's rows, one prefetch per 64 bytes of each row (not one per 16-lane
 * chunk: half of those hit a line already requested, and at 2 tokens the
 * kernel is close to compute-bound on cores that split 512-bit ops), and a
 * block requests its first PF_BYTES up front: prefetching
 * inside the tile being read (the previous scheme, 1 KiB ahead in each row)
 * fetched lines already in flight and left one core at ~20 GB/s.
 *
 * Not here: threading (backend_cpu.c), activation quantisation (activations
 * stay float32 so the CPU path is the exact reference).
 */
#include "ops_matmul.h"
#include "cpu_tuning.h"

#include "ops_draft.h"

#include "ops_lanes.h"

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define MOEQ_MM_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

#define LANES MOEQ_LANES
#define TILE_T 4   /* tokens per AVX-512 register tile                       */
#define TILE_TMAX 6 /* ... and per stream tile of a block of 5-6 tokens (one pass over its rows) */
#define TILE_N 6   /* weight rows per AVX-512 NT tile (nt_tile_shape: few-token blocks)       */
#define TILE_N1 8  /* the most rows a tile holds (blocks of 3 tokens)                         */
#define TILE_N4 6  /* rows per tile of the many-token steps (nt_step_block512)             */
#define TILE_V 4   /* 16-column vectors per AVX-512 NN tile (64 columns)      */
#define TILE_VMAX 16 /* ... and for one token (two: 8), see nn_tile512          */
#define PF_BYTES 8192 /* weight bytes the NT prefetch runs ahead (>= one tile) */
#define STREAM_TOKS 16   /* NT blocks of at most this many tokens read their rows as tile-wide streams   */
#define STREAM_MIN_SPAN 4 /* ... when each stream holds at least this many rows (nt_streams512)          */
#define STREAM_PF_BYTES 1024 /* ... and prefetch each stream this far ahead of the tile's reads              */
#define STREAM_PF_BYTES_L2 2048 /* ... this far when they go into L2 (cpu_tuning.h: AMD Zen 3/4)              */
#define BLK_ROWS 32      /* the many-token path's blocks: rows, tokens, K per step   */
#define BLK_TOKS 64
#define BLK_K 1024
/* Which blocks take it: those of at least BLK_MIN_TOKS tokens (4 fit one tile) when K > BLK_K and this CPU's
 * k_blocked choice says so (cpu_tuning.h), those of at least BLK_MIN_TOKS_ANY when K > BLK_K whatever it says,
 * and F8 blocks of at least BLK_MIN_TOKS_F8 whatever K, or whose scaled activations outgrow the workspace
 * (see F8_FEW_TOKS). */
#define BLK_MIN_TOKS 5
#define BLK_MIN_TOKS_ANY 33
#define BLK_MIN_TOKS_F8 33
/* F8 blocks of fewer tokens take the direct tiles with their activations scaled once per scale block, in the
 * workspace, which holds those of F8_FEW_TOKS tokens whatever K (and of more where K is short). Session 27, Zen 4,
 * one core, F8 from memory, 1,024-2,048 rows x 512-7,168, the two alternated: the direct tiles took 0.67-0.80 of
 * the staged path's time at 8-16 tokens and 0.78-0.97 at 24-32 (with the float16 widening 0.61-0.89 and 0.91-1.0);
 * at 64 tokens the two were even. */
#define F8_FEW_TOKS 16
/* F8: tokens per block, scaled once per step for a whole 128-row scale block. Each part's rows are widened once per
 * block, so a task's 64 tokens (NT_TOKS) in one block widen them once: bench F8 prefill 0.957 (512 tokens) and 0.966
 * (2,048) of the time with 32, Zen 5, 1 thread, alternated in one process. */
#define BLK_TOKS_F8 64
/* The parked accumulators: an F8 block's 4 parts of BLK_TOKS_F8 tokens; the other dtypes' blocks need less. */
#define ACC_BYTES ((size_t)BLK_TOKS_F8 * MOEQ_F8_BLOCK * LANES * sizeof(float))
_Static_assert(BLK_TOKS_F8 * MOEQ_F8_BLOCK >= BLK_TOKS * BLK_ROWS, "ACC_BYTES holds a BF16 block's accumulators");
#define STAGE_W_BYTES ((size_t)BLK_ROWS * BLK_K * 2)
#define STAGE_X_BYTES ((size_t)BLK_TOKS_F8 * BLK_K * sizeof(float))
_Static_assert(BLK_K % MOEQ_F8_BLOCK == 0, "an F8 K step starts on a scale block (nt_scale_x512 from srow + k0 / 128)");

size_t moeq_mm_nt_ws_bytes(int64_t k) {
    /* the many-token path walks K in steps; F8's few-token tiles take their tokens' scaled activations whole */
    size_t blocked = ACC_BYTES + STAGE_W_BYTES + STAGE_X_BYTES;
    size_t f8_few = (size_t)F8_FEW_TOKS * (size_t)(k > 0 ? k : 0) * sizeof(float);
    return blocked > f8_few ? blocked : f8_few;
}

static inline const uint8_t *row_ptr(const moeq_tensor *w, int64_t row) {
    return (const uint8_t *)w->data + (size_t)row * (size_t)moeq_tensor_cols(w) * moeq_dtype_size(w->dtype);
}

static inline size_t esize(moeq_dtype dt) {
    return dt == MOEQ_DTYPE_F32 ? 4 : (dt == MOEQ_DTYPE_F8_E4M3 || dt == MOEQ_DTYPE_Q8R ? 1 : 2);
}

/* F8 block scales of the 128-row block holding `row` (NULL for other dtypes). */
static inline const float *scale_row(const moeq_tensor *w, int64_t row) {
    if (w->dtype != MOEQ_DTYPE_F8_E4M3 || !w->scale_inv) return NULL;
    int64_t ncb = (moeq_tensor_cols(w) + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK;
    return (const float *)w->scale_inv->data + (row / MOEQ_F8_BLOCK) * ncb;
}

/* The first PF_BYTES of a block, requested up front: the tiles' prefetch streams start that far ahead. */
static inline void prefetch_head(const uint8_t *base, int64_t row_bytes, int64_t n0, int64_t n1) {
    int64_t bytes = (n1 - n0) * row_bytes;
    const char *p = (const char *)(base + n0 * row_bytes);
    for (int64_t off = 0; off < bytes && off < PF_BYTES; off += 64) __builtin_prefetch(p + off, 0, 3);
}

/*
 * The tile rows' pointers, and where each row's prefetch goes: the same row
 * `ahead` tiles on (ahead * tn rows; at least PF_BYTES of weights), clamped
 * to the last row of the block so a task never pulls in another's rows.
 * base: row 0 of the job; row_bytes: one weight row.
 */
static inline __attribute__((always_inline)) void tile_rows(const moeq_mm_job *job, const uint8_t *base,
                                                           int64_t row_bytes, int64_t n, int nr, int tn, int64_t n1,
                                                           const uint8_t **wp, const float **sp, const uint8_t **pp) {
    int64_t ahead = (PF_BYTES + tn * row_bytes - 1) / (tn * row_bytes);
    for (int j = 0; j < tn; j++) {
        int64_t row = n + (j < nr ? j : 0), pf = n + ahead * tn + (j < nr ? j : 0);
        wp[j] = base + row * row_bytes;
        sp[j] = scale_row(job->w, job->row0 + row);
        pp[j] = base + (pf < n1 ? pf : n1 - 1) * row_bytes;
    }
}

/* Rows of the next NT tile with `left` rows to go: tn, but 6-row tiles end a run of 7 or 8 as 4 + 3 or 4 + 4
 * (a 32-row block is 6+6+6+6+4+4, not ...+6+2: a 2-row tile does 8 fmas per 6 loads). */
static inline int tile_rows_at(int64_t left, int tn) {
    if (tn == 6 && (left == 7 || left == 8)) return 4;
    return (int)(left < tn ? left : tn);
}

/* ---- scalar emulation (also the fallback) --------------------------------- */

static float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0x1f) bits = s | 0x7f800000u | (m << 13);
    else if (e != 0) bits = s | ((e + 112) << 23) | (m << 13);
    else {
        float f = (float)m * 0x1p-24f;
        memcpy(&bits, &f, 4);
        bits |= s;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* One weight element widened exactly as the vector paths do. */
static inline float wscalar(moeq_dtype dt, const uint8_t *p, const float *srow, int64_t k) {
    uint32_t bits;
    float f;
    switch (dt) {
    case MOEQ_DTYPE_F32: memcpy(&f, p + 4 * k, 4); return f;
    case MOEQ_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, p + 2 * k, 2);
        bits = (uint32_t)h << 16;
        memcpy(&f, &bits, 4);
        return f;
    }
    case MOEQ_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * k, 2);
        return f16_to_f32(h);
    }
    case MOEQ_DTYPE_F8_E4M3: {
        uint32_t b = p[k];
        bits = ((b & 0x80u) << 24) | ((b & 0x7fu) << 20);
        memcpy(&f, &bits, 4);
        return (f * 0x1p120f) * (srow ? srow[k / MOEQ_F8_BLOCK] : 1.0f);
    }
    case MOEQ_DTYPE_Q8R: break; /* 16-row groups: moeq_q8r_value */
    }
    return 0.0f;
}

/* e4m3 -> f16 by bit placement (sign to bit 15, exponent+mantissa to bits 7..13): the f16 value is the
 * f8 value / 256 for normals and subnormals alike, so vcvtph2ps widens it without denormal stalls. */
static inline uint16_t f8_to_f16_bits(uint8_t b) { return (uint16_t)(((b & 0x80u) << 8) | ((b & 0x7fu) << 7)); }

/*
 * The NT kernels' F8 operands: the weight as q / 256 (exact) and the activation as x * (256 * scale)
 * (one rounding), so the product is x * scale * q with the scale on the activation side. The block
 * scale is shared by the 128 rows of a block, so a tile multiplies each activation chunk once for all
 * its rows, and a step of many tokens widens each weight to f16 once (ops_matmul.h).
 */
static inline float nt_x_factor(const float *srow, int64_t k) { return 256.0f * (srow ? srow[k / MOEQ_F8_BLOCK] : 1.0f); }

/* Lanes past K get fma(0, 0, lane), as the vector paths' zero padding does (it turns a -0 lane into +0). */
void moeq_mm_nt_block_scalar(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1) {
    const moeq_tensor *w = job->w;
    if (w->dtype == MOEQ_DTYPE_Q8R) { /* draft copies: the int8 element of ops_draft.h on every path */
        moeq_draft_nt_block_ref(job, n0, n1, t0, t1);
        return;
    }
    int64_t K = moeq_tensor_cols(w);
    const int f8 = w->dtype == MOEQ_DTYPE_F8_E4M3;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *p = row_ptr(w, job->row0 + n);
        const float *srow = scale_row(w, job->row0 + n);
        for (int64_t t = t0; t < t1; t++) {
            const float *x = job->x + t * job->ldx;
            float lanes[LANES] = {0};
            for (int64_t k = 0; k < K; k += LANES)
                for (int l = 0; l < LANES; l++) {
                    if (k + l >= K) {
                        lanes[l] = fmaf(0.0f, 0.0f, lanes[l]);
                        continue;
                    }
                    float xv = x[k + l], wv;
                    if (f8) xv *= nt_x_factor(srow, k + l), wv = f16_to_f32(f8_to_f16_bits(p[k + l]));
                    else wv = wscalar(w->dtype, p, srow, k + l);
                    lanes[l] = fmaf(xv, wv, lanes[l]);
                }
            job->y[t * job->ldy + n] = moeq_tree16(lanes);
        }
    }
}

void moeq_mm_nn_block_scalar(const moeq_mm_job *job, int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    const moeq_tensor *w = job->w;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t c = c0; c < c1; c++) {
            float acc = 0.0f;
            for (int64_t r = 0; r < job->n_rows; r++) {
                int64_t row = job->row0 + r;
                float wv = w->dtype == MOEQ_DTYPE_Q8R ? moeq_q8r_value(w, row, c)
                                                      : wscalar(w->dtype, row_ptr(w, row), scale_row(w, row), c);
                acc = fmaf(job->x[t * job->ldx + r], wv, acc);
            }
            job->y[t * job->ldy + c] = acc;
        }
}

static float dot_scalar(const float *a, const float *b, int64_t n) {
    float lanes[LANES] = {0};
    for (int64_t k = 0; k < n; k += LANES)
        for (int l = 0; l < LANES; l++)
            lanes[l] = k + l < n ? fmaf(a[k + l], b[k + l], lanes[l]) : fmaf(0.0f, 0.0f, lanes[l]);
    return moeq_tree16(lanes);
}

#ifdef MOEQ_MM_X86
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define T256 __attribute__((target("avx2,fma,f16c")))

/* ---- AVX-512 ---------------------------------------------------------------- */

static T512 ALWAYS_INLINE __m512 wload512(moeq_dtype dt, const uint8_t *p, const float *srow, int64_t k,
                                          __mmask16 m) {
    const int full = m == (__mmask16)0xFFFF; /* a constant in the main loop: plain loads */
    switch (dt) {
    case MOEQ_DTYPE_F32: return full ? _mm512_loadu_ps((const float *)p + k) : _mm512_maskz_loadu_ps(m, (const float *)p + k);
    case MOEQ_DTYPE_BF16: {
        __m256i v = full ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + k))
                         : _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + k);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    }
    case MOEQ_DTYPE_F16:
        return _mm512_cvtph_ps(full ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + k))
                                    : _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + k));
    case MOEQ_DTYPE_F8_E4M3: {
        /* e4m3 -> f16 by bit placement (sign to bit 15, exponent+mantissa to bits 7..14): the f16 value is
         * the f8 value / 256 for normals and subnormals alike, widened by vcvtph2ps without denormal stalls */
        __m128i b = full ? _mm_loadu_si128((const __m128i *)(p + k)) : _mm_maskz_loadu_epi8(m, p + k);
        __m256i h = _mm256_cvtepu8_epi16(b);
        h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8),
                            _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7f)), 7));
        __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
        return _mm512_mul_ps(f, _mm512_set1_ps(srow ? srow[k / MOEQ_F8_BLOCK] : 1.0f));
    }
    case MOEQ_DTYPE_Q8R: break; /* the draft kernels' (ops_draft.h) */
    }
    return _mm512_setzero_ps();
}

/*
 * 16 e4m3 bytes as f16 bits (f8_to_f16_bits): sign-extended to 16 bits and shifted left by 7, the sign lands
 * on bit 15 and the exponent and mantissa on bits 7..13; bit 14 (a copy of the sign) is masked off.
 */
static T512 ALWAYS_INLINE __m256i f8_to_f16_256(__m128i b) {
    return _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16((short)0xBF80));
}

/*
 * 16 e4m3 bytes straight into float32 bits: sign-extended to 32 bits and shifted left by 20, the sign lands on
 * bit 31 and the exponent and mantissa on bits 20..26 (the foot of float32's exponent, the head of its
 * mantissa); bits 27..30 (copies of the sign) are masked off. The value is q * 2^-120 for normals and
 * subnormals alike (those become float32 denormals, exact): three integer ops and no conversion.
 */
static T512 ALWAYS_INLINE __m512 f8_to_f32_512(__m128i b) {
    __m512i d = _mm512_slli_epi32(_mm512_cvtepi8_epi32(b), 20);
    return _mm512_castsi512_ps(_mm512_and_si512(d, _mm512_set1_epi32((int)0x87F00000u)));
}

/* The NT kernels' weight chunk: as wload512, but F8 as q / 256, or as q * 2^-120 with w32 (its scale goes on the
 * activations: nt_scale_x512). */
static T512 ALWAYS_INLINE __m512 wload512_nt(moeq_dtype dt, const uint8_t *p, int64_t k, __mmask16 m, const int w32) {
    if (dt != MOEQ_DTYPE_F8_E4M3) return wload512(dt, p, NULL, k, m);
    const int full = m == (__mmask16)0xFFFF;
    __m128i b = full ? _mm_loadu_si128((const __m128i *)(p + k)) : _mm_maskz_loadu_epi8(m, p + k);
    return w32 ? f8_to_f32_512(b) : _mm512_cvtph_ps(f8_to_f16_256(b));
}

/*
 * F8's activations for the rows of one 128-row scale block (srow: its scales), once per block rather than once
 * per tile and K step: xs[i][k] = x[i][k] * 256 * scale (what the emulation multiplies q / 256 by), tokens
 * [0, ntok) at x (stride ldx), K columns (srow's first scale is column 0's), xs with stride ldxs; the staged
 * path scales each K step with it. The multiply came to a sixth of a 4-token tile's ops. With w32 the result is
 * multiplied by 2^112 more, exactly (denormals included), so that q * 2^-120 times it is the same product, bit
 * for bit, as long as nothing overflows: when some |x * 256 * scale| >= 2^16 it stays as it is. Returns whether
 * the 2^112 went on, i.e. which widening the tiles must use.
 */
static T512 int nt_scale_x512(const float *srow, const float *x, int64_t ldx, int64_t ntok, int64_t K, float *xs,
                              int64_t ldxs, int w32) {
    __m512 big = _mm512_setzero_ps(); /* |x * 256 * scale|, largest (a NaN sticks: the f16 form then) */
    for (int64_t i = 0; i < ntok; i++) {
        const float *xi = x + i * ldx;
        float *o = xs + i * ldxs;
        for (int64_t k = 0; k < K; k += LANES) {
            __mmask16 m = K - k >= LANES ? (__mmask16)0xFFFF : moeq_tail_mask16(K - k);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + k), _mm512_set1_ps(nt_x_factor(srow, k)));
            big = _mm512_max_ps(_mm512_abs_ps(v), big);
            _mm512_mask_storeu_ps(o + k, m, v);
        }
    }
    if (!w32 || !(_mm512_reduce_max_ps(big) < 0x1p16f)) return 0;
    for (int64_t i = 0; i < ntok; i++)
        for (int64_t k = 0; k < K; k += LANES) {
            __mmask16 m = K - k >= LANES ? (__mmask16)0xFFFF : moeq_tail_mask16(K - k);
            float *o = xs + i * ldxs + k;
            _mm512_mask_storeu_ps(o, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, o), _mm512_set1_ps(0x1p112f)));
        }
    return 1;
}

/*
 * (mr tokens) x (nr weight rows) dot products over the whole K; pp: where each row's prefetch stream runs.
 * F8: the tile's rows share one 128-row block, whose scaled activations x is (nt_scale_x512; w32 as it said).
 */
static T512 ALWAYS_INLINE void nt_tile512(const int mr, const int nr, const moeq_dtype dt, const float *x,
                                          int64_t ldx, const uint8_t *const *wp, const uint8_t *const *pp, int64_t K,
                                          float *y, int64_t ldy, const int64_t *col, const int l2, const int w32) {
    __m512 acc[TILE_TMAX][TILE_N1];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
    const size_t esz = esize(dt);
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) { /* full chunks: unmasked loads, weights prefetched ahead */
        __m512 xv[TILE_TMAX];
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) xv[i] = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            if (pp && (esz >= 4 || ((size_t)k * esz) % 64 == 0)) /* one prefetch per 64-byte stride of the row */
                moeq_cpu_stream_prefetch(pp[j] + (size_t)k * esz, l2);
            __m512 wv = wload512_nt(dt, wp[j], k, (__mmask16)0xFFFF, w32);
#pragma GCC unroll 8
            for (int i = 0; i < mr; i++) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
    if (k < K) { /* the tail: zero lanes add +0, as the emulation does */
        __mmask16 m = moeq_tail_mask16(K - k);
        __m512 xv[TILE_TMAX];
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) xv[i] = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            __m512 wv = wload512_nt(dt, wp[j], k, m, w32);
#pragma GCC unroll 8
            for (int i = 0; i < mr; i++) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) y[i * ldy + (col ? col[j] : j)] = moeq_hsum512(acc[i][j]);
}

#define NT512(MR, NR)                                                                                        \
    case (MR)*16 + (NR): nt_tile512(MR, NR, dt, x, ldx, wp, pp, K, y, ldy, NULL, l2, w32); break;
#define NTR512(MR, NR)                                                                                       \
    case (MR)*16 + (NR): nt_tile512(MR, NR, dt, x, ldx, wp, pp, K, y, ldy, col, l2, w32); break;

/*
 * Rows [n0, n1) in tiles of adjacent rows: 8 per tile for blocks of 1-3 tokens, 6 otherwise (more weight
 * streams in flight, no spills), token tiles of 4. F8 tiles end at 128-row block edges (one scale row per
 * tile). pf: each tile prefetches the rows PF_BYTES on (tile_rows).
 */
static T512 ALWAYS_INLINE void nt_rows512(const moeq_dtype dt, const moeq_mm_job *job, int64_t n0, int64_t n1,
                                          int64_t t0, int64_t t1, int tn, int tt, const int l2, const int w32) {
    int64_t K = moeq_tensor_cols(job->w), ldx = job->ldx, ldy = job->ldy, row_bytes = K * (int64_t)esize(dt);
    const uint8_t *base = row_ptr(job->w, job->row0);
    for (int64_t n = n0, next; n < n1; n = next) {
        int nr = tile_rows_at(n1 - n, tn);
        if (dt == MOEQ_DTYPE_F8_E4M3) {
            int64_t edge = MOEQ_F8_BLOCK - (job->row0 + n) % MOEQ_F8_BLOCK;
            if (nr > edge) nr = (int)edge;
        }
        next = n + nr;
        const uint8_t *wp[TILE_N1] = {0}, *pp[TILE_N1] = {0}; /* tn of them set: the tile reads nr <= tn */
        const float *sp[TILE_N1] = {0};                          /* (the AVX2 tiles' scales; F8's x is scaled) */
        tile_rows(job, base, row_bytes, n, nr, tn, n1, wp, sp, pp);
        for (int64_t t = t0; t < t1; t += tt) {
            int mr = (int)(t1 - t < tt ? t1 - t : tt);
            const float *x = job->x + t * ldx;
            float *y = job->y + t * ldy + n;
            switch (mr * 16 + nr) {
                NT512(1, 1) NT512(1, 2) NT512(1, 3) NT512(1, 4) NT512(1, 5) NT512(1, 6) NT512(1, 7) NT512(1, 8)
                NT512(2, 1) NT512(2, 2) NT512(2, 3) NT512(2, 4) NT512(2, 5) NT512(2, 6) NT512(2, 7) NT512(2, 8)
                NT512(3, 1) NT512(3, 2) NT512(3, 3) NT512(3, 4) NT512(3, 5) NT512(3, 6) NT512(3, 7) NT512(3, 8)
                NT512(4, 1) NT512(4, 2) NT512(4, 3) NT512(4, 4) NT512(4, 5) NT512(4, 6)
                NT512(5, 1) NT512(5, 2) NT512(5, 3) NT512(5, 4) NT512(6, 1) NT512(6, 2) NT512(6, 3) NT512(6, 4)
            }
        }
    }
}

/*
 * Few tokens: the tn rows of a tile come one from each of tn equal stretches of rows [a, b) (row a + j*span
 * + i, j < tn), so every row a tile reads continues a long sequential stream of its own, where adjacent rows
 * make tn runs of one row (1-2 KiB) that restart with every tile. The hardware prefetcher follows long
 * streams and not short ones: on an AMD Zen 4 VM (one core, a 265 MB lm_head, one token) adjacent rows with
 * the software prefetch streamed 12-13 GB/s, the stretches without it 22-24 GB/s (a plain sequential read
 * 22-25). Each stream is also prefetched STREAM_PF_BYTES ahead of its reads (into the stream's next row near a
 * row's end): the hardware prefetcher alone fell behind once a chunk carries more than one token's fmas. On an
 * AMD Zen 5 VM (session 18, one core, in-process A/B) BF16 at 2 tokens went 22-25 -> 31 GB/s (K 2,048-7,168),
 * at 1 token 27-28 -> 30-32 (K = 1,024: no change), F8 at 4 tokens 13 -> 15; 512 bytes ahead gained less,
 * 2-8 KiB nothing. Which rows share a tile changes no element's chain of fmas, so the bits stay. F8: [a, b)
 * lies in one 128-row scale block (one scale row per tile). Returns the first row not covered (fewer than tn
 * rows are left; the caller's tiles take them).
 */
static T512 ALWAYS_INLINE int64_t nt_streams512(const moeq_dtype dt, const moeq_mm_job *job, int64_t a, int64_t b,
                                                int64_t t0, int64_t t1, int tn, int tt, const int l2, const int w32) {
    int64_t span = (b - a) / tn;
    if (span < STREAM_MIN_SPAN) return a;
    int64_t K = moeq_tensor_cols(job->w), ldx = job->ldx, ldy = job->ldy, row_bytes = K * (int64_t)esize(dt);
    const uint8_t *base = row_ptr(job->w, job->row0);
    const uint8_t *pf_last = base + (a + span * tn - 1) * row_bytes; /* prefetches stay in the stretches' rows */
    for (int64_t i = 0; i < span; i++) {
        const uint8_t *wp[TILE_N1];
        int64_t col[TILE_N1];
        const uint8_t *pp[TILE_N1];
        for (int j = 0; j < tn; j++) {
            col[j] = j * span + i;
            wp[j] = base + (a + col[j]) * row_bytes;
            const int64_t ahead = l2 ? STREAM_PF_BYTES_L2 : STREAM_PF_BYTES;
            pp[j] = wp[j] + ahead < pf_last ? wp[j] + ahead : pf_last;
        }
        for (int64_t t = t0; t < t1; t += tt) {
            int mr = (int)(t1 - t < tt ? t1 - t : tt);
            const float *x = job->x + t * ldx;
            float *y = job->y + t * ldy + a;
            switch (mr * 16 + tn) { /* the shapes nt_tile_shape gives, and the 4-token passes' remainders */
                NTR512(1, 4) NTR512(2, 4) NTR512(3, 8) NTR512(4, 6) NTR512(5, 4) NTR512(6, 4)
                NTR512(1, 6) NTR512(2, 6) NTR512(3, 6)
            }
        }
    }
    return a + span * tn;
}

/*
 * The register tile of a block of `tokens` (<= STREAM_TOKS): *tn rows (streams) x *tt tokens a pass. Measured
 * on a Zen 5 VM (session 20, one core, an A/B of the batch-32 step's expert products in one process, BF16 from
 * memory, ratios of medians over 8-12 alternations): 1-2 tokens on 4 streams instead of 8, 0.83-0.86 of the
 * time (eight streams 1 KiB ahead each kept more lines in flight than one core sustains); 5-6 tokens in one
 * pass of 5 x 4 or 6 x 4 accumulators instead of a 4-token pass and a second over the same rows, 0.86 (the
 * second pass left the memory idle). 3 tokens (8 rows), 4 (6 rows) and 7-8 (passes of 4: 7 x 3 the same,
 * 8 x 3 spills and was slower) kept their shapes: the others were within noise or slower. Which rows and
 * tokens share a tile changes no element's chain, so no bits.
 */
static inline void nt_tile_shape(int64_t tokens, int *tn, int *tt) {
    *tt = TILE_T;
    *tn = tokens <= 2 ? 4 : tokens == 3 ? TILE_N1 : TILE_N;
    if (tokens == 5 || tokens == 6) *tt = (int)tokens, *tn = 4;
}

/* Rows [n0, n1) and tokens [t0, t1) of one job, in the tiles for its number of tokens. F8: [n0, n1) lies in one
 * 128-row scale block and job->x holds its scaled activations (w32: which widening they were scaled for). */
static T512 ALWAYS_INLINE void nt_rows_of512(const moeq_dtype dt, const moeq_mm_job *job, int64_t n0, int64_t n1,
                                             int64_t t0, int64_t t1, const int l2, const int w32) {
    if (t1 - t0 > STREAM_TOKS) {
        int64_t row_bytes = moeq_tensor_cols(job->w) * (int64_t)esize(dt);
        prefetch_head(row_ptr(job->w, job->row0), row_bytes, n0, n1);
        nt_rows512(dt, job, n0, n1, t0, t1, TILE_N, TILE_T, l2, w32);
        return;
    }
    int tn, tt;
    nt_tile_shape(t1 - t0, &tn, &tt);
    nt_rows512(dt, job, nt_streams512(dt, job, n0, n1, t0, t1, tn, tt, l2, w32), n1, t0, t1, tn, tt, l2, w32);
}

/* F8, one scale block at a time: its activations scaled into xs ((t1 - t0) x K floats), then its tiles. */
static T512 ALWAYS_INLINE void nt_block512_f8(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1,
                                              float *xs, const int l2) {
    const int64_t K = moeq_tensor_cols(job->w);
    const int widen32 = moeq_cpu_f8_widen32();
    moeq_mm_job scaled = *job; /* tokens from 0: xs holds [t0, t1) */
    scaled.x = xs, scaled.ldx = K, scaled.y = job->y + t0 * job->ldy, scaled.n_tok = t1 - t0;
    for (int64_t a = n0, b; a < n1; a = b) {
        b = a + MOEQ_F8_BLOCK - (job->row0 + a) % MOEQ_F8_BLOCK;
        if (b > n1) b = n1;
        const float *srow = scale_row(job->w, job->row0 + a);
        if (nt_scale_x512(srow, job->x + t0 * job->ldx, job->ldx, t1 - t0, K, xs, K, widen32))
            nt_rows_of512(MOEQ_DTYPE_F8_E4M3, &scaled, a, b, 0, t1 - t0, l2, 1);
        else nt_rows_of512(MOEQ_DTYPE_F8_E4M3, &scaled, a, b, 0, t1 - t0, l2, 0);
    }
}

/* F8's few-token tiles with xs, a (t1 - t0) x K float scratch: the workspace's (moeq_mm_nt_block_ws), else one
 * allocated for the call (moeq_mm_nt_block: tests, the ISA comparisons), else the emulation. */
static T512 void nt_block512_f8_ws(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1,
                                   float *xs) {
    float *own = NULL;
    if (!xs && !(xs = own = malloc((size_t)(t1 - t0) * (size_t)moeq_tensor_cols(job->w) * sizeof(float)))) {
        moeq_mm_nt_block_scalar(job, n0, n1, t0, t1);
        return;
    }
    if (moeq_cpu_stream_l2()) nt_block512_f8(job, n0, n1, t0, t1, xs, 1);
    else nt_block512_f8(job, n0, n1, t0, t1, xs, 0);
    free(own);
}

/*
 * Many tokens: blocks of BLK_ROWS rows x BLK_TOKS tokens, K in steps of BLK_K, each tile's 16-lane
 * accumulators kept in the workspace between steps. A step's weights (BLK_ROWS x BLK_K) and activations
 * (BLK_TOKS x BLK_K) stay in L2 however long K is, while a tile's rows stay in L1 across the block's tokens.
 * The lanes carry on exactly where they stopped, so every element is the same chain of fmas and the same
 * tree as in the direct tiles: the bits do not change. F8 is staged per step: the rows widened once to f16
 * (q / 256, exact) and the activations scaled once (x * 256 * scale) — the direct F8 tiles' operands — and
 * the F16 tiles run over them, instead of widening every weight again for every 4 tokens.
 */
static T512 ALWAYS_INLINE void nt_tile512_step(const int mr, const int nr, const moeq_dtype dt, const float *x,
                                               int64_t ldx, const uint8_t *const *wp, const uint8_t *const *pf,
                                               int64_t L, int first, int last, float *accs, float *y,
                                               int64_t ldy) {
    const size_t esz = esize(dt);
    __m512 acc[TILE_T][TILE_N4];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++)
            acc[i][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(accs + (i * BLK_ROWS + j) * LANES);
    int64_t k = 0;
    for (; k + LANES <= L; k += LANES) {
        __m512 xv[TILE_T];
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) xv[i] = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            if (pf && (esz >= 4 || ((size_t)k * esz) % 64 == 0)) /* the next rows' step, while this one runs */
                _mm_prefetch((const char *)pf[j] + (size_t)k * esz, _MM_HINT_T0);
            __m512 wv = wload512_nt(dt, wp[j], k, (__mmask16)0xFFFF, 0);
#pragma GCC unroll 8
            for (int i = 0; i < mr; i++) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
    if (k < L) { /* K's tail (the last step only): zero lanes add +0, as the emulation does */
        __mmask16 m = moeq_tail_mask16(L - k);
        __m512 xv[TILE_T];
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) xv[i] = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            __m512 wv = wload512_nt(dt, wp[j], k, m, 0);
#pragma GCC unroll 8
            for (int i = 0; i < mr; i++) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nr; j++) {
            if (last) y[i * ldy + j] = moeq_hsum512(acc[i][j]);
            else _mm512_storeu_ps(accs + (i * BLK_ROWS + j) * LANES, acc[i][j]);
        }
}

#define NTS512(MR, NR)                                                                                        \
    case (MR)*16 + (NR): nt_tile512_step(MR, NR, dt, x, ldx, wp, t ? NULL : pf, L, first, last, accs, y, ldy); break;

/* One K step of a block: rows [0, nrows) at w (row stride wstride bytes), tokens [0, ntok) at x (stride ldx). */
static T512 ALWAYS_INLINE void nt_step_block512(const moeq_dtype dt, const uint8_t *w, int64_t wstride, int nrows,
                                                const float *xb, int64_t ldx, int ntok, int64_t L, int first,
                                                int last, float *acc_base, float *yb, int64_t ldy) {
    for (int n = 0, nr; n < nrows; n += nr) {
        nr = tile_rows_at(nrows - n, TILE_N4);
        const uint8_t *wp[TILE_N4], *pf[TILE_N4]; /* pf: the next row group's (the first token tile fetches it) */
        for (int j = 0; j < TILE_N4; j++) {
            int64_t next = n + TILE_N4 + j < nrows ? n + TILE_N4 + j : nrows - 1;
            wp[j] = w + (int64_t)(n + (j < nr ? j : 0)) * wstride;
            pf[j] = w + next * wstride;
        }
        for (int t = 0; t < ntok; t += TILE_T) {
            int mr = ntok - t < TILE_T ? ntok - t : TILE_T;
            const float *x = xb + t * ldx;
            float *accs = acc_base + ((int64_t)t * BLK_ROWS + n) * LANES, *y = yb + t * ldy + n;
            switch (mr * 16 + nr) {
                NTS512(1, 1) NTS512(1, 2) NTS512(1, 3) NTS512(1, 4) NTS512(1, 5) NTS512(1, 6)
                NTS512(2, 1) NTS512(2, 2) NTS512(2, 3) NTS512(2, 4) NTS512(2, 5) NTS512(2, 6)
                NTS512(3, 1) NTS512(3, 2) NTS512(3, 3) NTS512(3, 4) NTS512(3, 5) NTS512(3, 6)
                NTS512(4, 1) NTS512(4, 2) NTS512(4, 3) NTS512(4, 4) NTS512(4, 5) NTS512(4, 6)
            }
        }
    }
}

/* F8: per 128-row scale block and BLK_TOKS_F8 tokens, each K step scales the activations once and widens
 * each 32-row part's weights once; every part keeps its own accumulators. */
static T512 void nt_blocked512_f8(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1, void *ws) {
    const moeq_tensor *w = job->w;
    const int64_t K = moeq_tensor_cols(w);
    float *accs = ws;
    uint16_t *wh = (uint16_t *)((uint8_t *)ws + ACC_BYTES);
    float *xs = (float *)((uint8_t *)wh + STAGE_W_BYTES);
    const int64_t part_acc = (int64_t)BLK_TOKS_F8 * BLK_ROWS * LANES;
    for (int64_t ra = n0, rb; ra < n1; ra = rb) {
        rb = ra + MOEQ_F8_BLOCK - (job->row0 + ra) % MOEQ_F8_BLOCK;
        if (rb > n1) rb = n1;
        const float *srow = scale_row(w, job->row0 + ra);
        for (int64_t tb = t0; tb < t1; tb += BLK_TOKS_F8) {
            int64_t te = tb + BLK_TOKS_F8 < t1 ? tb + BLK_TOKS_F8 : t1;
            for (int64_t k0 = 0; k0 < K; k0 += BLK_K) {
                int64_t L = K - k0 < BLK_K ? K - k0 : BLK_K;
                int first = k0 == 0, last = k0 + L == K;
                /* the tokens' step scaled: x * 256 * scale (k0 is a multiple of the scale block) */
                nt_scale_x512(srow ? srow + k0 / MOEQ_F8_BLOCK : NULL, job->x + tb * job->ldx + k0, job->ldx,
                              te - tb, L, xs, BLK_K, 0);
                for (int64_t nb = ra, part = 0; nb < rb; nb += BLK_ROWS, part++) {
                    int64_t ne = nb + BLK_ROWS < rb ? nb + BLK_ROWS : rb;
                    /* the rows staged next, prefetched while these are widened (a part's rows are 32 short
                     * strided runs the hardware prefetcher does not follow): this step's next part, else the
                     * next step's first, else the next token block's, else the next scale block's */
                    int64_t pf_row = -1, pf_k0 = 0, pf_end = 0;
                    if (ne < rb) pf_row = ne, pf_k0 = k0, pf_end = rb;
                    else if (k0 + BLK_K < K) pf_row = ra, pf_k0 = k0 + BLK_K, pf_end = rb;
                    else if (te < t1) pf_row = ra, pf_end = rb;
                    else if (rb < n1) pf_row = rb, pf_end = n1;
                    if (pf_end > pf_row + BLK_ROWS) pf_end = pf_row + BLK_ROWS;
                    const int64_t pf_len = K - pf_k0 < BLK_K ? K - pf_k0 : BLK_K;
                    for (int64_t r = nb; r < ne; r++) { /* the part's rows, this step, as f16: q / 256 */
                        const uint8_t *src = row_ptr(w, job->row0 + r) + k0;
                        uint16_t *dst = wh + (r - nb) * BLK_K;
                        int64_t pr = pf_row + (r - nb);
                        if (pf_row >= 0 && pr < pf_end) {
                            const char *pf = (const char *)row_ptr(w, job->row0 + pr) + pf_k0;
                            for (int64_t off = 0; off < pf_len; off += 64) _mm_prefetch(pf + off, _MM_HINT_T0);
                        }
                        int64_t k = 0;
                        for (; k + 32 <= L; k += 32) {
                            __m512i h = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(src + k)));
                            h = _mm512_and_si512(_mm512_slli_epi16(h, 7), _mm512_set1_epi16((short)0xBF80));
                            _mm512_storeu_si512(dst + k, h);
                        }
                        for (; k < L; k++) dst[k] = f8_to_f16_bits(src[k]);
                    }
                    nt_step_block512(MOEQ_DTYPE_F16, (const uint8_t *)wh, BLK_K * 2, (int)(ne - nb), xs, BLK_K,
                                     (int)(te - tb), L, first, last, accs + part * part_acc,
                                     job->y + tb * job->ldy + nb, job->ldy);
                }
            }
        }
    }
}

static T512 ALWAYS_INLINE void nt_blocked512_dt(const moeq_dtype dt, const moeq_mm_job *job, int64_t n0,
                                                int64_t n1, int64_t t0, int64_t t1, void *ws) {
    const int64_t K = moeq_tensor_cols(job->w), row_bytes = K * (int64_t)esize(dt);
    for (int64_t nb = n0; nb < n1; nb += BLK_ROWS) {
        int64_t ne = nb + BLK_ROWS < n1 ? nb + BLK_ROWS : n1;
        const uint8_t *wrow = row_ptr(job->w, job->row0 + nb);
        for (int64_t tb = t0; tb < t1; tb += BLK_TOKS) {
            int64_t te = tb + BLK_TOKS < t1 ? tb + BLK_TOKS : t1;
            for (int64_t k0 = 0; k0 < K; k0 += BLK_K) {
                int64_t L = K - k0 < BLK_K ? K - k0 : BLK_K;
                nt_step_block512(dt, wrow + k0 * (int64_t)esize(dt), row_bytes, (int)(ne - nb),
                                 job->x + tb * job->ldx + k0, job->ldx, (int)(te - tb), L, k0 == 0, k0 + L == K, ws,
                                 job->y + tb * job->ldy + nb, job->ldy);
            }
        }
    }
}

static T512 void nt_blocked512(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1, void *ws) {
    switch (job->w->dtype) {
    case MOEQ_DTYPE_F32: nt_blocked512_dt(MOEQ_DTYPE_F32, job, n0, n1, t0, t1, ws); break;
    case MOEQ_DTYPE_BF16: nt_blocked512_dt(MOEQ_DTYPE_BF16, job, n0, n1, t0, t1, ws); break;
    case MOEQ_DTYPE_F16: nt_blocked512_dt(MOEQ_DTYPE_F16, job, n0, n1, t0, t1, ws); break;
    case MOEQ_DTYPE_F8_E4M3: nt_blocked512_f8(job, n0, n1, t0, t1, ws); break;
    case MOEQ_DTYPE_Q8R: moeq_draft_nt_block_ref(job, n0, n1, t0, t1); break; /* not reached: see below */
    }
}

/* One instantiation per dtype and prefetch level (moeq_cpu_stream_l2: a constant inside, so each tile issues one
 * kind of prefetch); F8's also per widening (nt_block512_f8). */
static T512 void nt_block512(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1) {
    const int l2 = moeq_cpu_stream_l2();
#define NT_DT(DT) l2 ? nt_rows_of512(DT, job, n0, n1, t0, t1, 1, 0) : nt_rows_of512(DT, job, n0, n1, t0, t1, 0, 0)
    switch (job->w->dtype) {
    case MOEQ_DTYPE_F32: NT_DT(MOEQ_DTYPE_F32); break;
    case MOEQ_DTYPE_BF16: NT_DT(MOEQ_DTYPE_BF16); break;
    case MOEQ_DTYPE_F16: NT_DT(MOEQ_DTYPE_F16); break;
    case MOEQ_DTYPE_F8_E4M3: nt_block512_f8_ws(job, n0, n1, t0, t1, NULL); break;
    case MOEQ_DTYPE_Q8R: moeq_draft_nt_block_ref(job, n0, n1, t0, t1); break;
    }
#undef NT_DT
}

/*
 * (mr tokens) x (nv 16-column vectors starting at column c): y = x W, r ascending. Vectors past c1 get an empty
 * mask (no load, no store). Few tokens take wide tiles (16 vectors for one token, 8 for two): each weight row is
 * then read as one contiguous run, which the hardware prefetcher streams; 64-column tiles over a decode-sized
 * job (MLA absorption: 64 rows of 512 bytes) read 128 bytes per row with a stride and waited on DRAM latency.
 */
static T512 ALWAYS_INLINE void nn_tile512(const int mr, const int nv, const moeq_dtype dt, const moeq_mm_job *job,
                                          int64_t t, int64_t c, int64_t c1) {
    const moeq_tensor *w = job->w;
    __m512 acc[TILE_T][TILE_VMAX];
    __mmask16 m[TILE_VMAX];
#pragma GCC unroll 16
    for (int v = 0; v < nv; v++) {
        m[v] = moeq_tail_mask16(c1 - (c + v * LANES));
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) acc[i][v] = _mm512_setzero_ps();
    }
    /* No calls in the row loop: a call clobbers every zmm and spills the tile. */
    const int64_t rb = moeq_tensor_cols(w) * (int64_t)esize(dt);
    const uint8_t *base = (const uint8_t *)w->data + job->row0 * rb;
    for (int64_t r = 0; r < job->n_rows; r++) {
        const uint8_t *p = base + r * rb;
        const float *srow = dt == MOEQ_DTYPE_F8_E4M3 ? scale_row(w, job->row0 + r) : NULL;
        __m512 xb[TILE_T];
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) xb[i] = _mm512_set1_ps(job->x[(t + i) * job->ldx + r]);
#pragma GCC unroll 16
        for (int v = 0; v < nv; v++) {
            __m512 wv = wload512(dt, p, srow, c + v * LANES, m[v]);
#pragma GCC unroll 4
            for (int i = 0; i < mr; i++) acc[i][v] = _mm512_fmadd_ps(xb[i], wv, acc[i][v]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 16
        for (int v = 0; v < nv; v++) _mm512_mask_storeu_ps(job->y + (t + i) * job->ldy + c + v * LANES, m[v], acc[i][v]);
}

#define NN512(MR, NV)                                                                                        \
    case (MR)*32 + (NV): nn_tile512(MR, NV, dt, job, t, c, c1); break;

static T512 ALWAYS_INLINE void nn_block512_dt(const moeq_dtype dt, const moeq_mm_job *job, int64_t c0, int64_t c1,
                                              int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t += TILE_T) {
        int mr = (int)(t1 - t < TILE_T ? t1 - t : TILE_T), wide = mr == 1 ? 16 : mr == 2 ? 8 : TILE_V;
        for (int64_t c = c0; c < c1;) {
            int need = (int)((c1 - c + LANES - 1) / LANES), nv = need <= TILE_V ? need : need <= 8 ? 8 : wide;
            if (nv > wide) nv = wide;
            switch (mr * 32 + nv) {
                NN512(1, 1) NN512(1, 2) NN512(1, 3) NN512(1, 4) NN512(1, 8) NN512(1, 16)
                NN512(2, 1) NN512(2, 2) NN512(2, 3) NN512(2, 4) NN512(2, 8)
                NN512(3, 1) NN512(3, 2) NN512(3, 3) NN512(3, 4)
                NN512(4, 1) NN512(4, 2) NN512(4, 3) NN512(4, 4)
            }
            c += nv * LANES;
        }
    }
}

static T512 void nn_block512(const moeq_mm_job *job, int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    switch (job->w->dtype) {
    case MOEQ_DTYPE_F32: nn_block512_dt(MOEQ_DTYPE_F32, job, c0, c1, t0, t1); break;
    case MOEQ_DTYPE_BF16: nn_block512_dt(MOEQ_DTYPE_BF16, job, c0, c1, t0, t1); break;
    case MOEQ_DTYPE_F16: nn_block512_dt(MOEQ_DTYPE_F16, job, c0, c1, t0, t1); break;
    case MOEQ_DTYPE_F8_E4M3: nn_block512_dt(MOEQ_DTYPE_F8_E4M3, job, c0, c1, t0, t1); break;
    case MOEQ_DTYPE_Q8R: moeq_mm_nn_block_scalar(job, c0, c1, t0, t1); break; /* no draft weight is NN */
    }
}

static T512 float dot512(const float *a, const float *b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; k += LANES) {
        __mmask16 m = moeq_tail_mask16(n - k);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), acc);
    }
    return moeq_hsum512(acc);
}

/* ---- AVX2 + FMA + F16C: 16 lanes as two ymm halves ---------------------------- */

#define TILE_T2 2  /* tokens per AVX2 NT tile                        */
#define TILE_N2 3  /* weight rows per AVX2 NT tile (4 for one token)  */
#define TILE_N21 4
#define TILE_T2N 4 /* tokens per AVX2 NN tile                        */
#define TILE_V2 2  /* 8-column vectors per AVX2 NN tile              */

/* 8 bytes (f8) or 8 halves (bf16/f16) widened; the f8 path as in wload512. */
static T256 ALWAYS_INLINE __m256 widen8(moeq_dtype dt, __m128i v, float scale) {
    switch (dt) {
    case MOEQ_DTYPE_BF16: return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    case MOEQ_DTYPE_F16: return _mm256_cvtph_ps(v);
    case MOEQ_DTYPE_F8_E4M3: {
        __m128i h = _mm_cvtepu8_epi16(v);
        h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x80)), 8),
                         _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7f)), 7));
        __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
        return _mm256_mul_ps(f, _mm256_set1_ps(scale));
    }
    default: return _mm256_setzero_ps();
    }
}

/* 8 e4m3 bytes as q / 256 (the NT kernels' F8 weights, see nt_x_factor). */
static T256 ALWAYS_INLINE __m256 widen8_f8_nt(__m128i v) { /* as f8_to_f16_256 */
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(v), 7), _mm_set1_epi16((short)0xBF80)));
}

/* 16 weights at p (element 0 of the chunk) as lanes 0-7 and 8-15 (F8: as q / 256). */
static T256 ALWAYS_INLINE void wload256(moeq_dtype dt, const uint8_t *p, __m256 *lo, __m256 *hi) {
    switch (dt) {
    case MOEQ_DTYPE_F32:
        *lo = _mm256_loadu_ps((const float *)p);
        *hi = _mm256_loadu_ps((const float *)p + 8);
        return;
    case MOEQ_DTYPE_BF16:
    case MOEQ_DTYPE_F16:
        *lo = widen8(dt, _mm_loadu_si128((const __m128i *)p), 1.0f);
        *hi = widen8(dt, _mm_loadu_si128((const __m128i *)p + 1), 1.0f);
        return;
    case MOEQ_DTYPE_F8_E4M3: {
        __m128i b = _mm_loadu_si128((const __m128i *)p);
        *lo = widen8_f8_nt(b);
        *hi = widen8_f8_nt(_mm_unpackhi_epi64(b, b));
        return;
    }
    case MOEQ_DTYPE_Q8R: *lo = *hi = _mm256_setzero_ps(); return; /* the draft kernels' (ops_draft.h) */
    }
}

/* One 16-wide k step of an (mr x nr) tile; x and weight pointers already at the chunk; xf: F8's activation factor. */
static T256 ALWAYS_INLINE void nt_step256(const int mr, const int nr, const moeq_dtype dt, const float *const *xk,
                                          const uint8_t *const *wk, float xf, __m256 (*acc)[TILE_N21][2]) {
    __m256 xl[TILE_T2], xh[TILE_T2];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) xl[i] = _mm256_loadu_ps(xk[i]), xh[i] = _mm256_loadu_ps(xk[i] + 8);
    if (dt == MOEQ_DTYPE_F8_E4M3) {
        __m256 f = _mm256_set1_ps(xf);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) xl[i] = _mm256_mul_ps(xl[i], f), xh[i] = _mm256_mul_ps(xh[i], f);
    }
#pragma GCC unroll 4
    for (int j = 0; j < nr; j++) {
        __m256 wl, wh;
        wload256(dt, wk[j], &wl, &wh);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            acc[i][j][0] = _mm256_fmadd_ps(xl[i], wl, acc[i][j][0]);
            acc[i][j][1] = _mm256_fmadd_ps(xh[i], wh, acc[i][j][1]);
        }
    }
}

static T256 ALWAYS_INLINE void nt_tile256(const int mr, const int nr, const moeq_dtype dt, const float *x,
                                          int64_t ldx, const uint8_t *const *wp, const float *const *sp,
                                          const uint8_t *const *pp, int64_t K, float *y, int64_t ldy) {
    __m256 acc[TILE_T2][TILE_N21][2];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
    const size_t esz = esize(dt);
    const float *xk[TILE_T2];
    const uint8_t *wk[TILE_N21];
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) {
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) xk[i] = x + i * ldx + k;
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            if (esz >= 4 || ((size_t)k * esz) % 64 == 0) /* one prefetch per 64-byte stride of the row */
                _mm_prefetch((const char *)pp[j] + (size_t)k * esz, _MM_HINT_T0);
            wk[j] = wp[j] + (size_t)k * esz;
        }
        nt_step256(mr, nr, dt, xk, wk, nt_x_factor(sp[0], k), acc);
    }
    if (k < K) { /* the tail, copied into zeroed chunks: zero lanes add +0 as in the emulation */
        float xt[TILE_T2][LANES];
        uint8_t wt[TILE_N21][LANES * 4];
        size_t left = (size_t)(K - k);
        for (int i = 0; i < mr; i++) {
            memset(xt[i], 0, sizeof(xt[i]));
            memcpy(xt[i], x + i * ldx + k, left * sizeof(float));
            xk[i] = xt[i];
        }
        for (int j = 0; j < nr; j++) {
            memset(wt[j], 0, sizeof(wt[j]));
            memcpy(wt[j], wp[j] + (size_t)k * esz, left * esz);
            wk[j] = wt[j];
        }
        nt_step256(mr, nr, dt, xk, wk, nt_x_factor(sp[0], k), acc);
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) y[i * ldy + j] = moeq_hsum256(acc[i][j][0], acc[i][j][1]);
}

#define NT256(MR, NR)                                                                                        \
    case (MR)*8 + (NR): nt_tile256(MR, NR, dt, x, ldx, wp, sp, pp, K, y, ldy); break;

static T256 ALWAYS_INLINE void nt_block256_dt(const moeq_dtype dt, const moeq_mm_job *job, int64_t n0, int64_t n1,
                                              int64_t t0, int64_t t1) {
    int64_t K = moeq_tensor_cols(job->w), ldx = job->ldx, ldy = job->ldy, row_bytes = K * (int64_t)esize(dt);
    const uint8_t *base = row_ptr(job->w, job->row0);
    const int tn = t1 - t0 <= 1 ? TILE_N21 : TILE_N2;
    prefetch_head(base, row_bytes, n0, n1);
    for (int64_t n = n0, next; n < n1; n = next) {
        int nr = (int)(n1 - n < tn ? n1 - n : tn);
        if (dt == MOEQ_DTYPE_F8_E4M3) { /* one scale row per tile */
            int64_t edge = MOEQ_F8_BLOCK - (job->row0 + n) % MOEQ_F8_BLOCK;
            if (nr > edge) nr = (int)edge;
        }
        next = n + nr;
        const uint8_t *wp[TILE_N21], *pp[TILE_N21];
        const float *sp[TILE_N21];
        tile_rows(job, base, row_bytes, n, nr, tn, n1, wp, sp, pp);
        for (int64_t t = t0; t < t1; t += TILE_T2) {
            int mr = (int)(t1 - t < TILE_T2 ? t1 - t : TILE_T2);
            const float *x = job->x + t * ldx;
            float *y = job->y + t * ldy + n;
            switch (mr * 8 + nr) {
                NT256(1, 1) NT256(1, 2) NT256(1, 3) NT256(1, 4)
                NT256(2, 1) NT256(2, 2) NT256(2, 3)
            }
        }
    }
}

static T256 void nt_block256(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1) {
    switch (job->w->dtype) {
    case MOEQ_DTYPE_F32: nt_block256_dt(MOEQ_DTYPE_F32, job, n0, n1, t0, t1); break;
    case MOEQ_DTYPE_BF16: nt_block256_dt(MOEQ_DTYPE_BF16, job, n0, n1, t0, t1); break;
    case MOEQ_DTYPE_F16: nt_block256_dt(MOEQ_DTYPE_F16, job, n0, n1, t0, t1); break;
    case MOEQ_DTYPE_F8_E4M3: nt_block256_dt(MOEQ_DTYPE_F8_E4M3, job, n0, n1, t0, t1); break;
    case MOEQ_DTYPE_Q8R: moeq_draft_nt_block_ref(job, n0, n1, t0, t1); break;
    }
}

/* 8 weights of row p from column c. */
static T256 ALWAYS_INLINE __m256 wload256_8(moeq_dtype dt, const uint8_t *p, const float *srow, int64_t c) {
    float scale = dt == MOEQ_DTYPE_F8_E4M3 && srow ? srow[c / MOEQ_F8_BLOCK] : 1.0f;
    switch (dt) {
    case MOEQ_DTYPE_F32: return _mm256_loadu_ps((const float *)p + c);
    case MOEQ_DTYPE_BF16:
    case MOEQ_DTYPE_F16: return widen8(dt, _mm_loadu_si128((const __m128i *)((const uint16_t *)p + c)), scale);
    case MOEQ_DTYPE_F8_E4M3: return widen8(dt, _mm_loadl_epi64((const __m128i *)(p + c)), scale);
    case MOEQ_DTYPE_Q8R: break; /* the draft kernels' (ops_draft.h) */
    }
    return _mm256_setzero_ps();
}

/* (mr tokens) x (nv full 8-column vectors from column c), r ascending: each element is the emulation's fmaf chain. */
static T256 ALWAYS_INLINE void nn_tile256(const int mr, const int nv, const moeq_dtype dt, const moeq_mm_job *job,
                                          int64_t t, int64_t c) {
    const moeq_tensor *w = job->w;
    __m256 acc[TILE_T2N][TILE_V2];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[i][v] = _mm256_setzero_ps();
    const int64_t rb = moeq_tensor_cols(w) * (int64_t)esize(dt);
    const uint8_t *base = (const uint8_t *)w->data + job->row0 * rb;
    for (int64_t r = 0; r < job->n_rows; r++) {
        const uint8_t *p = base + r * rb;
        const float *srow = dt == MOEQ_DTYPE_F8_E4M3 ? scale_row(w, job->row0 + r) : NULL;
        __m256 wv[TILE_V2];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) wv[v] = wload256_8(dt, p, srow, c + v * 8);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            __m256 xb = _mm256_set1_ps(job->x[(t + i) * job->ldx + r]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) acc[i][v] = _mm256_fmadd_ps(xb, wv[v], acc[i][v]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) _mm256_storeu_ps(job->y + (t + i) * job->ldy + c + v * 8, acc[i][v]);
}

#define NN256(MR, NV)                                                                                        \
    case (MR)*8 + (NV): nn_tile256(MR, NV, dt, job, t, c); break;

/* Full 8-column vectors here; the last < 8 columns through the emulation (the same chain per element). */
static T256 ALWAYS_INLINE void nn_block256_dt(const moeq_dtype dt, const moeq_mm_job *job, int64_t c0, int64_t c1,
                                              int64_t t0, int64_t t1) {
    int64_t cv = c0 + (c1 - c0) / 8 * 8;
    for (int64_t c = c0; c < cv; c += TILE_V2 * 8) {
        int nv = (int)((cv - c) / 8 < TILE_V2 ? (cv - c) / 8 : TILE_V2);
        for (int64_t t = t0; t < t1; t += TILE_T2N) {
            int mr = (int)(t1 - t < TILE_T2N ? t1 - t : TILE_T2N);
            switch (mr * 8 + nv) {
                NN256(1, 1) NN256(1, 2) NN256(2, 1) NN256(2, 2) NN256(3, 1) NN256(3, 2) NN256(4, 1) NN256(4, 2)
            }
        }
    }
    if (cv < c1) moeq_mm_nn_block_scalar(job, cv, c1, t0, t1);
}

static T256 void nn_block256(const moeq_mm_job *job, int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    switch (job->w->dtype) {
    case MOEQ_DTYPE_F32: nn_block256_dt(MOEQ_DTYPE_F32, job, c0, c1, t0, t1); break;
    case MOEQ_DTYPE_BF16: nn_block256_dt(MOEQ_DTYPE_BF16, job, c0, c1, t0, t1); break;
    case MOEQ_DTYPE_F16: nn_block256_dt(MOEQ_DTYPE_F16, job, c0, c1, t0, t1); break;
    case MOEQ_DTYPE_F8_E4M3: nn_block256_dt(MOEQ_DTYPE_F8_E4M3, job, c0, c1, t0, t1); break;
    case MOEQ_DTYPE_Q8R: moeq_mm_nn_block_scalar(job, c0, c1, t0, t1); break; /* no draft weight is NN */
    }
}

static T256 float dot256(const float *a, const float *b, int64_t n) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + LANES <= n; k += LANES) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), hi);
    }
    if (k < n) {
        float at[LANES] = {0}, bt[LANES] = {0};
        memcpy(at, a + k, (size_t)(n - k) * sizeof(float));
        memcpy(bt, b + k, (size_t)(n - k) * sizeof(float));
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(at), _mm256_loadu_ps(bt), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(at + 8), _mm256_loadu_ps(bt + 8), hi);
    }
    return moeq_hsum256(lo, hi);
}
#endif /* MOEQ_MM_X86 */

/* ---- dispatch --------------------------------------------------------------- */

#ifdef MOEQ_MM_X86
/* CPUID leaf 1, ECX bit 29. Asked directly: clang 14's __builtin_cpu_supports has no "f16c". */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

int moeq_mm_isa_supported(moeq_mm_isa isa) {
    switch (isa) {
    case MOEQ_MM_ISA_SCALAR: return 1;
#ifdef MOEQ_MM_X86
    case MOEQ_MM_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case MOEQ_MM_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               moeq_mm_isa_supported(MOEQ_MM_ISA_AVX2);
#else
    default: return 0;
#endif
    }
    return 0;
}

static _Atomic int isa_best = -1; /* detected once; a relaxed load on every call after */

moeq_mm_isa moeq_mm_isa_best(void) {
    int b = atomic_load_explicit(&isa_best, memory_order_relaxed);
    if (b < 0) {
        b = moeq_mm_isa_supported(MOEQ_MM_ISA_AVX512) ? MOEQ_MM_ISA_AVX512
            : moeq_mm_isa_supported(MOEQ_MM_ISA_AVX2) ? MOEQ_MM_ISA_AVX2
                                                       : MOEQ_MM_ISA_SCALAR;
        atomic_store_explicit(&isa_best, b, memory_order_relaxed);
    }
    return (moeq_mm_isa)b;
}

const char *moeq_mm_cpu_describe(void) {
    /* one text per combination of the three choices: an engine key may change them after the first call
     * (cpu_tuning.h), and a caller may keep the pointer it got, so each text stays as it was written */
    static char texts[8][256];
    static _Atomic int done[8];
    int key = moeq_cpu_tuning_key();
    char *text = texts[key];
    if (atomic_load(&done[key])) return text;
    int bf16 = 0, amx = 0;
#ifdef MOEQ_MM_X86
    bf16 = __builtin_cpu_supports("avx512bf16");
    unsigned a, b, c, d; /* CPUID 7.0 EDX bit 22: AMX-BF16 (gcc 12's __builtin_cpu_supports has no "amx-bf16") */
    amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22));
#endif
    moeq_mm_isa isa = moeq_mm_isa_best();
    snprintf(text, sizeof texts[0], "%s (float32 lanes%s%s%s; the CPU has %s, %s)", moeq_mm_isa_name(isa),
             isa == MOEQ_MM_ISA_AVX512 && (key & 1) ? ", weight streams prefetched into L2" : "",
             isa == MOEQ_MM_ISA_AVX512 && (key & 2) ? ", F8 widened straight to float32" : "",
             isa == MOEQ_MM_ISA_AVX512 && !(key & 4) ? ", blocks of 5-32 tokens unblocked in K" : "",
             bf16 ? "avx512_bf16" : "no avx512_bf16", amx ? "amx_bf16 (cpu_matrix)" : "no amx_bf16");
    atomic_store(&done[key], 1);
    return text;
}

const char *moeq_mm_isa_name(moeq_mm_isa isa) {
    switch (isa) {
    case MOEQ_MM_ISA_SCALAR: return "scalar";
    case MOEQ_MM_ISA_AVX2: return "avx2";
    case MOEQ_MM_ISA_AVX512: return "avx512";
    }
    return "?";
}

void moeq_mm_nt_block_isa(moeq_mm_isa isa, const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1) {
    switch (isa) {
#ifdef MOEQ_MM_X86
    case MOEQ_MM_ISA_AVX512: nt_block512(job, n0, n1, t0, t1); return;
    case MOEQ_MM_ISA_AVX2: nt_block256(job, n0, n1, t0, t1); return;
#endif
    default: moeq_mm_nt_block_scalar(job, n0, n1, t0, t1); return;
    }
}

void moeq_mm_nn_block_isa(moeq_mm_isa isa, const moeq_mm_job *job, int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    switch (isa) {
#ifdef MOEQ_MM_X86
    case MOEQ_MM_ISA_AVX512: nn_block512(job, c0, c1, t0, t1); return;
    case MOEQ_MM_ISA_AVX2: nn_block256(job, c0, c1, t0, t1); return;
#endif
    default: moeq_mm_nn_block_scalar(job, c0, c1, t0, t1); return;
    }
}

float moeq_dot_f32_isa(moeq_mm_isa isa, const float *a, const float *b, int64_t n) {
    switch (isa) {
#ifdef MOEQ_MM_X86
    case MOEQ_MM_ISA_AVX512: return dot512(a, b, n);
    case MOEQ_MM_ISA_AVX2: return dot256(a, b, n);
#endif
    default: return dot_scalar(a, b, n);
    }
}

void moeq_mm_nt_block(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1) {
    moeq_mm_nt_block_isa(moeq_mm_isa_best(), job, n0, n1, t0, t1);
}

void moeq_mm_nt_block_ws_isa(moeq_mm_isa isa, const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0,
                             int64_t t1, void *ws, size_t ws_bytes) {
    if (job->w->dtype == MOEQ_DTYPE_Q8R) {
        moeq_draft_nt_block(job, n0, n1, t0, t1, ws, ws_bytes, 0); /* ws is shared: no codes kept */
        return;
    }
#ifdef MOEQ_MM_X86
    int64_t K = moeq_tensor_cols(job->w);
    int blocked = isa == MOEQ_MM_ISA_AVX512 && ws && ws_bytes >= moeq_mm_nt_ws_bytes(K);
    if (job->w->dtype == MOEQ_DTYPE_F8_E4M3 && isa == MOEQ_MM_ISA_AVX512 && ws) {
        /* fewer than BLK_MIN_TOKS_F8 tokens: the direct tiles, when their scaled activations fit (F8_FEW_TOKS) */
        if (t1 - t0 < BLK_MIN_TOKS_F8 && ws_bytes >= (size_t)(t1 - t0) * (size_t)K * sizeof(float)) {
            nt_block512_f8_ws(job, n0, n1, t0, t1, ws);
            return;
        }
        if (blocked) {
            nt_blocked512(job, n0, n1, t0, t1, ws);
            return;
        }
    } else if (blocked && K > BLK_K && t1 - t0 >= BLK_MIN_TOKS &&
               (t1 - t0 >= BLK_MIN_TOKS_ANY || moeq_cpu_k_blocked())) {
        nt_blocked512(job, n0, n1, t0, t1, ws);
        return;
    }
#else
    (void)ws, (void)ws_bytes;
#endif
    moeq_mm_nt_block_isa(isa, job, n0, n1, t0, t1);
}

void moeq_mm_nt_block_ws(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1, void *ws,
                         size_t ws_bytes) {
    moeq_mm_nt_block_ws_isa(moeq_mm_isa_best(), job, n0, n1, t0, t1, ws, ws_bytes);
}

void moeq_mm_nn_block(const moeq_mm_job *job, int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    moeq_mm_nn_block_isa(moeq_mm_isa_best(), job, c0, c1, t0, t1);
}

/* Called per (context token, head) by attention: the common case is a load, a compare and a direct call. */
float moeq_dot_f32(const float *a, const float *b, int64_t n) {
#ifdef MOEQ_MM_X86
    if (__builtin_expect(atomic_load_explicit(&isa_best, memory_order_relaxed) == MOEQ_MM_ISA_AVX512, 1))
        return dot512(a, b, n);
#endif
    return moeq_dot_f32_isa(moeq_mm_isa_best(), a, b, n);
}

/* ---- OpenBLAS path -------------------------------------------------------- */

void moeq_mm_blas_init(void) { openblas_set_num_threads(1); }

void moeq_mm_nt_blas_block(const moeq_mm_job *job, int64_t n0, int64_t n1, float *wbuf) {
    int64_t K = moeq_tensor_cols(job->w), nb = n1 - n0;
    moeq_tensor_rows_to_f32(job->w, job->row0 + n0, nb, wbuf);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)job->n_tok, (int)nb, (int)K, 1.0f, job->x,
                (int)job->ldx, wbuf, (int)K, 0.0f, job->y + n0, (int)job->ldy);
}
