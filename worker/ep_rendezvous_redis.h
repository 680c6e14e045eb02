/*
 * ep_rendezvous_redis.h — the expert-parallel group's rendezvous through Redis
 * (moeq/ep.h's moeq_ep_rendezvous hook), beside the worker's other Redis code
 * so that ep/ never links hiredis.
 *
 * One hash per group, <prefix>:ep:<group> (moeq:ep:<group> by default):
 *   gen       the newest generation opened (HINCRBY by rank 0 at its start)
 *   formed    the newest generation every rank joined (moeq_ep_new passed)
 *   addr:<r>  "<gen>:" + rank r's transport address in that generation
 * Rank 0 opens generation G = gen + 1 and drops every address in one script;
 * every other rank waits for a generation that is open and not yet formed
 * (gen > formed), so a rank that restarts never joins the group that just
 * failed. Addresses of another generation are never returned, and a lookup
 * fails at once (IO) when rank 0 opened a newer generation meanwhile. The key
 * expires a day after its last write (nothing in it is used after formation).
 */
#ifndef MOEQ_WORKER_EP_RENDEZVOUS_REDIS_H
#define MOEQ_WORKER_EP_RENDEZVOUS_REDIS_H

#include <stdint.h>

#include "moeq/ep.h"
#include "moeq/redis.h"

typedef struct worker_ep_rv worker_ep_rv;

/* The key's TTL, refreshed at every write. */
#define WORKER_EP_RV_TTL_MS (24LL * 3600 * 1000)

/*
 * Join the group's next generation as `rank` of n_ranks: rank 0 opens it,
 * the others wait up to timeout_ms for rank 0 to have opened one (TIMEOUT
 * naming the group and rank 0). redis is borrowed for the rendezvous's life.
 */
moeq_err worker_ep_rv_new(moeq_redis *redis, const char *prefix, const char *group, int rank, int n_ranks,
                          int timeout_ms, worker_ep_rv **out, char *errstr, size_t errstr_size);
void worker_ep_rv_destroy(worker_ep_rv *rv); /* NULL is safe */

/* The hook moeq_ep_new takes (borrows rv). */
moeq_ep_rendezvous worker_ep_rv_hook(worker_ep_rv *rv);

/* This rank's generation. */
int64_t worker_ep_rv_generation(const worker_ep_rv *rv);

/* After moeq_ep_new passed (every rank is up): mark the generation formed, so restarted ranks wait for the next. */
moeq_err worker_ep_rv_formed(worker_ep_rv *rv, char *errstr, size_t errstr_size);

#endif
