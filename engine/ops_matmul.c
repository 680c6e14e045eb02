/*
 * ops_matmul.c — the CPU matrix kernels (see ops_matmul.h for the contract).
 *
 * AVX-512 path: 4x4 register tiles (4 tokens x 4 weight rows, 16 zmm
 * accumulators) for NT, 4 tokens x 64 columns for NN; weights widened in
 * registers (bf16: shift, f16: vcvtph2ps, f8 e4m3: bit placement * 2^120 *
 * block scale). Without AVX-512 a scalar emulation of the same 16 lanes runs
 * (identical results, slowly); tests compare the two bit for bit.
 *
 * Not here: threading (backend_cpu.c), activation quantisation (activations
 * stay float32 so the CPU path is the exact reference).
 */
#include "ops_matmul.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MOEQ_MM_AVX512 1
#include <immintrin.h>
#endif

#define LANES 16
#define TILE_T 4 /* tokens per register tile              */
#define TILE_N 4 /* weight rows per NT tile               */
#define TILE_V 4 /* 16-column vectors per NN tile (64 cols) */

static inline const uint8_t *row_ptr(const moeq_tensor *w, int64_t row) {
    return (const uint8_t *)w->data + (size_t)row * (size_t)moeq_tensor_cols(w) * moeq_dtype_size(w->dtype);
}

/* F8 block scales of the 128-row block holding `row` (NULL for other dtypes). */
static inline const float *scale_row(const moeq_tensor *w, int64_t row) {
    if (w->dtype != MOEQ_DTYPE_F8_E4M3 || !w->scale_inv) return NULL;
    int64_t ncb = (moeq_tensor_cols(w) + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK;
    return (const float *)w->scale_inv->data + (row / MOEQ_F8_BLOCK) * ncb;
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

/* One weight element widened exactly as the vector path does. */
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
    }
    return 0.0f;
}

static inline float tree16(const float *l) {
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) a[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; i++) c[i] = b[i] + b[i + 2];
    return c[0] + c[1];
}

void moeq_mm_nt_block_scalar(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1) {
    const moeq_tensor *w = job->w;
    int64_t K = moeq_tensor_cols(w);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *p = row_ptr(w, job->row0 + n);
        const float *srow = scale_row(w, job->row0 + n);
        for (int64_t t = t0; t < t1; t++) {
            const float *x = job->x + t * job->ldx;
            float lanes[LANES] = {0};
            for (int64_t k = 0; k < K; k += LANES)
                for (int l = 0; l < LANES && k + l < K; l++)
                    lanes[l] = fmaf(x[k + l], wscalar(w->dtype, p, srow, k + l), lanes[l]);
            job->y[t * job->ldy + n] = tree16(lanes);
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
                acc = fmaf(job->x[t * job->ldx + r], wscalar(w->dtype, row_ptr(w, row), scale_row(w, row), c), acc);
            }
            job->y[t * job->ldy + c] = acc;
        }
}

#ifdef MOEQ_MM_AVX512
/* ---- AVX-512 ---------------------------------------------------------------- */

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define PREFETCH_BYTES 1024 /* per weight row stream; hardware prefetch alone left decode latency bound */

static ALWAYS_INLINE __m512 wload(moeq_dtype dt, const uint8_t *p, const float *srow, int64_t k, __mmask16 m) {
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
    }
    return _mm512_setzero_ps();
}

/* The fixed tree: halves 16->8->4->2->1, as tree16(). */
static ALWAYS_INLINE float hsum(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    __m128 d = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
    return _mm_cvtss_f32(d);
}

static inline __mmask16 tail_mask(int64_t left) { return left >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

/* (mr tokens) x (nr weight rows) dot products over the whole K. */
static ALWAYS_INLINE void nt_tile(const int mr, const int nr, const moeq_dtype dt, const float *x, int64_t ldx,
                                  const uint8_t *const *wp, const float *const *sp, int64_t K, float *y,
                                  int64_t ldy) {
    __m512 acc[TILE_T][TILE_N];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
    const size_t esz = dt == MOEQ_DTYPE_F32 ? 4 : (dt == MOEQ_DTYPE_F8_E4M3 ? 1 : 2);
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) { /* full chunks: unmasked loads, weights prefetched ahead */
        __m512 xv[TILE_T];
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) xv[i] = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            _mm_prefetch((const char *)wp[j] + (size_t)k * esz + PREFETCH_BYTES, _MM_HINT_T0);
            __m512 wv = wload(dt, wp[j], sp[j], k, (__mmask16)0xFFFF);
#pragma GCC unroll 4
            for (int i = 0; i < mr; i++) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
    if (k < K) { /* the tail: zero lanes add nothing, so the order per element is unchanged */
        __mmask16 m = tail_mask(K - k);
        __m512 xv[TILE_T];
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) xv[i] = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) {
            __m512 wv = wload(dt, wp[j], sp[j], k, m);
#pragma GCC unroll 4
            for (int i = 0; i < mr; i++) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) y[i * ldy + j] = hsum(acc[i][j]);
}

#define NT_CASE(MR, NR)                                                                   \
    case (MR)*8 + (NR): nt_tile(MR, NR, dt, x, ldx, wp, sp, K, y, ldy); break;

static ALWAYS_INLINE void nt_block_dt(const moeq_dtype dt, const moeq_mm_job *job, int64_t n0, int64_t n1,
                                      int64_t t0, int64_t t1) {
    const moeq_tensor *w = job->w;
    int64_t K = moeq_tensor_cols(w), ldx = job->ldx, ldy = job->ldy;
    for (int64_t n = n0; n < n1; n += TILE_N) {
        int nr = (int)(n1 - n < TILE_N ? n1 - n : TILE_N);
        const uint8_t *wp[TILE_N];
        const float *sp[TILE_N];
        for (int j = 0; j < TILE_N; j++) {
            int64_t row = job->row0 + n + (j < nr ? j : 0);
            wp[j] = row_ptr(w, row);
            sp[j] = scale_row(w, row);
        }
        for (int64_t t = t0; t < t1; t += TILE_T) {
            int mr = (int)(t1 - t < TILE_T ? t1 - t : TILE_T);
            const float *x = job->x + t * ldx;
            float *y = job->y + t * ldy + n;
            switch (mr * 8 + nr) {
                NT_CASE(1, 1) NT_CASE(1, 2) NT_CASE(1, 3) NT_CASE(1, 4)
                NT_CASE(2, 1) NT_CASE(2, 2) NT_CASE(2, 3) NT_CASE(2, 4)
                NT_CASE(3, 1) NT_CASE(3, 2) NT_CASE(3, 3) NT_CASE(3, 4)
                NT_CASE(4, 1) NT_CASE(4, 2) NT_CASE(4, 3) NT_CASE(4, 4)
            }
        }
    }
}

void moeq_mm_nt_block(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1) {
    switch (job->w->dtype) {
    case MOEQ_DTYPE_F32: nt_block_dt(MOEQ_DTYPE_F32, job, n0, n1, t0, t1); break;
    case MOEQ_DTYPE_BF16: nt_block_dt(MOEQ_DTYPE_BF16, job, n0, n1, t0, t1); break;
    case MOEQ_DTYPE_F16: nt_block_dt(MOEQ_DTYPE_F16, job, n0, n1, t0, t1); break;
    case MOEQ_DTYPE_F8_E4M3: nt_block_dt(MOEQ_DTYPE_F8_E4M3, job, n0, n1, t0, t1); break;
    }
}

/* (mr tokens) x (nv 16-column vectors starting at column c): y = x W, r ascending. */
static ALWAYS_INLINE void nn_tile(const int mr, const int nv, const moeq_dtype dt, const moeq_mm_job *job,
                                  int64_t t, int64_t c, int64_t c1) {
    const moeq_tensor *w = job->w;
    __m512 acc[TILE_T][TILE_V];
    __mmask16 m[TILE_V];
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) {
        m[v] = tail_mask(c1 - (c + v * LANES));
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) acc[i][v] = _mm512_setzero_ps();
    }
    for (int64_t r = 0; r < job->n_rows; r++) {
        const uint8_t *p = row_ptr(w, job->row0 + r);
        const float *srow = scale_row(w, job->row0 + r);
        __m512 wv[TILE_V];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) wv[v] = wload(dt, p, srow, c + v * LANES, m[v]);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            __m512 xb = _mm512_set1_ps(job->x[(t + i) * job->ldx + r]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) acc[i][v] = _mm512_fmadd_ps(xb, wv[v], acc[i][v]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) _mm512_mask_storeu_ps(job->y + (t + i) * job->ldy + c + v * LANES, m[v], acc[i][v]);
}

#define NN_CASE(MR, NV)                                                                   \
    case (MR)*8 + (NV): nn_tile(MR, NV, dt, job, t, c, c1); break;

static ALWAYS_INLINE void nn_block_dt(const moeq_dtype dt, const moeq_mm_job *job, int64_t c0, int64_t c1,
                                      int64_t t0, int64_t t1) {
    for (int64_t c = c0; c < c1; c += TILE_V * LANES) {
        int nv = (int)((c1 - c + LANES - 1) / LANES);
        if (nv > TILE_V) nv = TILE_V;
        for (int64_t t = t0; t < t1; t += TILE_T) {
            int mr = (int)(t1 - t < TILE_T ? t1 - t : TILE_T);
            switch (mr * 8 + nv) {
                NN_CASE(1, 1) NN_CASE(1, 2) NN_CASE(1, 3) NN_CASE(1, 4)
                NN_CASE(2, 1) NN_CASE(2, 2) NN_CASE(2, 3) NN_CASE(2, 4)
                NN_CASE(3, 1) NN_CASE(3, 2) NN_CASE(3, 3) NN_CASE(3, 4)
                NN_CASE(4, 1) NN_CASE(4, 2) NN_CASE(4, 3) NN_CASE(4, 4)
            }
        }
    }
}

void moeq_mm_nn_block(const moeq_mm_job *job, int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    switch (job->w->dtype) {
    case MOEQ_DTYPE_F32: nn_block_dt(MOEQ_DTYPE_F32, job, c0, c1, t0, t1); break;
    case MOEQ_DTYPE_BF16: nn_block_dt(MOEQ_DTYPE_BF16, job, c0, c1, t0, t1); break;
    case MOEQ_DTYPE_F16: nn_block_dt(MOEQ_DTYPE_F16, job, c0, c1, t0, t1); break;
    case MOEQ_DTYPE_F8_E4M3: nn_block_dt(MOEQ_DTYPE_F8_E4M3, job, c0, c1, t0, t1); break;
    }
}

float moeq_dot_f32(const float *a, const float *b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; k += LANES) {
        __mmask16 m = tail_mask(n - k);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), acc);
    }
    return hsum(acc);
}

#else /* no AVX-512: the scalar emulation is the kernel */

void moeq_mm_nt_block(const moeq_mm_job *job, int64_t n0, int64_t n1, int64_t t0, int64_t t1) {
    moeq_mm_nt_block_scalar(job, n0, n1, t0, t1);
}
void moeq_mm_nn_block(const moeq_mm_job *job, int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    moeq_mm_nn_block_scalar(job, c0, c1, t0, t1);
}
float moeq_dot_f32(const float *a, const float *b, int64_t n) {
    float lanes[LANES] = {0};
    for (int64_t k = 0; k < n; k += LANES)
        for (int l = 0; l < LANES && k + l < n; l++) lanes[l] = fmaf(a[k + l], b[k + l], lanes[l]);
    return tree16(lanes);
}
#endif

/* ---- OpenBLAS path -------------------------------------------------------- */

void moeq_mm_blas_init(void) { openblas_set_num_threads(1); }

void moeq_mm_nt_blas_block(const moeq_mm_job *job, int64_t n0, int64_t n1, float *wbuf) {
    int64_t K = moeq_tensor_cols(job->w), nb = n1 - n0;
    moeq_tensor_rows_to_f32(job->w, job->row0 + n0, nb, wbuf);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)job->n_tok, (int)nb, (int)K, 1.0f, job->x,
                (int)job->ldx, wbuf, (int)K, 0.0f, job->y + n0, (int)job->ldy);
}
