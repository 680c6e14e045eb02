/*
 * worker_group.h — the worker as one rank of an expert-parallel group
 * (docs/EP.md): forming the group at start (the Redis rendezvous, the
 * placement, the ep handle, the engine joined to it) and the small agreement
 * every tick ends with. The loop that uses them is worker.c's.
 */
#ifndef MOEQ_WORKER_GROUP_H
#define MOEQ_WORKER_GROUP_H

#include <stdint.h>

#include "moeq/engine.h"
#include "moeq/redis.h"
#include "worker_params.h"

typedef struct worker_group worker_group;

/*
 * Join the group p->ep_group as rank p->ep.rank of p->ep.ranks: a new
 * generation through Redis (ep_rendezvous_redis.h), the placement
 * (p->ep_placement or the identity), the ep handle (collective: returns once
 * every rank is up and agrees on shape and placement, within
 * ep.join_timeout_ms), then the engine joins it. redis and engine are
 * borrowed; the group must be destroyed after the engine's last step.
 */
moeq_err worker_group_new(const moeq_worker_params *p, moeq_redis *redis, moeq_engine *engine, worker_group **out,
                          char *errstr, size_t errstr_size);
void worker_group_destroy(worker_group *g); /* NULL is safe */

int worker_group_rank(const worker_group *g);
int worker_group_ranks(const worker_group *g);
int64_t worker_group_generation(const worker_group *g);

/* What a rank says at the end of every tick. */
enum {
    WORKER_GROUP_STOPPING = 1, /* this rank drains (SIGTERM): every rank drains with it */
    WORKER_GROUP_DONE = 2,     /* this rank has nothing left: the group ends when every rank is done */
    WORKER_GROUP_BUSY = 4,     /* this rank has work: nobody blocks waiting for new batches */
};

/*
 * The tick's agreement (collective): *any = the OR of every rank's flags,
 * *all = their AND; *from = the lowest rank that said STOPPING (-1 none).
 * TIMEOUT / IO naming a rank when one died or was silent for ep.timeout_ms.
 */
moeq_err worker_group_agree(worker_group *g, unsigned flags, unsigned *any, unsigned *all, int *from, char *errstr,
                            size_t errstr_size);

#endif
