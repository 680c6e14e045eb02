/*
 * stream_prefetch.c — where the CPU kernels' weight-stream prefetches go (stream_prefetch.h).
 */
#include "stream_prefetch.h"

#include <stdatomic.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define STREAM_X86 1
#include <cpuid.h>
#endif

/*
 * Where the weight streams' prefetches go. Into L2 (prefetcht1, 2 KiB ahead of each stream) on AMD family 19h
 * (measured on Zen 4; Zen 3 shares the family), into L1 (prefetcht0, 1 KiB ahead) elsewhere. Session 26, Zen 4 VM (EPYC, one core, BF16
 * from memory, the kernels built both ways in one process and alternated 10-12 times): 2-3 tokens streamed
 * 13-15 -> 20-23 GB/s (the 1-token rate: 1.35-1.58x), 4 tokens 1.29-1.39x, 6 tokens 1.2-1.25x, 1 token 1.02-1.16x,
 * 8-16 tokens 1.03-1.06x; the hint, not the distance, made it (prefetcht0 2 KiB ahead: 0.99-1.01x; prefetcht1
 * 4 or 8 KiB ahead: no better than 2). A prefetch into L1 holds one of its few miss buffers until the line
 * arrives, so the streams stalled behind them once a chunk carried a second token's fmas; L2 tracks many
 * more misses, and the tiles' loads then hit L2. F8's few-token products are bound by the widening and did
 * not move. Zen 5 (family 1Ah; sessions 18-25 tuned prefetcht0 distances there) and Intel keep prefetcht0
 * until measured: the choice changes no bits.
 */
static _Atomic int stream_l2 = -1;

int moeq_cpu_stream_l2(void) {
    int v = atomic_load_explicit(&stream_l2, memory_order_relaxed);
    if (v < 0) {
        v = 0;
#ifdef STREAM_X86
        unsigned a, b, c, d;
        if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u && /* AMD */
            __get_cpuid(1, &a, &b, &c, &d)) {
            unsigned family = ((a >> 8) & 0xf) + (((a >> 8) & 0xf) == 0xf ? (a >> 20) & 0xff : 0);
            v = family == 0x19;
        }
#endif
        atomic_store_explicit(&stream_l2, v, memory_order_relaxed);
    }
    return v;
}

void moeq_cpu_set_stream_l2(int on) { atomic_store_explicit(&stream_l2, on ? 1 : 0, memory_order_relaxed); }
