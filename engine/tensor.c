/*
 * tensor.c — the storage types of safetensors weights and their conversions to
 * and from float32: BF16, F16, F8_E4M3 (E4M3FN, DeepSeek's FP8 with 128x128
 * block scales). Widening is exact; narrowing (used by gen-model) rounds to
 * nearest even. moeq_tensor_rows_to_f32 is the one dequantisation path every
 * backend and test uses.
 *
 * Deliberately not here: GEMM kernels that consume BF16/F8 directly (forward).
 */
#define _DEFAULT_SOURCE /* madvise */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tensor.h"

size_t moeq_dtype_size(moeq_dtype dtype) {
    switch (dtype) {
    case MOEQ_DTYPE_F32: return 4;
    case MOEQ_DTYPE_BF16: return 2;
    case MOEQ_DTYPE_F16: return 2;
    case MOEQ_DTYPE_F8_E4M3: return 1;
    case MOEQ_DTYPE_Q8R: return 1;
    }
    return 0;
}

/* The safetensors spelling. */
const char *moeq_dtype_name(moeq_dtype dtype) {
    switch (dtype) {
    case MOEQ_DTYPE_F32: return "F32";
    case MOEQ_DTYPE_BF16: return "BF16";
    case MOEQ_DTYPE_F16: return "F16";
    case MOEQ_DTYPE_F8_E4M3: return "F8_E4M3";
    case MOEQ_DTYPE_Q8R: return "Q8R"; /* never in a file: draft copies */
    }
    return "?";
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t moeq_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float moeq_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13)); /* inf / NaN */
    if (exp == 0) {                                                     /* zero / subnormal: man * 2^-24 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t moeq_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float a = fabsf(f);
    if (isnan(f)) return sign | 0x7e00u;
    if (a >= 65520.0f) return sign | 0x7c00u; /* rounds to inf */
    if (a < 0x1p-14f) {                       /* subnormal: units of 2^-24, RNE by rintf */
        return sign | (uint16_t)rintf(a * 0x1p24f);
    }
    uint32_t au = u & 0x7fffffffu;
    au += 0xfffu + ((au >> 13) & 1u);
    return sign | (uint16_t)(((au >> 23) - 112u) << 10 | ((au >> 13) & 0x3ffu));
}

static float f8_table[256];
static pthread_once_t f8_once = PTHREAD_ONCE_INIT;

static float f8_decode(uint8_t b) {
    int exp = (b >> 3) & 0xf, man = b & 7;
    float v;
    if (exp == 0xf && man == 7) return NAN;
    if (exp == 0)
        v = (float)man * 0x1p-9f; /* subnormal: man/8 * 2^-6 */
    else
        v = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return (b & 0x80) ? -v : v;
}

static void f8_table_init(void) {
    for (int i = 0; i < 256; i++) f8_table[i] = f8_decode((uint8_t)i);
}

float moeq_f8_e4m3_to_f32(uint8_t b) {
    pthread_once(&f8_once, f8_table_init);
    return f8_table[b];
}

/*
 * Nearest E4M3 code, ties to even, saturating at 448 (codes 0..126 are the non-negative finite values in
 * increasing order). Below 2^-6 the codes are multiples of 2^-9, so rintf(a * 512) is the code (8 is 2^-6
 * itself); above, the float's bits rounded to 3 mantissa bits are exponent and mantissa of the code, the
 * exponent rebased from 127 to 7. Exact arithmetic throughout: tests compare every code boundary with a
 * search of the decoded table.
 */
uint8_t moeq_f32_to_f8_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return sign | 126;
    if (a < 0x1p-6f) return sign | (uint8_t)rintf(a * 512.0f);
    uint32_t u;
    memcpy(&u, &a, 4);
    u += 0x7ffffu + ((u >> 20) & 1u); /* round to nearest even at bit 20 */
    uint32_t code = (u >> 20) - ((127u - 7u) << 3);
    return sign | (uint8_t)(code > 126 ? 126 : code);
}

void moeq_f8_block_scales(const float *vals, int64_t n_rows, int64_t cols, float *scales) {
    int64_t n_blocks = (cols + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK;
    for (int64_t b = 0; b < n_blocks; b++) {
        float amax = 0;
        for (int64_t r = 0; r < n_rows; r++)
            for (int64_t c = b * MOEQ_F8_BLOCK; c < cols && c < (b + 1) * MOEQ_F8_BLOCK; c++)
                amax = fmaxf(amax, fabsf(vals[r * cols + c]));
        scales[b] = amax > 0 ? amax / 448.0f : 1.0f;
    }
}

void moeq_f8_quantize_rows(const float *vals, int64_t n_rows, int64_t cols, const float *scales, uint8_t *out) {
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] = moeq_f32_to_f8_e4m3(vals[r * cols + c] / scales[c / MOEQ_F8_BLOCK]);
}

/*
 * A copy's one allocation, which free() releases: the tensor (dt, src's rows and columns), its scale tensor
 * (F32, sndim dimensions sshape), the scales (sbytes) and the codes (qbytes), each array on a 64-byte line.
 * NULL when memory cannot be had.
 */
static moeq_tensor *copy_alloc(const moeq_tensor *src, moeq_dtype dt, int sndim, const int64_t *sshape, size_t sbytes,
                               size_t qbytes, float **scales, uint8_t **q) {
    const size_t head = (2 * sizeof(moeq_tensor) + 63) / 64 * 64, sarea = (sbytes + 63) / 64 * 64;
    uint8_t *mem = NULL;
    if (posix_memalign((void **)&mem, 64, head + sarea + qbytes)) return NULL;
    moeq_tensor *t = (moeq_tensor *)(void *)mem, *sc = t + 1;
    *scales = (float *)(void *)(mem + head);
    *q = mem + head + sarea;
    *sc = (moeq_tensor){.name = src->name, .dtype = MOEQ_DTYPE_F32, .ndim = sndim, .data = *scales, .nbytes = sbytes};
    for (int i = 0; i < sndim; i++) sc->shape[i] = sshape[i];
    *t = (moeq_tensor){.name = src->name, .dtype = dt, .ndim = 2, .shape = {src->shape[0], moeq_tensor_cols(src)},
                       .data = *q, .nbytes = qbytes, .scale_inv = sc};
    return t;
}

/* One allocation holds the tensor, its scale tensor and both arrays, so free() releases it. */
moeq_tensor *moeq_tensor_f8_copy(const moeq_tensor *src) {
    const int64_t rows = src->shape[0], cols = moeq_tensor_cols(src);
    const int64_t rb = (rows + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK, cb = (cols + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK;
    const int64_t sshape[2] = {rb, cb};
    float *scales, *wide = malloc((size_t)(MOEQ_F8_BLOCK * cols) * sizeof(float));
    uint8_t *q;
    moeq_tensor *t = wide ? copy_alloc(src, MOEQ_DTYPE_F8_E4M3, 2, sshape, (size_t)(rb * cb) * sizeof(float),
                                       (size_t)(rows * cols), &scales, &q)
                          : NULL;
    if (!t) {
        free(wide);
        return NULL;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += MOEQ_F8_BLOCK) {
        int64_t n = rows - r0 < MOEQ_F8_BLOCK ? rows - r0 : MOEQ_F8_BLOCK;
        float *row_scales = scales + (r0 / MOEQ_F8_BLOCK) * cb;
        moeq_tensor_rows_to_f32(src, r0, n, wide);
        moeq_f8_block_scales(wide, n, cols, row_scales);
        moeq_f8_quantize_rows(wide, n, cols, row_scales, q + r0 * cols);
    }
    free(wide);
    return t;
}

/* round(v) to nearest even for |v| <= 2^22, as rintf in the default rounding mode, without a call */
static inline float round_small(float v) {
    volatile float big = 12582912.0f; /* 1.5 * 2^23: v + big rounds v to an integer; volatile keeps the pair */
    return (v + big) - big;
}

moeq_tensor *moeq_tensor_q8r_copy(const moeq_tensor *src) {
    const int64_t rows = src->shape[0], cols = moeq_tensor_cols(src), quads = moeq_q8r_quads(cols);
    if (src->ndim != 2 || cols < 1 || cols > MOEQ_Q8R_MAX_COLS) return NULL;
    const size_t qbytes = (size_t)((rows + 15) / 16 * quads * 64);
    float *scales, *wide = malloc((size_t)(16 * quads * 4) * sizeof(float)); /* a group's 16 rows, padded */
    uint8_t *q;
    moeq_tensor *t =
        wide ? copy_alloc(src, MOEQ_DTYPE_Q8R, 1, &rows, (size_t)rows * sizeof(float), qbytes, &scales, &q) : NULL;
    if (!t) {
        free(wide);
        return NULL;
    }
    const int64_t ld = quads * 4;
    for (int64_t r0 = 0; r0 < rows; r0 += 16) { /* one group: widen, scale each row, then write it in order */
        const int n = rows - r0 < 16 ? (int)(rows - r0) : 16;
        float inv[16] = {0};
        memset(wide, 0, (size_t)(16 * ld) * sizeof(float)); /* padding rows and columns: code 0 */
        for (int r = 0; r < n; r++) {
            float *row = wide + r * ld, amax = 0.0f;
            moeq_tensor_rows_to_f32(src, r0 + r, 1, row);
            int finite = 1;
            for (int64_t c = 0; c < cols; c++) {
                float a = fabsf(row[c]);
                finite &= a <= FLT_MAX; /* false for inf and NaN */
                amax = a > amax ? a : amax;
            }
            scales[r0 + r] = !finite ? NAN : amax / 127.0f;
            inv[r] = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
            if (!finite) memset(row, 0, (size_t)cols * sizeof(float));
        }
        uint8_t *g = q + (r0 / 16) * quads * 64;
        for (int64_t j = 0; j < quads; j++)
            for (int r = 0; r < 16; r++)
                for (int i = 0; i < 4; i++) {
                    float v = round_small(wide[r * ld + 4 * j + i] * inv[r]); /* |v| <= 127 */
                    *g++ = (uint8_t)(128 + (int)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v));
                }
    }
    free(wide);
    return t;
}

void moeq_bf16_to_f32_row(const uint16_t *in, float *out, size_t n) {
    uint32_t *o = (uint32_t *)(void *)out;
    for (size_t i = 0; i < n; i++) o[i] = (uint32_t)in[i] << 16;
}

void moeq_f16_to_f32_row(const uint16_t *in, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = moeq_f16_to_f32(in[i]);
}

void moeq_f8_e4m3_to_f32_row(const uint8_t *in, float scale, float *out, size_t n) {
    pthread_once(&f8_once, f8_table_init);
    for (size_t i = 0; i < n; i++) out[i] = f8_table[in[i]] * scale;
}

/* One F8 row: each 128-column block has its own scale from the row's block-row. */
static void f8_row_to_f32(const moeq_tensor *t, int64_t r, int64_t cols, float *out) {
    const uint8_t *q = (const uint8_t *)t->data + (size_t)r * (size_t)cols;
    int64_t scale_cols = (cols + MOEQ_F8_BLOCK - 1) / MOEQ_F8_BLOCK;
    const float *scale = (const float *)t->scale_inv->data + (r / MOEQ_F8_BLOCK) * scale_cols;
    for (int64_t c0 = 0, b = 0; c0 < cols; c0 += MOEQ_F8_BLOCK, b++) {
        int64_t n = cols - c0 < MOEQ_F8_BLOCK ? cols - c0 : MOEQ_F8_BLOCK;
        moeq_f8_e4m3_to_f32_row(q + c0, scale[b], out + c0, (size_t)n);
    }
}

void moeq_tensor_rows_to_f32(const moeq_tensor *t, int64_t row0, int64_t n_rows, float *out) {
    int64_t cols = moeq_tensor_cols(t);
    size_t n = (size_t)(n_rows * cols), off = (size_t)(row0 * cols);
    switch (t->dtype) {
    case MOEQ_DTYPE_F32: memcpy(out, (const float *)t->data + off, n * sizeof(float)); break;
    case MOEQ_DTYPE_BF16: moeq_bf16_to_f32_row((const uint16_t *)t->data + off, out, n); break;
    case MOEQ_DTYPE_F16: moeq_f16_to_f32_row((const uint16_t *)t->data + off, out, n); break;
    case MOEQ_DTYPE_F8_E4M3:
        if (!t->scale_inv) { /* unscaled F8 (never bound by the loader, but be total) */
            moeq_f8_e4m3_to_f32_row((const uint8_t *)t->data + off, 1.0f, out, n);
            break;
        }
        for (int64_t r = 0; r < n_rows; r++) f8_row_to_f32(t, row0 + r, cols, out + r * cols);
        break;
    case MOEQ_DTYPE_Q8R:
        for (int64_t r = 0; r < n_rows; r++)
            for (int64_t c = 0; c < cols; c++) out[r * cols + c] = moeq_q8r_value(t, row0 + r, c);
        break;
    }
}

void moeq_tensor_drop_pages(const moeq_tensor *t) {
    if (!t || !t->data || !t->nbytes) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)t->data, end = a + t->nbytes;
    a = (a + page - 1) / page * page; /* inward: a neighbour's pages stay */
    end = end / page * page;
    if (end > a) (void)madvise((void *)a, end - a, MADV_DONTNEED); /* advice: a failure changes nothing */
    moeq_tensor_drop_pages(t->scale_inv);
}
