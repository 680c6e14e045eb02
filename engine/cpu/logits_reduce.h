/*
 * logits_reduce.h — internal: the CPU backend's logits_reduce op (backend.h),
 * the reference the CUDA kernel is compared with: one row at a time, plain
 * loops in index order (argmax as the sampler's scalar loop, candidates by
 * bounded insertion, sums left to right). Not a fast path: the CPU backend
 * is host_visible, so the engine samples its rows directly and runs this
 * only for tests and for backends built on the CPU's ops.
 */
#ifndef MOEQ_ENGINE_CPU_LOGITS_REDUCE_H
#define MOEQ_ENGINE_CPU_LOGITS_REDUCE_H

#include <stdint.h>

#include "moeq/engine.h"

/* The record of row x (vocab values) with its c best candidates (1 <= c <= MOEQ_LOGITS_TOP), sum_t at
 * temperature (<= 0: none). */
void moeq_cpu_logits_reduce_row(const float *x, int64_t vocab, double temperature, int c, moeq_logits_record *out);

/* The op: rows r < n_rows at logits + r * ld, c = MOEQ_LOGITS_TOP. */
void moeq_cpu_logits_reduce(const float *logits, int64_t ld, int64_t n_rows, int64_t vocab,
                            const double *temperature, moeq_logits_record *out);

#endif
