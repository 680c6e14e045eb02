/*
 * worker_group.c — forming a worker's expert-parallel group and the per-tick
 * agreement (worker_group.h). Policy about what a rank does with the
 * agreement (drain, block, end) is worker.c's.
 */
#include "worker_group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_rendezvous_redis.h"
#include "moeq/ep_placement.h"
#include "moeq/log.h"
#include "moeq/util.h"

#define COMP "worker"

struct worker_group {
    worker_ep_rv *rv;
    moeq_ep_placement *pl;
    moeq_ep *ep;
    moeq_ep_params params;
    int64_t *values; /* (n_ranks) one agreement's flags */
};

static moeq_err load_placement(const moeq_worker_params *p, const moeq_ep_params *ep, moeq_ep_placement **pl,
                               char *errstr, size_t errstr_size) {
    if (!p->ep_placement[0]) return moeq_ep_placement_new_identity(ep->n_experts, ep->n_ranks, pl, errstr, errstr_size);
    moeq_err err = moeq_ep_placement_load(p->ep_placement, pl, errstr, errstr_size);
    if (err) return err;
    if (moeq_ep_placement_n_experts(*pl) != ep->n_experts || moeq_ep_placement_n_ranks(*pl) != ep->n_ranks)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "ep.placement %s: %d experts over %d ranks; the model has %d experts, ep.ranks is %d",
                         p->ep_placement, moeq_ep_placement_n_experts(*pl), moeq_ep_placement_n_ranks(*pl),
                         ep->n_experts, ep->n_ranks);
    return MOEQ_OK;
}

static moeq_err form(worker_group *g, const moeq_worker_params *p, moeq_redis *redis, moeq_engine *engine,
                     char *errstr, size_t errstr_size) {
    moeq_err err = moeq_engine_ep_params(engine, &p->ep, &g->params, errstr, errstr_size);
    if (err) return err;
    if ((err = load_placement(p, &g->params, &g->pl, errstr, errstr_size))) return err;
    int64_t t0 = moeq_now_ms();
    if ((err = worker_ep_rv_new(redis, p->redis_prefix, p->ep_group, p->ep.rank, p->ep.n_ranks,
                                (int)p->ep_join_timeout_ms, &g->rv, errstr, errstr_size)))
        return err;
    moeq_ep_rendezvous hook = worker_ep_rv_hook(g->rv);
    if ((err = moeq_ep_new(&g->params, g->pl, &hook, &g->ep, errstr, errstr_size))) return err;
    if ((err = worker_ep_rv_formed(g->rv, errstr, errstr_size))) return err;
    if ((err = moeq_engine_join_group(engine, g->ep, &g->params, errstr, errstr_size))) return err;
    int64_t held = 0, total = 0;
    size_t held_bytes = 0;
    moeq_engine_expert_residency(engine, &held, &total, &held_bytes);
    moeq_log(MOEQ_LOG_INFO, COMP, "ep_group_formed",
             "group=%s generation=%lld rank=%d ranks=%d transport=%s payload=%s local_experts=%d placement=%s "
             "experts_held=%lld/%lld expert_bytes=%zu ms=%lld",
             p->ep_group, (long long)worker_ep_rv_generation(g->rv), g->params.rank, g->params.n_ranks,
             moeq_ep_transport_name(g->ep), g->params.payload, moeq_ep_placement_n_local(g->pl, g->params.rank),
             p->ep_placement[0] ? p->ep_placement : "identity", (long long)held, (long long)total, held_bytes,
             (long long)(moeq_now_ms() - t0));
    return MOEQ_OK;
}

moeq_err worker_group_new(const moeq_worker_params *p, moeq_redis *redis, moeq_engine *engine, worker_group **out,
                          char *errstr, size_t errstr_size) {
    *out = NULL;
    worker_group *g = calloc(1, sizeof *g);
    if (!g || !(g->values = calloc((size_t)p->ep.n_ranks, sizeof *g->values))) {
        free(g);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "ep group");
    }
    char why[512] = "";
    moeq_err err = form(g, p, redis, engine, why, sizeof why);
    if (err) {
        worker_group_destroy(g);
        return moeq_errf(err, errstr, errstr_size, "ep group %s, rank %d of %d: %s", p->ep_group, p->ep.rank,
                         p->ep.n_ranks, why);
    }
    *out = g;
    return MOEQ_OK;
}

void worker_group_destroy(worker_group *g) {
    if (!g) return;
    moeq_ep_destroy(g->ep);
    moeq_ep_placement_destroy(g->pl);
    worker_ep_rv_destroy(g->rv);
    free(g->values);
    free(g);
}

int worker_group_rank(const worker_group *g) { return g->params.rank; }
int worker_group_ranks(const worker_group *g) { return g->params.n_ranks; }
int64_t worker_group_generation(const worker_group *g) { return worker_ep_rv_generation(g->rv); }

moeq_err worker_group_agree(worker_group *g, unsigned flags, unsigned *any, unsigned *all, int *from, char *errstr,
                            size_t errstr_size) {
    moeq_err err = moeq_ep_allgather(g->ep, (int64_t)flags, g->values, errstr, errstr_size);
    if (err) return err;
    unsigned a = 0, b = ~0u;
    *from = -1;
    for (int r = 0; r < g->params.n_ranks; r++) {
        unsigned f = (unsigned)g->values[r];
        a |= f, b &= f;
        if ((f & WORKER_GROUP_STOPPING) && *from < 0) *from = r;
    }
    *any = a, *all = b;
    return MOEQ_OK;
}
