/*
 * cpu_tuning.c — the CPU kernels' per-CPU choices (cpu_tuning.h).
 */
#include "cpu_tuning.h"

#include <stdatomic.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define TUNING_X86 1
#include <cpuid.h>
#endif

/* The AMD family (CPUID 1 with the extended family added), or 0 on any other vendor. */
static unsigned amd_family(void) {
#ifdef TUNING_X86
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u && /* AMD */
        __get_cpuid(1, &a, &b, &c, &d))
        return ((a >> 8) & 0xf) + (((a >> 8) & 0xf) == 0xf ? (a >> 20) & 0xff : 0);
#endif
    return 0;
}

/* AMD family 19h (Zen 3/4): the one CPU family the choices below were measured on. */
static int amd_family_19h(void) { return amd_family() == 0x19; }

/* A choice's value: the override if one was set, else `rule`'s answer, asked once. */
static int decided(_Atomic int *choice, int (*rule)(void)) {
    int v = atomic_load_explicit(choice, memory_order_relaxed);
    if (v < 0) {
        v = rule();
        atomic_store_explicit(choice, v, memory_order_relaxed);
    }
    return v;
}

/*
 * Where the weight streams' prefetches go. Into L2 (prefetcht1, 2 KiB ahead of each stream) on AMD family 19h
 * (measured on Zen 4; Zen 3 shares the family), into L1 (prefetcht0, 1 KiB ahead) elsewhere. Session 26, Zen 4
 * VM (EPYC, one core, BF16 from memory, the kernels built both ways in one process and alternated 10-12 times):
 * 2-3 tokens streamed 13-15 -> 20-23 GB/s (the 1-token rate: 1.35-1.58x), 4 tokens 1.29-1.39x, 6 tokens
 * 1.2-1.25x, 1 token 1.02-1.16x, 8-16 tokens 1.03-1.06x; the hint, not the distance, made it (prefetcht0 2 KiB
 * ahead: 0.99-1.01x; prefetcht1 4 or 8 KiB ahead: no better than 2). A prefetch into L1 holds one of its few
 * miss buffers until the line arrives, so the streams stalled behind them once a chunk carried a second
 * token's fmas; L2 tracks many more misses, and the tiles' loads then hit L2. Zen 5 (family 1Ah; sessions
 * 18-25 tuned prefetcht0 distances there) and Intel keep prefetcht0 until measured.
 */
static _Atomic int stream_l2 = -1;

int moeq_cpu_stream_l2(void) { return decided(&stream_l2, amd_family_19h); }

void moeq_cpu_set_stream_l2(int on) { atomic_store_explicit(&stream_l2, on ? 1 : 0, memory_order_relaxed); }

/*
 * F8 weights into float32 bits on AMD family 19h. Session 27, Zen 4 VM, one core: 2,048 x 7,168 F8 from memory,
 * the kernels built both ways in one process and alternated 8 times, activations already scaled once per block:
 * 1.25x at 1 token over the float16 route, 1.11-1.17x at 2-4, 1.02-1.14x at 5-7; whole engine steps
 * (bench-engine --against-f8-widen f16, 5 rounds) 1.06-1.09x at batches 1-128, prefill even. The float32 form
 * makes e4m3 subnormals float32 denormals; Zen 4 multiplies those at full speed (the same ratios with and
 * without an eighth of the weights subnormal). Intel cores have taken microcode assists on denormal operands,
 * and Zen 5 is unmeasured: both keep the float16 route, which vcvtph2ps normalises.
 */
static _Atomic int f8_widen32 = -1;

int moeq_cpu_f8_widen32(void) { return decided(&f8_widen32, amd_family_19h); }

void moeq_cpu_set_f8_widen32(int on) { atomic_store_explicit(&f8_widen32, on ? 1 : 0, memory_order_relaxed); }

/*
 * Blocks of 5-32 tokens K-blocked everywhere but AMD family 19h; more tokens are K-blocked on every CPU. The
 * K-blocked path was built on Zen 5 (session 5): there the direct tiles, which re-read 4 tokens' activations for
 * every 6 rows, ran a 7,168-column product of 128 tokens at 133 GFLOP/s against 191 blocked, one core, once
 * those activations outgrew L2 (Zen 5 does two 512-bit FMAs a cycle, so the re-reads from L3 bound it). Zen 4
 * does one, and there the direct tiles, whose rows stream with the L2 prefetch, win at decode's sizes. Session
 * 28, Zen 4 VM, one core: bench-matmul --cold --against-k-blocked 5, direct over blocked, BF16 2,048 x 7,168
 * 1.56x at 5 tokens, 1.20 at 8, 1.05 at 16, 1.10 at 32 (7,168 x 2,048: 1.59, 1.27, 1.14, 1.12; F16 alike, F32
 * 1.0-1.2); whole steps on bench-wide (DeepSeek-V3's widths; bench-engine --against-k-blocked on, 3 rounds):
 * batch 8 1.18x, batch 32 1.06x. At 64 tokens the product alone still favoured the direct tiles (1.04-1.07),
 * but 512-token prefill on bench-wide ran 0.95 of the K-blocked rate with 64-token blocks direct, so those
 * stay K-blocked. Zen 5 at 5-32 tokens and Intel without AMX are unmeasured.
 */
static int not_amd_family_19h(void) { return !amd_family_19h(); }

static _Atomic int k_blocked = -1;

int moeq_cpu_k_blocked(void) { return decided(&k_blocked, not_amd_family_19h); }

void moeq_cpu_set_k_blocked(int on) { atomic_store_explicit(&k_blocked, on ? 1 : 0, memory_order_relaxed); }

int moeq_cpu_tuning_key(void) {
    return (moeq_cpu_stream_l2() ? 1 : 0) | (moeq_cpu_f8_widen32() ? 2 : 0) | (moeq_cpu_k_blocked() ? 4 : 0);
}
