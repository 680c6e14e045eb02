/*
 * affinity.h — which worker should run a batch with a given prefix key
 * (docs/PREFIX_CACHE.md, "Affinity"). Pure decisions, no I/O, no clock of
 * its own (every call takes now_ms).
 *
 * Each worker remembers the prefix keys of the batches it started lately
 * (its prefix cache holds their blocks, unless evicted since) and advertises
 * them in its heartbeat; it reads the other workers' heartbeats. A batch
 * taken fresh from the stream whose key this worker does not hold, but a
 * live peer advertises and has room for (its heartbeat's "room": jobs it
 * would take now, less what was handed to it since), is handed to that peer (the caller XCLAIMs it to the
 * peer's consumer name: its visibility clock restarts; the peer picks it up
 * from its own pending list). Never a reclaimed or handed batch, so a batch
 * moves at most once, and a peer that died with it leaves it to the
 * ordinary reclaim: another worker takes it within the visibility timeout.
 *
 * Not thread-safe: one per worker loop.
 */
#ifndef MOEQ_WORKER_AFFINITY_H
#define MOEQ_WORKER_AFFINITY_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"

typedef struct moeq_affinity moeq_affinity;

/* max_keys: own keys remembered and advertised (most recent first); max_peers: peers read per refresh. */
moeq_err moeq_affinity_new(int max_keys, int max_peers, moeq_affinity **out);
void moeq_affinity_destroy(moeq_affinity *affinity); /* NULL is safe */

/* A batch with this key (0: none, ignored) and these leading tokens (the ones the key covers, at most
 * MOEQ_AFFINITY_PREFIX_TOKENS kept) started here at now_ms. */
#define MOEQ_AFFINITY_PREFIX_TOKENS 256
void moeq_affinity_note(moeq_affinity *affinity, uint64_t key, const int32_t *prefix, int n_prefix, int64_t now_ms);
int moeq_affinity_holds(const moeq_affinity *affinity, uint64_t key);

/* Whether the worker's cache still holds (most of) these leading tokens: the engine's prefix lookup. */
typedef int (*moeq_affinity_cached_fn)(void *ctx, const int32_t *prefix, int n_prefix);

/*
 * The own keys as a JSON array of 16-hex-digit strings ("[]" when none) into
 * buf; returns its length. With cached (may be NULL: all kept), keys whose
 * prefix the cache no longer holds are forgotten first: a worker advertises
 * what its cache has, not what it once ran.
 */
size_t moeq_affinity_hint_json(moeq_affinity *affinity, moeq_affinity_cached_fn cached, void *ctx, char *buf,
                               size_t size);

/* Forget the peers read before (a new refresh follows). */
void moeq_affinity_peers_clear(moeq_affinity *affinity);
/* One peer heartbeat (JSON with "id", "room" (else "free_slots" - "pending") and optional "prefix_keys");
 * own_id's own is skipped. Returns 1 if kept. */
int moeq_affinity_peer_json(moeq_affinity *affinity, const char *own_id, const char *json, size_t len);

/*
 * The peer to hand a batch of n_jobs to, or NULL to run it here: NULL when
 * key is 0, the batch was reclaimed or handed here (handed_or_reclaimed),
 * this worker's cache holds the batch's prefix (held_here: the caller asked
 * its engine), or no peer read at the last refresh advertises it with room
 * for n_jobs (a busy holder would leave the batch waiting while this worker
 * idles).
 */
const char *moeq_affinity_route(const moeq_affinity *affinity, uint64_t key, int n_jobs, int handed_or_reclaimed,
                                int held_here);
/* The batch went to peer (its room shrinks by n_jobs until the next refresh). */
void moeq_affinity_handed(moeq_affinity *affinity, const char *peer, int n_jobs);

#endif
