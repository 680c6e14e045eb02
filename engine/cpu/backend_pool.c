/*
 * backend_pool.c — persistent worker threads with spin-then-sleep wake-up.
 *
 * Workers spin briefly on a generation counter (a decode step issues dozens of
 * short dispatches; a condition-variable wake-up per dispatch would dominate),
 * then sleep on a condition variable so an idle engine burns no CPU. Tasks are
 * claimed from one atomic counter. It deliberately has no priorities, no
 * nested dispatch and no work stealing between dispatches.
 */
#include "backend_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ITERS 2000

typedef struct worker_arg {
    moeq_pool *pool;
    int index;
} worker_arg;

typedef struct claimed_slot {
    _Alignas(64) int64_t task; /* the worker's next task (moeq_pool_next_task); a line each, written per task */
} claimed_slot;

struct moeq_pool {
    int n_threads;
    pthread_t *threads;
    worker_arg *args;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t generation; /* bumped per dispatch                  */
    _Atomic int64_t next_task;   /* next unclaimed task                  */
    _Atomic int n_done;          /* workers finished with this dispatch   */
    _Atomic int stop;
    moeq_pool_fn fn;
    void *ctx;
    int64_t n_tasks;
    int ahead;             /* this dispatch claims one task ahead (moeq_pool_run_ahead) */
    claimed_slot *claimed; /* per worker */
};

static int64_t claim(moeq_pool *pool) {
    int64_t t = atomic_fetch_add_explicit(&pool->next_task, 1, memory_order_relaxed);
    return t < pool->n_tasks ? t : -1;
}

static void run_tasks(moeq_pool *pool, int worker) {
    const int64_t n = pool->n_tasks;
    for (int64_t t = claim(pool); t >= 0;) {
        int64_t left = n - atomic_load_explicit(&pool->next_task, memory_order_relaxed);
        int64_t next = pool->ahead && left > pool->n_threads ? claim(pool) : -1;
        pool->claimed[worker].task = next;
        pool->fn(pool->ctx, t, worker);
        t = next >= 0 ? next : claim(pool);
    }
    pool->claimed[worker].task = -1;
}

static uint64_t wait_generation(moeq_pool *pool, uint64_t seen) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        uint64_t g = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (g != seen || atomic_load(&pool->stop)) return g;
        cpu_relax();
    }
    pthread_mutex_lock(&pool->mu);
    uint64_t g;
    while ((g = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stop))
        pthread_cond_wait(&pool->cv, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
    return g;
}

static void *worker_main(void *p) {
    worker_arg *arg = p;
    moeq_pool *pool = arg->pool;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_generation(pool, seen);
        if (atomic_load(&pool->stop)) break;
        run_tasks(pool, arg->index);
        atomic_fetch_add_explicit(&pool->n_done, 1, memory_order_release);
    }
    return NULL;
}

moeq_pool *moeq_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    moeq_pool *pool = calloc(1, sizeof(*pool));
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    pool->args = calloc((size_t)n_threads, sizeof(worker_arg));
    pool->claimed = aligned_alloc(64, (size_t)n_threads * sizeof(claimed_slot));
    if (!pool->threads || !pool->args || !pool->claimed) {
        pool->n_threads = 1; /* no thread started: none to join */
        goto fail;
    }
    for (int i = 0; i < n_threads; i++) pool->claimed[i].task = -1;
    for (int i = 1; i < n_threads; i++) {
        pool->args[i] = (worker_arg){pool, i};
        if (pthread_create(&pool->threads[i], NULL, worker_main, &pool->args[i]) != 0) {
            pool->n_threads = i; /* join only those started */
            goto fail;
        }
    }
    return pool;
fail:
    moeq_pool_destroy(pool);
    return NULL;
}

void moeq_pool_destroy(moeq_pool *pool) {
    if (!pool) return;
    atomic_store(&pool->stop, 1);
    pthread_mutex_lock(&pool->mu);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n_threads && pool->threads; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->threads);
    free(pool->args);
    free(pool->claimed);
    free(pool);
}

int moeq_pool_n_threads(const moeq_pool *pool) { return pool ? pool->n_threads : 1; }

int64_t moeq_pool_next_task(const moeq_pool *pool, int worker) {
    return pool && pool->claimed && worker >= 0 && worker < pool->n_threads ? pool->claimed[worker].task : -1;
}

static void run(moeq_pool *pool, moeq_pool_fn fn, void *ctx, int64_t n_tasks, int ahead) {
    if (n_tasks <= 0) return;
    if (!pool || pool->n_threads == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) {
            if (pool) pool->claimed[0].task = ahead && t + 1 < n_tasks ? t + 1 : -1;
            fn(ctx, t, 0);
        }
        if (pool) pool->claimed[0].task = -1;
        return;
    }
    pool->ahead = ahead;
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_tasks = n_tasks;
    atomic_store_explicit(&pool->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->n_done, 0, memory_order_relaxed);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    run_tasks(pool, 0);
    int spins = 0;
    while (atomic_load_explicit(&pool->n_done, memory_order_acquire) < pool->n_threads - 1) {
        if (++spins < SPIN_ITERS) cpu_relax();
        else sched_yield();
    }
}

void moeq_pool_run(moeq_pool *pool, moeq_pool_fn fn, void *ctx, int64_t n_tasks) { run(pool, fn, ctx, n_tasks, 0); }

void moeq_pool_run_ahead(moeq_pool *pool, moeq_pool_fn fn, void *ctx, int64_t n_tasks) {
    run(pool, fn, ctx, n_tasks, 1);
}
