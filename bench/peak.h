/*
 * bench/peak.h — this CPU's arithmetic peak, measured: microkernels of independent
 * 512-bit (and 256-bit) float32 FMAs and, where the CPU has AVX512-BF16, of
 * `vdpbf16ps` (32 bf16 products into 16 float32 lanes), run on every thread at
 * once. Shared by bench-matmul and bench-engine (header-only: each bench is one
 * program).
 */
#ifndef MOEQ_BENCH_PEAK_H
#define MOEQ_BENCH_PEAK_H

#include <pthread.h>

#include "moeq/engine.h"
#include "moeq/util.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define BENCH_X86 1
#include <immintrin.h>
#endif

enum { PEAK_FMA512 = 0, PEAK_FMA256 = 1, PEAK_DPBF16 = 2, PEAK_AMX = 3 };

typedef struct peak_arg {
    int kind; /* 0: fp32 fma zmm, 1: fp32 fma ymm, 2: vdpbf16ps zmm, 3: AMX tdpbf16ps */
    long iters;
    double flops, seconds;
    float sink;
} peak_arg;

#ifdef BENCH_X86
/* 12 independent accumulators: enough to cover an FMA's latency on two ports. */
__attribute__((target("avx512f"))) static float peak_fma512(long iters) {
    __m512 a[12], m = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float peak_fma256(long iters) {
    __m256 a[12], m = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    float o[8];
    _mm256_storeu_ps(o, s);
    return o[0] + o[7];
}

__attribute__((target("avx512f,avx512bf16"))) static float peak_dpbf16(long iters) {
    __m512 a[12];
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

/* Four independent 16x16 accumulator tiles, each TDPBF16PS 16 x 16 x 32 products; the caller has the tile
 * state from Linux (moeq_engine_cpu_amx()). */
__attribute__((target("amx-tile,amx-bf16"))) static float peak_amx(long iters) {
    static const struct {
        unsigned char palette, start, reserved[14];
        unsigned short colsb[16];
        unsigned char rows[16];
    } cfg = {.palette = 1, .colsb = {64, 64, 64, 64, 64, 64, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, 16, 16}};
    static _Thread_local unsigned short ab[2][512];
    static _Thread_local float c[256];
    for (int i = 0; i < 512; i++) ab[0][i] = 0x3f80, ab[1][i] = 0x3380;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ab[0], 64);
    _tile_loadd(5, ab[1], 64);
    for (long it = 0; it < iters; it++) {
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 5);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, c, 64);
    _tile_release();
    return c[0];
}
#endif

static inline void *peak_run(void *p) {
    peak_arg *a = p;
    int64_t t0 = moeq_mono_ns();
#ifdef BENCH_X86
    if (a->kind == 0) a->sink = peak_fma512(a->iters), a->flops = a->iters * 12.0 * 16 * 2;
    if (a->kind == 1) a->sink = peak_fma256(a->iters), a->flops = a->iters * 12.0 * 8 * 2;
    if (a->kind == 2) a->sink = peak_dpbf16(a->iters), a->flops = a->iters * 12.0 * 32 * 2;
    if (a->kind == 3) a->sink = peak_amx(a->iters / 8), a->flops = a->iters / 8 * 4.0 * 16 * 16 * 32 * 2;
#endif
    a->seconds = (moeq_mono_ns() - t0) * 1e-9;
    return NULL;
}

/* GFLOP/s of kind on n_threads at once, best of 3. */
static inline double peak_gflops(int kind, int n_threads) {
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        pthread_t th[64];
        peak_arg args[64];
        for (int i = 0; i < n_threads; i++) {
            args[i] = (peak_arg){.kind = kind, .iters = 20000000};
            pthread_create(&th[i], NULL, peak_run, &args[i]);
        }
        double total = 0;
        for (int i = 0; i < n_threads; i++) {
            pthread_join(th[i], NULL);
            total += args[i].flops / args[i].seconds;
        }
        if (total / 1e9 > best) best = total / 1e9;
    }
    return best;
}

/* 1 when this CPU can run the peak microkernel kind. */
static inline int peak_supported(int kind) {
#ifdef BENCH_X86
    if (kind == PEAK_FMA256) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (kind == PEAK_FMA512) return __builtin_cpu_supports("avx512f");
    if (kind == PEAK_DPBF16) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    if (kind == PEAK_AMX) return moeq_engine_cpu_amx();
#endif
    (void)kind;
    return 0;
}

#endif
