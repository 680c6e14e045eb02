/*
 * tensor.h — internal: the storage types of weights (dtypes) and the tensor
 * view the loader hands out, with their conversions to and from float32
 * (tensor.c). The lowest layer of the engine: it knows no model, file or
 * backend, so the loader (model.c, safetensors.c), the forward pass and any
 * backend all build on it and it on nothing of theirs. Not installed.
 */
#ifndef MOEQ_ENGINE_TENSOR_H
#define MOEQ_ENGINE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum moeq_dtype {
    MOEQ_DTYPE_F32 = 0,
    MOEQ_DTYPE_BF16,
    MOEQ_DTYPE_F16,
    MOEQ_DTYPE_F8_E4M3,   /* with a block-scale tensor (weight_scale_inv), 128x128 blocks */
    MOEQ_DTYPE_Q8R,       /* draft copies only (moeq_tensor_q8r_copy): int8 codes q stored as q + 128 in
                           * 16-row groups, one float32 scale per row (scale_inv [rows]): weight = q * scale */
} moeq_dtype;

/* Bytes per element (F8: 1). */
size_t moeq_dtype_size(moeq_dtype dtype);
const char *moeq_dtype_name(moeq_dtype dtype);

#define MOEQ_F8_BLOCK 128

typedef struct moeq_tensor {
    const char *name;        /* HF name, e.g. "model.layers.3.mlp.experts.7.up_proj.weight" */
    moeq_dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data;        /* into the mmapped file                        */
    size_t nbytes;
    /* F8_E4M3: float32 [ceil(rows/128), ceil(cols/128)], weight = q * scale_inv; Q8R: float32 [rows] */
    const struct moeq_tensor *scale_inv;
    /* Q8R: 1 when products take the activations' hi codes alone (half the products: a view the screened head's
     * first pass reads, engine/head_screen.h), 0 for hi and lo (cpu/ops_draft.h); other dtypes: 0 */
    int q8r_hi_only;
} moeq_tensor;

/*
 * Widen rows [row0, row0+n_rows) of a 2-D weight to float32 into out
 * (n_rows * cols floats), applying F8 block scales. The one dequantisation
 * path every backend and test uses.
 */
void moeq_tensor_rows_to_f32(const moeq_tensor *t, int64_t row0, int64_t n_rows, float *out);

/*
 * Give back the resident pages wholly inside t's bytes (and its scale's): they
 * are re-read from the file if touched again. For weights a process will not
 * read (a group rank's other experts). The data must be a read-only file
 * mapping, as the loader's are. NULL is safe.
 */
void moeq_tensor_drop_pages(const moeq_tensor *t);

/* Rows and columns of a weight seen as a matrix (1-D: one row of shape[0]). */
static inline int64_t moeq_tensor_rows(const moeq_tensor *t) { return t->ndim >= 2 ? t->shape[0] : 1; }
static inline int64_t moeq_tensor_cols(const moeq_tensor *t) {
    return t->ndim >= 2 ? t->shape[t->ndim - 1] : (t->ndim == 1 ? t->shape[0] : 1);
}

/* Scalar conversions: exact widening; narrowing rounds to nearest even (F8: saturates at +-448). */
static inline float moeq_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
uint16_t moeq_f32_to_bf16(float f);
float moeq_f16_to_f32(uint16_t h);
uint16_t moeq_f32_to_f16(float f);
float moeq_f8_e4m3_to_f32(uint8_t b); /* E4M3FN: bias 7, no inf, 0x7f/0xff NaN */
uint8_t moeq_f32_to_f8_e4m3(float f);

/*
 * F8 E4M3 with DeepSeek's 128x128 block scales, for n_rows <= MOEQ_F8_BLOCK rows of cols float values (one row
 * of blocks): moeq_f8_block_scales writes each 128-column block's scale (its largest |value| / 448, so that
 * value is exact; 1 for an all-zero block; non-finite values stay non-finite), moeq_f8_quantize_rows the
 * codes of value / scale. The checkpoint writer and moeq_tensor_f8_copy share them.
 */
void moeq_f8_block_scales(const float *vals, int64_t n_rows, int64_t cols, float *scales);
void moeq_f8_quantize_rows(const float *vals, int64_t n_rows, int64_t cols, const float *scales, uint8_t *out);

/* An F8 E4M3 copy of 2-D weight src with those block scales, in one allocation that free() releases; NULL
 * when memory cannot be had. (MTP drafts, mtp_draft = f8.) */
moeq_tensor *moeq_tensor_f8_copy(const moeq_tensor *src);

/*
 * A Q8R copy of 2-D weight src (cols <= MOEQ_Q8R_MAX_COLS) in one allocation that free() releases; NULL when
 * memory cannot be had. Each row's scale is its largest |value| / 127 (0 for an all-zero row; NaN when the
 * row holds a non-finite value, whose codes are then 0), its codes round(value / scale) to nearest even.
 * The codes are laid out for int8 dot products over 16 rows at once: rows in groups of 16 (the last padded),
 * columns in quads (padded to a multiple of 4 with code 0); group g, quad j is 64 bytes at
 * (g * quads + j) * 64, row r's four codes at (r % 16) * 4. moeq_tensor_rows_to_f32 reads it.
 * The draft copies of mtp_draft = f8 where the CPU backend has the draft kernels (cpu/ops_draft.h): int8
 * sums are exact, so every kernel shape and instruction set gives the same bits.
 */
#define MOEQ_Q8R_MAX_COLS 65536 /* (q + 128) * 127 summed over a row stays inside int32 */
static inline int64_t moeq_q8r_quads(int64_t cols) { return (cols + 3) / 4; }
/* The byte of row r, column c in a Q8R tensor's data. */
static inline size_t moeq_q8r_at(int64_t cols, int64_t r, int64_t c) {
    return (size_t)(((r / 16) * moeq_q8r_quads(cols) + c / 4) * 64 + (r % 16) * 4 + c % 4);
}
/* The value at row r, column c of Q8R tensor t: code times the row's scale. */
static inline float moeq_q8r_value(const moeq_tensor *t, int64_t r, int64_t c) {
    int code = (int)((const uint8_t *)t->data)[moeq_q8r_at(moeq_tensor_cols(t), r, c)] - 128;
    return (float)code * ((const float *)t->scale_inv->data)[r];
}
moeq_tensor *moeq_tensor_q8r_copy(const moeq_tensor *src);

/* Row helpers: widen n contiguous values to float32 (F8: times scale). */
void moeq_bf16_to_f32_row(const uint16_t *in, float *out, size_t n);
void moeq_f16_to_f32_row(const uint16_t *in, float *out, size_t n);
void moeq_f8_e4m3_to_f32_row(const uint8_t *in, float scale, float *out, size_t n);

#endif
