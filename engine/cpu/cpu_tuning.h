/*
 * cpu_tuning.h — internal: the CPU kernels' per-CPU choices, each made once from CPUID and each changing no
 * bits (the tests run every choice on every host against the emulation). cpu_tuning.c says what was measured.
 *
 *   stream_l2   where the weight streams' prefetches go (the NT tiles of ops_matmul.c, the int8 draft kernels
 *               of ops_draft.c): into L2 (prefetcht1, 2 KiB ahead) or into L1 (prefetcht0, 1 KiB ahead).
 *   f8_widen32  how the few-token NT tiles widen F8 E4M3 weights: straight into float32 bits (three integer
 *               ops, the value q * 2^-120) or into float16 bits then vcvtph2ps (q / 256).
 *   k_blocked   whether BF16, F16 and F32 NT blocks of 5-32 tokens with K > 1,024 walk K in steps of
 *               1,024 with their accumulators parked (ops_matmul.c, nt_blocked512) or take the direct tiles
 *               over whole rows; blocks of more tokens walk K in steps on every CPU. F8 has its own rule.
 */
#ifndef MOEQ_ENGINE_CPU_TUNING_H
#define MOEQ_ENGINE_CPU_TUNING_H

/* 1: into L2; 0: into L1. Thread-safe. */
int moeq_cpu_stream_l2(void);
/* Override the choice for the whole process (tests and benchmarks compare the two). Thread-safe. */
void moeq_cpu_set_stream_l2(int on);

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
/* One weight-stream prefetch at the level moeq_cpu_stream_l2() gave: l2 is a constant in each kernel
 * instantiation, so the branch folds away and every kernel issues the same hint for the same choice. */
static inline __attribute__((always_inline)) void moeq_cpu_stream_prefetch(const void *p, const int l2) {
    if (l2) _mm_prefetch((const char *)p, _MM_HINT_T1);
    else _mm_prefetch((const char *)p, _MM_HINT_T0);
}
#endif

/* 1: F8 weights widened into float32 bits; 0: through float16. Thread-safe. */
int moeq_cpu_f8_widen32(void);
/* Override the choice for the whole process (tests and benchmarks compare the two). Thread-safe. */
void moeq_cpu_set_f8_widen32(int on);

/* 1: BF16 / F16 / F32 blocks of 5-32 tokens walk K in steps; 0: the direct tiles. Thread-safe. */
int moeq_cpu_k_blocked(void);
/* Override the choice for the whole process (tests and benchmarks compare the two). Thread-safe. */
void moeq_cpu_set_k_blocked(int on);

/* The three choices as bits (stream_l2 1, f8_widen32 2, k_blocked 4): descriptions cached per combination. */
int moeq_cpu_tuning_key(void);

#endif
