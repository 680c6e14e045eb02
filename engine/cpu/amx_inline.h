/*
 * amx_inline.h — internal: the pieces the AMX tile kernels share (ops_amx.c for
 * the weight products, attention_amx.c for MLA attention): the tile
 * configuration, the float32 -> bf16 split as the emulations compute it, and
 * a 16 x 16 dword transpose.
 */
#ifndef MOEQ_ENGINE_AMX_INLINE_H
#define MOEQ_ENGINE_AMX_INLINE_H

#include <stdint.h>
#include <string.h>

#include "tensor.h"

/* float32 -> bf16 as VCVTNE2PS2BF16 does it: denormals to signed zero, NaN quieted, else to nearest even. */
static inline uint16_t moeq_bf16_rne_daz(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* x = hi + lo + (a rest below 2^-17 |x|): the split every AMX operand built from float32 takes. */
static inline void moeq_bf16_split(float x, uint16_t *hi, uint16_t *lo) {
    *hi = moeq_bf16_rne_daz(x);
    *lo = moeq_bf16_rne_daz(x - moeq_bf16_to_f32(*hi));
}

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define MOEQ_AMX_X86 1
#include <immintrin.h>

#define AMX_ALWAYS_INLINE inline __attribute__((always_inline))
#define TAMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,amx-tile,amx-bf16")))

typedef struct moeq_tile_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} moeq_tile_config;

/* Every tile 16 rows x 64 bytes. */
static const moeq_tile_config moeq_amx_full_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* 16x16 transpose of 32-bit elements: r[i].e[j] becomes r[j].e[i]. */
static TAMX AMX_ALWAYS_INLINE void moeq_transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* each 128-bit lane q of r[4a + b] now holds elements (4a..4a+3, 4q + b) */
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

/* The four accumulator tiles tmm0-3: zeroed, and one of them stored or loaded (tile numbers must be
 * immediates, hence the switches). */
static TAMX AMX_ALWAYS_INLINE void moeq_amx_zero_c4(void) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

static TAMX AMX_ALWAYS_INLINE void moeq_amx_store_c(int tile, float *dst, int64_t ld_bytes) {
    switch (tile) {
    case 0: _tile_stored(0, dst, ld_bytes); break;
    case 1: _tile_stored(1, dst, ld_bytes); break;
    case 2: _tile_stored(2, dst, ld_bytes); break;
    default: _tile_stored(3, dst, ld_bytes); break;
    }
}

static TAMX AMX_ALWAYS_INLINE void moeq_amx_load_c(int tile, const float *src, int64_t ld_bytes) {
    switch (tile) {
    case 0: _tile_loadd(0, src, ld_bytes); break;
    case 1: _tile_loadd(1, src, ld_bytes); break;
    case 2: _tile_loadd(2, src, ld_bytes); break;
    default: _tile_loadd(3, src, ld_bytes); break;
    }
}

/* bf16 words 0..15 / 16..31 of v as floats. */
static TAMX AMX_ALWAYS_INLINE __m512 moeq_bf16_lo_f32(__m512i v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
}
static TAMX AMX_ALWAYS_INLINE __m512 moeq_bf16_hi_f32(__m512i v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
}
#endif

#endif
