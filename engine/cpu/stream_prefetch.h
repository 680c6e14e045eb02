/*
 * stream_prefetch.h — internal: where the CPU kernels prefetch the weight rows they stream (the NT tiles of
 * ops_matmul.c, the int8 draft kernels of ops_draft.c): into L2 (prefetcht1, 2 KiB ahead) or into L1
 * (prefetcht0, 1 KiB ahead). Chosen once by the CPU (AMD Zen 3/4: L2; stream_prefetch.c says why). A prefetch
 * changes no bits, only how many weight lines are in flight while the fmas run.
 */
#ifndef MOEQ_ENGINE_STREAM_PREFETCH_H
#define MOEQ_ENGINE_STREAM_PREFETCH_H

/* 1: into L2; 0: into L1. Thread-safe. */
int moeq_cpu_stream_l2(void);
/* Override the choice for the whole process (tests and benchmarks compare the two). Thread-safe. */
void moeq_cpu_set_stream_l2(int on);

#endif
