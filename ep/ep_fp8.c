/*
 * ep_fp8.c — the FP8 wire dtype: E4M3 (OCP "fn": bias 7, 3 mantissa bits, no
 * infinities, max 448, 0x7f/0xff NaN) with one float32 scale per block of 128
 * elements, as DeepEP's low-latency dispatch does. A row on the wire is
 * `hidden` code bytes followed by ceil(hidden / 128) scales. The scale is the
 * block's max |x| / 448, so the largest element maps to 448. The codec is
 * pure C with round-to-nearest-even, so every transport gives the same bits.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ep_int.h"

#define E4M3_MAX 448.0f

/*
 * Normal range: round the float's exponent-and-mantissa bits to 3 mantissa
 * bits (nearest, ties to even; a carry moves into the exponent) and rebias
 * the exponent from 127 to 7. Below 2^-6: multiples of 2^-9. Bit operations,
 * not libm, because this runs for every element of every row.
 */
uint8_t moeq_ep_f32_to_e4m3(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t v = u & 0x7fffffffu;
    if (v > 0x7f800000u) return sign | 0x7f;     /* NaN */
    if (v >= 0x43e00000u) return sign | 0x7e;    /* >= 448: saturate (no infinities) */
    if (v < 0x3c800000u) {                       /* < 2^-6: subnormal, q * 2^-9 with q in 0..8 */
        float a;
        memcpy(&a, &v, 4);
        int q = (int)nearbyintf(a * 0x1p9f);
        return sign | (uint8_t)q;                /* q == 8 is 0x08, the smallest normal */
    }
    v += 0x7ffffu + ((v >> 20) & 1u);
    uint32_t code = (v >> 20) - ((127u - 7u) << 3);
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

float moeq_ep_e4m3_to_f32(uint8_t c) {
    uint32_t e = (c >> 3) & 15u, q = c & 7u, u;
    float v;
    if (e == 15 && q == 7) return NAN;
    if (e == 0) v = (float)q * 0x1p-9f;
    else u = ((e + 127u - 7u) << 23) | (q << 20), memcpy(&v, &u, 4);
    return c & 0x80 ? -v : v;
}

size_t moeq_ep_fp8_row_bytes(int hidden) { return (size_t)hidden + 4 * (size_t)((hidden + 127) / 128); }

void moeq_ep_fp8_put(unsigned char *dst, const float *src, int hidden) {
    unsigned char *scales = dst + hidden;
    for (int b0 = 0, blk = 0; b0 < hidden; b0 += 128, blk++) {
        int b1 = b0 + 128 < hidden ? b0 + 128 : hidden;
        float amax = 0;
        for (int i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(src[i]));
        float scale = amax > 0 ? amax / E4M3_MAX : 1.0f;
        if (!isfinite(scale)) scale = NAN; /* a non-finite row stays non-finite */
        for (int i = b0; i < b1; i++) dst[i] = moeq_ep_f32_to_e4m3(src[i] / scale);
        memcpy(scales + 4 * blk, &scale, 4);
    }
}

void moeq_ep_fp8_table(float table[256]) {
    for (int c = 0; c < 256; c++) table[c] = moeq_ep_e4m3_to_f32((uint8_t)c);
}

void moeq_ep_fp8_get(float *dst, const unsigned char *src, int hidden, const float table[256]) {
    const unsigned char *scales = src + hidden;
    for (int b0 = 0, blk = 0; b0 < hidden; b0 += 128, blk++) {
        int b1 = b0 + 128 < hidden ? b0 + 128 : hidden;
        float scale;
        memcpy(&scale, scales + 4 * blk, 4);
        for (int i = b0; i < b1; i++) dst[i] = table[src[i]] * scale;
    }
}
