/*
 * ops.cuh — the per-element arithmetic and the index math of the CUDA
 * kernels, as __host__ __device__ inline functions in plain C, so that the
 * code a kernel runs is also what the host unit tests run
 * (tests/test_cuda_ops_host.c) against the CPU engine's ops, bit for bit.
 *
 * Each helper is a transcription of the engine's operation order:
 *   dot products    16 float lanes, lane l takes k = l, l+16, ... with one
 *                   fmaf each, a chunk past the end adds fmaf(0, 0, lane),
 *                   then the tree 16 -> 8 -> 4 -> 2 -> 1 (ops_lanes.h,
 *                   ops_matmul.c). On the device the lanes are 16 threads and
 *                   the tree is a butterfly of shuffles (xor 8, 4, 2, 1):
 *                   lane i adds lane i^m, which is the tree's sum at every
 *                   level because IEEE addition commutes.
 *   exp             the fixed polynomial of ops_exp.h (one IEEE op a step).
 *   RMSNorm         w * (x * r), r = 1 / sqrtf(dot(x, x) / n + eps) (ops.c).
 *   SiLU product    through exp(-|g|) (ops.c).
 *   RoPE            interleaved input pairs, halves layout out of place
 *                   (rope.c); cos/sin come from the host (moeq_rope_cos_sin).
 *   router          moe.c's moeq_moe_route step for step.
 *
 * Bits hold on the device only if nothing is contracted or approximated:
 * the kernels build with --fmad=false, -prec-div=true, -prec-sqrt=true,
 * -ftz=false (engine/cuda/CMakeLists.txt), as the C build uses
 * -ffp-contract=off. The one libm call left is expf in the router's
 * sigmoid/softmax (the engine's choice; glibc's expf and CUDA's differ in
 * the last bits), so router weights on the device are close, not equal.
 */
#ifndef MOEQ_CUDA_OPS_CUH
#define MOEQ_CUDA_OPS_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MOEQ_HD static __host__ __device__ __forceinline__
#else
#define MOEQ_HD static inline
#endif

#define MOEQ_CU_LANES 16

/* ---- bits ------------------------------------------------------------------- */

MOEQ_HD float moeq_cu_f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

MOEQ_HD uint32_t moeq_cu_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

/* ---- weight widening (ops_matmul.c's wscalar): every stored dtype to float, exactly ------------------ */

/* The engine's moeq_dtype values. */
#define MOEQ_CU_DTYPE_F32 0
#define MOEQ_CU_DTYPE_BF16 1
#define MOEQ_CU_DTYPE_F16 2
#define MOEQ_CU_DTYPE_F8_E4M3 3
#define MOEQ_CU_F8_BLOCK 128

/* bf16 (the upper 16 bits of a float, as safetensors stores it) widened exactly. */
MOEQ_HD float moeq_cu_bf16_to_f32(uint16_t h) { return moeq_cu_f32_from_bits((uint32_t)h << 16); }

MOEQ_HD float moeq_cu_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return moeq_cu_f32_from_bits(s | 0x7f800000u | (m << 13));
    if (e != 0) return moeq_cu_f32_from_bits(s | ((e + 112) << 23) | (m << 13));
    return moeq_cu_f32_from_bits(moeq_cu_f32_bits((float)m * 0x1p-24f) | s); /* subnormal: exact in float */
}

/* e4m3's bits placed into a float (a float subnormal for e4m3 subnormals: -ftz=false matters), times 2^120. */
MOEQ_HD float moeq_cu_f8_e4m3_to_f32(uint8_t b) {
    return moeq_cu_f32_from_bits(((uint32_t)(b & 0x80u) << 24) | ((uint32_t)(b & 0x7fu) << 20)) * 0x1p120f;
}

/* The 128x128 block scale of element (row, k) of an F8 weight with `cols` columns: scale_inv is
 * [ceil(rows/128), ceil(cols/128)] row-major; 1 when there is none. */
MOEQ_HD float moeq_cu_f8_scale(const float *scale_inv, int64_t cols, int64_t row, int64_t k) {
    if (!scale_inv) return 1.0f;
    int64_t ncb = (cols + MOEQ_CU_F8_BLOCK - 1) / MOEQ_CU_F8_BLOCK;
    return scale_inv[(row / MOEQ_CU_F8_BLOCK) * ncb + k / MOEQ_CU_F8_BLOCK];
}

/* Element (row, k) of a [rows, cols] weight of the given dtype, widened as the CPU kernels widen it. */
MOEQ_HD float moeq_cu_widen(int dtype, const void *W, const float *scale_inv, int64_t cols, int64_t row, int64_t k) {
    int64_t i = row * cols + k;
    switch (dtype) {
    case MOEQ_CU_DTYPE_BF16: return moeq_cu_bf16_to_f32(((const uint16_t *)W)[i]);
    case MOEQ_CU_DTYPE_F16: return moeq_cu_f16_to_f32(((const uint16_t *)W)[i]);
    case MOEQ_CU_DTYPE_F8_E4M3:
        return moeq_cu_f8_e4m3_to_f32(((const uint8_t *)W)[i]) * moeq_cu_f8_scale(scale_inv, cols, row, k);
    default: return ((const float *)W)[i];
    }
}

/* ---- the 16-lane reduction ---------------------------------------------------- */

/* One chunk's update of a lane: fmaf(a, b, acc) while inside the vector, fmaf(0, 0, acc) past its end
 * (the engine's zero padding; it turns a -0 lane into +0). */
MOEQ_HD float moeq_cu_lane_fma(int inside, float a, float b, float acc) {
    return inside ? fmaf(a, b, acc) : fmaf(0.0f, 0.0f, acc);
}

/* Chunks of 16 a length-n reduction runs through (every lane takes each one). */
MOEQ_HD int64_t moeq_cu_chunks(int64_t n) { return (n + MOEQ_CU_LANES - 1) / MOEQ_CU_LANES; }

#define MOEQ_CU_DOT_UNROLL 8
#ifdef __CUDA_ARCH__ /* the device pass only: the host compiler knows no such pragma */
#define MOEQ_CU_UNROLL _Pragma("unroll")
#else
#define MOEQ_CU_UNROLL
#endif

/* Lane `lane` of the dot product of a and b over n floats. */
MOEQ_HD float moeq_cu_dot_lane(const float *a, const float *b, int64_t n, int lane) {
    float acc = 0.0f;
    int64_t c = 0, whole = n / MOEQ_CU_LANES;
    /* whole chunks MOEQ_CU_DOT_UNROLL at a time, loaded before the chain uses them (the same fmaf chain: the
     * bits do not change), so that a lane has that many loads in flight rather than one */
    for (; c + MOEQ_CU_DOT_UNROLL <= whole; c += MOEQ_CU_DOT_UNROLL) {
        float av[MOEQ_CU_DOT_UNROLL], bv[MOEQ_CU_DOT_UNROLL];
        MOEQ_CU_UNROLL
        for (int u = 0; u < MOEQ_CU_DOT_UNROLL; u++) {
            av[u] = a[(c + u) * MOEQ_CU_LANES + lane];
            bv[u] = b[(c + u) * MOEQ_CU_LANES + lane];
        }
        MOEQ_CU_UNROLL
        for (int u = 0; u < MOEQ_CU_DOT_UNROLL; u++) acc = fmaf(av[u], bv[u], acc);
    }
    for (int64_t nc = moeq_cu_chunks(n); c < nc; c++) {
        int64_t k = c * MOEQ_CU_LANES + lane;
        acc = k < n ? fmaf(a[k], b[k], acc) : fmaf(0.0f, 0.0f, acc);
    }
    return acc;
}

/* The device's butterfly over 16 lanes, emulated: at each step lane i adds lane i^m to itself (own value
 * first, as `v += __shfl_xor_sync(.., v, m, 16)` does). Every lane ends with the tree's sum. */
MOEQ_HD void moeq_cu_butterfly16(float *v) {
    for (int m = 8; m > 0; m >>= 1) {
        float t[MOEQ_CU_LANES];
        for (int i = 0; i < MOEQ_CU_LANES; i++) t[i] = v[i] + v[i ^ m];
        for (int i = 0; i < MOEQ_CU_LANES; i++) v[i] = t[i];
    }
}

/* ---- exp for x <= 0 (ops_exp.h) ------------------------------------------------ */

#define MOEQ_CU_EXP_LOG2E 1.44269504088896341f
#define MOEQ_CU_EXP_ROUND 12582912.0f
#define MOEQ_CU_EXP_LN2_HI 0.693359375f
#define MOEQ_CU_EXP_LN2_LO -2.12194440e-4f
#define MOEQ_CU_EXP_P0 1.9875691500e-4f
#define MOEQ_CU_EXP_P1 1.3981999507e-3f
#define MOEQ_CU_EXP_P2 8.3334519073e-3f
#define MOEQ_CU_EXP_P3 4.1665795894e-2f
#define MOEQ_CU_EXP_P4 1.6666665459e-1f
#define MOEQ_CU_EXP_P5 5.0000001201e-1f
#define MOEQ_CU_EXP_MIN -87.0f

MOEQ_HD float moeq_cu_exp_nonpos(float x) {
    if (!(x >= MOEQ_CU_EXP_MIN)) return 0.0f;
    float n = fmaf(x, MOEQ_CU_EXP_LOG2E, MOEQ_CU_EXP_ROUND) - MOEQ_CU_EXP_ROUND;
    float r = fmaf(n, -MOEQ_CU_EXP_LN2_HI, x);
    r = fmaf(n, -MOEQ_CU_EXP_LN2_LO, r);
    float p = fmaf(MOEQ_CU_EXP_P0, r, MOEQ_CU_EXP_P1);
    p = fmaf(p, r, MOEQ_CU_EXP_P2);
    p = fmaf(p, r, MOEQ_CU_EXP_P3);
    p = fmaf(p, r, MOEQ_CU_EXP_P4);
    p = fmaf(p, r, MOEQ_CU_EXP_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    return y * moeq_cu_f32_from_bits((uint32_t)((int32_t)n + 127) << 23);
}

/* ---- element-wise ops ------------------------------------------------------------ */

/* The RMSNorm factor from the row's sum of squares (the tree's result); NaN when that is not finite. */
MOEQ_HD float moeq_cu_rmsnorm_factor(float sumsq, int64_t n, float eps) {
    float var = sumsq / (float)n;
    return isfinite(var) ? 1.0f / sqrtf(var + eps) : NAN;
}

MOEQ_HD float moeq_cu_rmsnorm_elem(float x, float w, float r) { return w * (x * r); }

/* silu(g) * u = g * sigmoid(g) * u, sigmoid through exp(-|g|) so exp never overflows. */
MOEQ_HD float moeq_cu_silu_mul(float g, float u) {
    float e = moeq_cu_exp_nonpos(0.0f - fabsf(g)), d = 1.0f + e;
    return (g >= 0.0f ? g / d : (g * e) / d) * u;
}

/* ---- RoPE --------------------------------------------------------------------------- */

/*
 * One thread per (token t, head h, pair i): idx = (t * H + h) * half + i. The pair (x[2i], x[2i+1]) of the
 * head's rope part goes to out[i] and out[i + half]; cos/sin are row pos[t] of tables [max_pos, half].
 */
typedef struct moeq_cu_rope_at {
    int64_t t, h, i;
} moeq_cu_rope_at;

MOEQ_HD moeq_cu_rope_at moeq_cu_rope_index(int64_t idx, int64_t H, int64_t half) {
    moeq_cu_rope_at a;
    a.i = idx % half;
    a.h = (idx / half) % H;
    a.t = idx / half / H;
    return a;
}

MOEQ_HD void moeq_cu_rope_pair(const float *x, float cs, float sn, int64_t i, int64_t half, float *out) {
    float a = x[2 * i], b = x[2 * i + 1];
    out[i] = a * cs - b * sn;
    out[i + half] = b * cs + a * sn;
}

/* ---- bf16 matmul tiling ---------------------------------------------------------------- */

/*
 * y[t, o] = sum_k x[t, k] * W[o, k], W bf16 [O, K]. A block of MOEQ_CU_MM_ROWS half-warps; half-warp r of
 * block (bx, by) owns output row o = bx * ROWS + r for tokens [by * TILE_T, +TILE_T), and its thread `lane`
 * holds lane `lane` of every token's 16-lane reduction (W's row read once per tile, 16 consecutive bf16 per
 * chunk). Which elements share a tile changes nothing in any element's order: batch-invariant, and equal
 * to the CPU kernels' bits.
 */
#define MOEQ_CU_MM_ROWS 8
#define MOEQ_CU_MM_TILE_T 8
#define MOEQ_CU_MM_THREADS (MOEQ_CU_MM_ROWS * MOEQ_CU_LANES)

typedef struct moeq_cu_mm_at {
    int64_t o, t0;
    int nt, lane; /* tokens in this tile (0: the half-warp is past O or T) */
} moeq_cu_mm_at;

MOEQ_HD moeq_cu_mm_at moeq_cu_mm_index(int64_t bx, int64_t by, int tid, int64_t T, int64_t O) {
    moeq_cu_mm_at a;
    a.lane = tid % MOEQ_CU_LANES;
    a.o = bx * MOEQ_CU_MM_ROWS + tid / MOEQ_CU_LANES;
    a.t0 = by * MOEQ_CU_MM_TILE_T;
    int64_t left = T - a.t0;
    a.nt = a.o >= O || left <= 0 ? 0 : (int)(left < MOEQ_CU_MM_TILE_T ? left : MOEQ_CU_MM_TILE_T);
    return a;
}

MOEQ_HD int64_t moeq_cu_mm_grid_x(int64_t O) { return (O + MOEQ_CU_MM_ROWS - 1) / MOEQ_CU_MM_ROWS; }
MOEQ_HD int64_t moeq_cu_mm_grid_y(int64_t T) { return (T + MOEQ_CU_MM_TILE_T - 1) / MOEQ_CU_MM_TILE_T; }

/* One thread's lanes: acc[j] = lane `a.lane` of y[a.t0 + j, a.o], j < a.nt, for a [O, K] weight of any stored
 * dtype (scale_inv: F8's block scales, else NULL). x has row stride ldx.
 *
 * The chunks that lie wholly inside K go MOEQ_CU_MM_UNROLL at a time, their weights loaded before the first
 * multiply-add: a thread then has that many loads in flight instead of one, which is what lets a decode step's
 * products (each weight read once) approach the memory's bandwidth. Each lane's chain is the same sequence of
 * fmaf in chunk order either way, so the bits do not change. */
#define MOEQ_CU_MM_UNROLL 8
/* The weight of chunk c at this lane, and the factor its activation takes (F8 as the CPU's NT kernels take it:
 * the weight q / 256, exact, and the activation x * (256 * scale)). */
MOEQ_HD float moeq_cu_mm_weight(int dtype, const void *W, const float *scale_inv, int64_t K, int64_t o, int64_t k,
                                float *xf) {
    if (dtype == MOEQ_CU_DTYPE_F8_E4M3) {
        *xf = 256.0f * moeq_cu_f8_scale(scale_inv, K, o, k);
        return moeq_cu_f8_e4m3_to_f32(((const uint8_t *)W)[o * K + k]) * 0x1p-8f;
    }
    *xf = 1.0f;
    return moeq_cu_widen(dtype, W, scale_inv, K, o, k);
}

MOEQ_HD void moeq_cu_mm_lanes(float *acc, moeq_cu_mm_at a, const float *x, int64_t ldx, int dtype, const void *W,
                              const float *scale_inv, int64_t K) {
    for (int j = 0; j < MOEQ_CU_MM_TILE_T; j++) acc[j] = 0.0f;
    int64_t c = 0, whole = K / MOEQ_CU_LANES;
    for (; c + MOEQ_CU_MM_UNROLL <= whole; c += MOEQ_CU_MM_UNROLL) {
        float wv[MOEQ_CU_MM_UNROLL], xf[MOEQ_CU_MM_UNROLL];
        MOEQ_CU_UNROLL
        for (int u = 0; u < MOEQ_CU_MM_UNROLL; u++)
            wv[u] = moeq_cu_mm_weight(dtype, W, scale_inv, K, a.o, (c + u) * MOEQ_CU_LANES + a.lane, &xf[u]);
        MOEQ_CU_UNROLL
        for (int u = 0; u < MOEQ_CU_MM_UNROLL; u++) {
            int64_t k = (c + u) * MOEQ_CU_LANES + a.lane;
            MOEQ_CU_UNROLL
            for (int j = 0; j < MOEQ_CU_MM_TILE_T; j++) {
                if (j >= a.nt) continue;
                float xv = x[(a.t0 + j) * ldx + k];
                if (dtype == MOEQ_CU_DTYPE_F8_E4M3) xv *= xf[u];
                acc[j] = fmaf(xv, wv[u], acc[j]);
            }
        }
    }
    for (int64_t nc = moeq_cu_chunks(K); c < nc; c++) {
        int64_t k = c * MOEQ_CU_LANES + a.lane;
        int inside = k < K;
        float wv = 0.0f, xf = 1.0f;
        if (inside) wv = moeq_cu_mm_weight(dtype, W, scale_inv, K, a.o, k, &xf);
        for (int j = 0; j < MOEQ_CU_MM_TILE_T; j++) {
            if (j >= a.nt) continue;
            float xv = inside ? x[(a.t0 + j) * ldx + k] : 0.0f;
            if (dtype == MOEQ_CU_DTYPE_F8_E4M3) xv *= xf;
            acc[j] = moeq_cu_lane_fma(inside, xv, wv, acc[j]);
        }
    }
}

/* The bf16 kernel's: the dtype a constant, so the switch folds away. */
MOEQ_HD void moeq_cu_mm_bf16_lanes(float *acc, moeq_cu_mm_at a, const float *x, int64_t ldx, const uint16_t *W,
                                   int64_t K) {
    moeq_cu_mm_lanes(acc, a, x, ldx, MOEQ_CU_DTYPE_BF16, W, NULL, K);
}

/* ---- few-token NT: two threads a row, 16-byte weight loads ----------------------------------------------- */

/*
 * For a tile of at most 8 tokens (decode steps, experts with few tokens) of BF16 or F8 weights whose K is a
 * multiple of 16: two threads a weight row, thread h holding lanes 8h .. 8h + 7 of each chunk, so that a chunk's
 * weights are one 16-byte load (8 bytes for F8) per thread rather than 16 two-byte loads a row, and
 * MOEQ_CU_MV_UNROLL chunks are loaded before their multiply-adds (the two-byte loads of moeq_cu_mm_lanes were
 * issued one chunk at a time, interleaved with the multiply-adds: about two in flight a thread). Lane l's chain
 * is moeq_cu_mm_lanes' fmaf sequence in chunk order, and moeq_cu_mv_reduce is the butterfly with its first level
 * across the two threads: the same bits.
 */
#define MOEQ_CU_MV_UNROLL 8
#define MOEQ_CU_MV_ROWS 64 /* weight rows a block of 128 threads takes */
#define MOEQ_CU_MV_MAX_TOK 8

typedef struct moeq_cu_raw16 {
    uint32_t u[4];
} moeq_cu_raw16;

/* The 8 weights of lanes k0 .. k0 + 7 of row o as stored (16 bytes of BF16, 8 of F8), in one load. */
MOEQ_HD moeq_cu_raw16 moeq_cu_mv_load(int dtype, const void *W, int64_t K, int64_t o, int64_t k0) {
    moeq_cu_raw16 r;
#ifdef __CUDA_ARCH__
    if (dtype == MOEQ_CU_DTYPE_F8_E4M3) {
        uint2 v = __ldg((const uint2 *)((const uint8_t *)W + o * K + k0));
        r.u[0] = v.x, r.u[1] = v.y, r.u[2] = 0u, r.u[3] = 0u;
    } else {
        uint4 v = __ldg((const uint4 *)((const uint16_t *)W + o * K + k0));
        r.u[0] = v.x, r.u[1] = v.y, r.u[2] = v.z, r.u[3] = v.w;
    }
#else
    memset(&r, 0, sizeof r);
    if (dtype == MOEQ_CU_DTYPE_F8_E4M3) memcpy(r.u, (const uint8_t *)W + o * K + k0, 8);
    else memcpy(r.u, (const uint16_t *)W + o * K + k0, 16);
#endif
    return r;
}

/* Weight i of a load as the NT kernels take it (F8: q / 256, exact). Little-endian: element i is at byte
 * (size) * i, as the stored row. */
MOEQ_HD float moeq_cu_mv_elem(int dtype, moeq_cu_raw16 r, int i) {
    if (dtype == MOEQ_CU_DTYPE_F8_E4M3)
        return moeq_cu_f8_e4m3_to_f32((uint8_t)(r.u[i / 4] >> (8 * (i % 4)))) * 0x1p-8f;
    return moeq_cu_bf16_to_f32((uint16_t)(r.u[i / 2] >> (16 * (i % 2))));
}

/* Eight activations x[0 .. 8) (16-byte aligned on the device: the launch checks x and its strides). */
MOEQ_HD void moeq_cu_mv_x8(const float *x, float *out) {
#ifdef __CUDA_ARCH__
    float4 a = *(const float4 *)x, b = *(const float4 *)(x + 4);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
#else
    memcpy(out, x, 8 * sizeof(float));
#endif
}

/* One chunk's multiply-adds of a thread: its 8 lanes for tokens t0 .. t0 + nt. */
MOEQ_HD void moeq_cu_mv_chunk(float *acc, int nt_max, int nt, moeq_cu_raw16 r, int64_t o, int64_t k0, int64_t t0,
                              const float *x, int64_t ldx, int dtype, const float *scale_inv, int64_t K) {
    /* the 8 lanes lie in one 128-column scale block: k0 is a multiple of 8 */
    float xf = dtype == MOEQ_CU_DTYPE_F8_E4M3 ? 256.0f * moeq_cu_f8_scale(scale_inv, K, o, k0) : 1.0f;
    MOEQ_CU_UNROLL
    for (int j = 0; j < nt_max; j++) {
        if (j >= nt) continue;
        float xv[8];
        moeq_cu_mv_x8(x + (t0 + j) * ldx + k0, xv);
        MOEQ_CU_UNROLL
        for (int i = 0; i < 8; i++) {
            float a = xv[i];
            if (dtype == MOEQ_CU_DTYPE_F8_E4M3) a *= xf;
            acc[j * 8 + i] = fmaf(a, moeq_cu_mv_elem(dtype, r, i), acc[j * 8 + i]);
        }
    }
}

/* Thread h of weight row o (absolute): acc[j * 8 + i] = lane 8h + i of y[t0 + j, .] for j < nt <= nt_max. x has
 * row stride ldx; K % 16 == 0. Whole groups of MOEQ_CU_MV_UNROLL chunks load all their weights first (no
 * predicate between the loads and their uses, so the compiler keeps them ahead), the rest a chunk at a time. */
MOEQ_HD void moeq_cu_mv_lanes(float *acc, int nt_max, int nt, int h, int64_t o, int64_t t0, const float *x,
                              int64_t ldx, int dtype, const void *W, const float *scale_inv, int64_t K) {
    for (int i = 0; i < nt_max * 8; i++) acc[i] = 0.0f;
    int64_t nc = K / MOEQ_CU_LANES, c = 0;
    if (nc >= MOEQ_CU_MV_UNROLL) {
        /* double-buffered: the next group's weights are loaded before this group's multiply-adds, so they are in
         * flight while those run (loaded and used in one iteration, the compiler issued them one chunk ahead) */
        moeq_cu_raw16 r[MOEQ_CU_MV_UNROLL], next[MOEQ_CU_MV_UNROLL];
        MOEQ_CU_UNROLL
        for (int u = 0; u < MOEQ_CU_MV_UNROLL; u++) r[u] = moeq_cu_mv_load(dtype, W, K, o, u * MOEQ_CU_LANES + 8 * h);
        for (; c + MOEQ_CU_MV_UNROLL <= nc; c += MOEQ_CU_MV_UNROLL) {
            int more = c + 2 * MOEQ_CU_MV_UNROLL <= nc;
            int64_t k_next = (c + MOEQ_CU_MV_UNROLL) * MOEQ_CU_LANES + 8 * h;
            MOEQ_CU_UNROLL
            for (int u = 0; u < MOEQ_CU_MV_UNROLL; u++)
                if (more) next[u] = moeq_cu_mv_load(dtype, W, K, o, k_next + u * MOEQ_CU_LANES);
            MOEQ_CU_UNROLL
            for (int u = 0; u < MOEQ_CU_MV_UNROLL; u++)
                moeq_cu_mv_chunk(acc, nt_max, nt, r[u], o, (c + u) * MOEQ_CU_LANES + 8 * h, t0, x, ldx, dtype,
                                 scale_inv, K);
            MOEQ_CU_UNROLL
            for (int u = 0; u < MOEQ_CU_MV_UNROLL; u++) r[u] = next[u];
        }
    }
    for (; c < nc; c++)
        moeq_cu_mv_chunk(acc, nt_max, nt, moeq_cu_mv_load(dtype, W, K, o, c * MOEQ_CU_LANES + 8 * h), o,
                         c * MOEQ_CU_LANES + 8 * h, t0, x, ldx, dtype, scale_inv, K);
}

/* The butterfly of 16 lanes held as lo = lanes 0..7 and hi = lanes 8..15 (moeq_cu_butterfly16's lane 0). */
MOEQ_HD float moeq_cu_mv_reduce(const float *lo, const float *hi) {
    float s[8];
    for (int i = 0; i < 8; i++) s[i] = lo[i] + hi[i];
    float u0 = s[0] + s[4], u1 = s[1] + s[5], u2 = s[2] + s[6], u3 = s[3] + s[7];
    return (u0 + u2) + (u1 + u3);
}

/* The smallest tile of 1, 2, 4 or 8 tokens that holds n (n <= 8). */
MOEQ_HD int moeq_cu_mv_tile(int64_t n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8; }

/* ---- many-token NT: 32 x 32 output tiles, operands staged in shared memory ------------------------------------- */

/*
 * For more than 8 tokens (prefill chunks, large decode batches, experts with many tokens): a block of 256 threads
 * takes 32 weight rows x 32 tokens. Thread (lane l = tid % 16, group g = tid / 16) keeps lane l of an 8 x 8 block
 * of those outputs (rows 8 (g % 4) .., tokens 8 (g / 4) ..), 64 accumulators, so that each operand it reads from
 * shared memory feeds 8 multiply-adds (the 16-lane kernels read both operands from global memory, one
 * multiply-add each). Stages of MOEQ_CU_MT_CH chunks: the block widens the weights (F8: q / 256) and scales the
 * activations (F8: x * 256 * scale, the tile's rows sharing one 128-row scale block) into shared memory, as the
 * lanes' chains take them; places past K hold zeros, which is moeq_cu_lane_fma's fmaf(0, 0, acc) there. Every
 * lane's chain is the 16-lane kernels' fmaf sequence in chunk order, and the tree over a half-warp's 16 lanes is
 * the butterfly: the same bits (tests/test_backend_cuda_host.c plays a block's threads).
 */
#define MOEQ_CU_MT_ROWS 32
#define MOEQ_CU_MT_TOK 32
#define MOEQ_CU_MT_THREADS 256
#define MOEQ_CU_MT_CH 8 /* chunks a stage */
/* floats a staged row, padded so that rows 8 apart start 16 banks apart: a warp's two 8-row groups read disjoint
 * banks of the weights (its 16 lanes read 16 consecutive floats of a row) */
#define MOEQ_CU_MT_LD (MOEQ_CU_MT_CH * MOEQ_CU_LANES + 2)

/* Stage [c0, c0 + MOEQ_CU_MT_CH) chunks (those past K: zeros) of weight rows o0 .. o0 + 32 of W (absolute rows,
 * valid below o_end) into ws and of tokens t0 .. t0 + 32 of x (valid below t_end) into xs: thread tid of
 * nthreads fills elements tid, tid + nthreads, ... The F8 factor is that of row o0's scale block. */
MOEQ_HD void moeq_cu_mt_stage(float *ws, float *xs, int tid, int nthreads, int dtype, const void *W,
                              const float *scale_inv, int64_t K, int64_t o0, int64_t o_end, const float *x,
                              int64_t ldx, int64_t t0, int64_t t_end, int64_t c0) {
    for (int idx = tid; idx < MOEQ_CU_MT_ROWS * MOEQ_CU_MT_CH * MOEQ_CU_LANES; idx += nthreads) {
        int r = idx / (MOEQ_CU_MT_CH * MOEQ_CU_LANES), kk = idx % (MOEQ_CU_MT_CH * MOEQ_CU_LANES);
        int64_t k = c0 * MOEQ_CU_LANES + kk, o = o0 + r, t = t0 + r;
        float w = 0.0f, a = 0.0f;
        if (k < K && o < o_end)
            w = dtype == MOEQ_CU_DTYPE_F8_E4M3 ? moeq_cu_f8_e4m3_to_f32(((const uint8_t *)W)[o * K + k]) * 0x1p-8f
                                               : moeq_cu_widen(dtype, W, scale_inv, K, o, k);
        if (k < K && t < t_end) {
            a = x[t * ldx + k];
            if (dtype == MOEQ_CU_DTYPE_F8_E4M3) a *= 256.0f * moeq_cu_f8_scale(scale_inv, K, o0, k);
        }
        ws[r * MOEQ_CU_MT_LD + kk] = w;
        xs[r * MOEQ_CU_MT_LD + kk] = a;
    }
}

/* Thread (lane, rows 8 gr .., tokens 8 gt ..): n_ch staged chunks into acc[i * 8 + j] (row i, token j). */
MOEQ_HD void moeq_cu_mt_compute(float *acc, const float *ws, const float *xs, int lane, int gr, int gt, int n_ch) {
    for (int c = 0; c < n_ch; c++) {
        float xv[8];
        MOEQ_CU_UNROLL
        for (int j = 0; j < 8; j++) xv[j] = xs[(gt * 8 + j) * MOEQ_CU_MT_LD + c * MOEQ_CU_LANES + lane];
        MOEQ_CU_UNROLL
        for (int i = 0; i < 8; i++) {
            float wv = ws[(gr * 8 + i) * MOEQ_CU_MT_LD + c * MOEQ_CU_LANES + lane];
            MOEQ_CU_UNROLL
            for (int j = 0; j < 8; j++) acc[i * 8 + j] = fmaf(xv[j], wv, acc[i * 8 + j]);
        }
    }
}

/* Chunks of a stage from c0 that the chain takes: at most MOEQ_CU_MT_CH, none past the last (partial) chunk. */
MOEQ_HD int moeq_cu_mt_stage_chunks(int64_t K, int64_t c0) {
    int64_t left = moeq_cu_chunks(K) - c0;
    return left < MOEQ_CU_MT_CH ? (int)left : MOEQ_CU_MT_CH;
}

/* Item y of a grouped call's 32-token tiles, in expert order (offsets: the plan's, E + 1 of them): its expert
 * and *tile, or -1 past the last. A block finds its own: at most E steps. */
MOEQ_HD int moeq_cu_mt_item(const int64_t *offsets, int E, int64_t y, int64_t *tile) {
    for (int e = 0; e < E; e++) {
        int64_t n = (offsets[e + 1] - offsets[e] + MOEQ_CU_MT_TOK - 1) / MOEQ_CU_MT_TOK;
        if (y < n) {
            *tile = y;
            return e;
        }
        y -= n;
    }
    return -1;
}

/* ---- router (moe.c) ------------------------------------------------------------------------ */

#define MOEQ_CU_ROUTE_MAX_EXPERTS 256

/* Plain data, field for field the engine's moeq_moe_router; method: 0 greedy, 1 group-limited greedy,
 * 2 noaux_tc (the engine's moeq_moe_method values). */
typedef struct moeq_cu_router {
    int n_experts, top_k, n_group, topk_group;
    int sigmoid, method, norm_topk_prob, scale_always;
    float scaling;
} moeq_cu_router;

MOEQ_HD int moeq_cu_argmax_first(const float *v, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (v[i] > -INFINITY && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

MOEQ_HD float moeq_cu_group_score(const moeq_cu_router *r, const float *g, int size) {
    if (r->method == 1 || size < 2) {
        float m = g[0];
        for (int i = 1; i < size; i++) m = g[i] > m ? g[i] : m;
        return m;
    }
    int a = 0;
    for (int i = 1; i < size; i++)
        if (g[i] > g[a]) a = i;
    int b = a == 0 ? 1 : 0;
    for (int i = 0; i < size; i++)
        if (i != a && g[i] > g[b]) b = i;
    return g[a] + g[b];
}

MOEQ_HD void moeq_cu_mask_groups(const moeq_cu_router *r, float *choice, float *gscore) {
    int size = r->n_experts / r->n_group;
    for (int g = 0; g < r->n_group; g++) gscore[g] = moeq_cu_group_score(r, choice + g * size, size);
    for (int kept = 0; kept < r->topk_group; kept++) {
        int g = moeq_cu_argmax_first(gscore, r->n_group);
        if (g < 0) break;
        gscore[g] = NAN;
    }
    for (int g = 0; g < r->n_group; g++)
        if (!isnan(gscore[g]))
            for (int i = 0; i < size; i++) choice[g * size + i] = -INFINITY;
}

MOEQ_HD int moeq_cu_first_unpicked(const int32_t *ids, int s) {
    for (int e = 0;; e++) {
        int taken = 0;
        for (int j = 0; j < s && !taken; j++) taken = ids[j] == e;
        if (!taken) return e;
    }
}

/* The engine's softmax (max-subtracted, expf, ascending sum, divide), in place. */
MOEQ_HD void moeq_cu_softmax(float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

/* ---- the router as a warp a token ------------------------------------------------------------------------- */

/*
 * moeq_cu_route's steps split over the 32 lanes of a warp (backend_cuda.cu's route_warp_kernel), with the same
 * helpers where order matters: per-expert scores, bias and masks lane-strided (each element its own arithmetic);
 * the softmax's ascending sum and the top-k weights' sum by lane 0; each group's score by one lane
 * (moeq_cu_group_score); the groups kept by lane 0 (moeq_cu_argmax_first). Each top-k pick is a warp argmax:
 * every lane's first best among its elements, then the better of two (value by >, a tie to the lower index),
 * which is moeq_cu_argmax_first's pick whatever the tree. The same ids and weights; one thread a token took
 * ~40 us for 64 experts (its scratch in local memory, one chain of loads).
 */
#define MOEQ_CU_WARP 32

typedef struct moeq_cu_pick {
    float v;
    int i; /* -1: no element above -inf */
} moeq_cu_pick;

/* Lane `lane`'s first best among v[lane], v[lane + 32], ...: moeq_cu_argmax_first over its elements. */
MOEQ_HD moeq_cu_pick moeq_cu_pick_lane(const float *v, int n, int lane) {
    moeq_cu_pick p = {-INFINITY, -1};
    for (int i = lane; i < n; i += MOEQ_CU_WARP)
        if (v[i] > -INFINITY && (p.i < 0 || v[i] > p.v)) p.v = v[i], p.i = i;
    return p;
}

/* The better of two lanes' picks: a larger value, or the lower index on a tie (neither NaN). */
MOEQ_HD moeq_cu_pick moeq_cu_pick_better(moeq_cu_pick a, moeq_cu_pick b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if (b.v > a.v || (!(a.v > b.v) && b.i < a.i)) return b;
    return a;
}

/* Score of expert i (before the softmax, which lane 0 runs over all of them). */
MOEQ_HD float moeq_cu_route_score(const moeq_cu_router *r, float logit) {
    return r->sigmoid ? 1.0f / (1.0f + expf(-logit)) : logit;
}

/* The top-k picks' weights from their scores (lane 0): moeq_cu_route's normalisation. */
MOEQ_HD void moeq_cu_route_weights(const moeq_cu_router *r, float *weights, float sum) {
    int norm = r->top_k > 1 && r->norm_topk_prob;
    for (int s = 0; s < r->top_k; s++) {
        if (norm) weights[s] /= sum + 1e-20f;
        if (!norm || r->scale_always) weights[s] *= r->scaling;
    }
}

/* One token, as moeq_moe_route: scratch holds 2 * n_experts + n_group floats. Returns 1, or 0 when a logit
 * is not finite. */
MOEQ_HD int moeq_cu_route(const moeq_cu_router *r, const float *logits, const float *bias, int32_t *ids,
                          float *weights, float *scratch) {
    int n = r->n_experts, finite = 1;
    float *scores = scratch, *choice = scratch + n, *gscore = scratch + 2 * n;
    for (int i = 0; i < n; i++) finite &= isfinite(logits[i]) != 0;
    for (int i = 0; i < n; i++) scores[i] = moeq_cu_route_score(r, logits[i]);
    if (!r->sigmoid) moeq_cu_softmax(scores, n);
    for (int i = 0; i < n; i++) choice[i] = scores[i] + (bias && r->method == 2 ? bias[i] : 0.0f);
    if (r->method != 0 && r->n_group > 1) moeq_cu_mask_groups(r, choice, gscore);
    float sum = 0.0f;
    for (int s = 0; s < r->top_k; s++) {
        int e = moeq_cu_argmax_first(choice, n);
        if (e < 0) e = moeq_cu_first_unpicked(ids, s);
        choice[e] = -INFINITY;
        ids[s] = e;
        weights[s] = scores[e];
        sum += scores[e];
    }
    moeq_cu_route_weights(r, weights, sum);
    return finite;
}

#endif
