/*
 * backend_pool.h — internal: the persistent worker pool the CPU backend runs
 * its heavy ops on. Threads are created once (engine creation) and reused for
 * every op of every step; a dispatch costs a wake-up, never a thread start.
 *
 * A dispatch is `n_tasks` calls of fn(ctx, task, worker); workers claim tasks
 * with an atomic counter, so which thread runs a task is unspecified. Callers
 * make each task's result independent of the thread that runs it (that is
 * what keeps the forward pass batch invariant).
 *
 * Not thread-safe: one dispatcher (the engine's thread) at a time.
 */
#ifndef MOEQ_ENGINE_BACKEND_POOL_H
#define MOEQ_ENGINE_BACKEND_POOL_H

#include <stdint.h>

typedef struct moeq_pool moeq_pool;

typedef void (*moeq_pool_fn)(void *ctx, int64_t task, int worker);

/* n_threads >= 1 counts the calling thread; 1 means no workers. NULL on failure. */
moeq_pool *moeq_pool_new(int n_threads);
void moeq_pool_destroy(moeq_pool *pool); /* NULL is safe */
int moeq_pool_n_threads(const moeq_pool *pool);

/* Run fn for tasks 0..n_tasks-1 on all threads (the caller included); returns when all are done. */
void moeq_pool_run(moeq_pool *pool, moeq_pool_fn fn, void *ctx, int64_t n_tasks);

/*
 * The same, but while more tasks are left than threads, a worker claims its next task before it runs the current
 * one, and moeq_pool_next_task names it, so a task can start fetching what the next one reads (the AMX kernels
 * fetch its first weights). Near the end it claims one at a time, so no thread holds a task another could run;
 * still, a dispatch of few tasks balances worse than with moeq_pool_run (F8 decode at batch 8, 2 threads: 0.95x),
 * so callers use this one only where the hint is used. Which thread runs a task never changes a result.
 */
void moeq_pool_run_ahead(moeq_pool *pool, moeq_pool_fn fn, void *ctx, int64_t n_tasks);

/* Inside fn: the task this worker runs after the current one (moeq_pool_run_ahead), or -1 (none claimed). */
int64_t moeq_pool_next_task(const moeq_pool *pool, int worker);

#endif
