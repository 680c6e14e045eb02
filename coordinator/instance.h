/*
 * instance.h — a static consumer-group member id that is stable across
 * restarts of one process and unique among processes on one host.
 *
 * Why: with dynamic membership a coordinator killed with kill -9 keeps its
 * partitions until the broker's session timeout expires (45 s by default),
 * and the restarted process waits that long for them. A static member
 * (`group.instance.id`, KIP-345) that rejoins under the same id gets its
 * assignment back at once, without a rebalance. The id must be the same
 * after a restart and different for two coordinators on one host (the
 * broker fences the older of two members with one id), so it is
 * `<hostname>.<slot>`, where slot is the lowest n whose lock file
 * `<dir>/moeq-<role>.<group>.<n>.lock` this process can flock: a dead
 * process's lock is released by the kernel, so its restart takes the same
 * slot; a second live process takes the next one.
 *
 * Does not talk to Kafka; only the lock files.
 */
#ifndef MOEQ_COORDINATOR_INSTANCE_H
#define MOEQ_COORDINATOR_INSTANCE_H

#include <stddef.h>

#include "moeq/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOEQ_INSTANCE_SLOTS 64

typedef struct moeq_instance moeq_instance;

/*
 * Claims the lowest free slot for (role, group) under dir and builds the id
 * from host (NULL = gethostname) and the slot. Characters Kafka does not
 * allow in a member id ([A-Za-z0-9._-]) become '_'. The lock is held until
 * moeq_instance_destroy or the process ends. MOEQ_ERR_IO when dir cannot be
 * written, MOEQ_ERR_LIMIT when every slot is taken.
 */
moeq_err moeq_instance_claim(const char *dir, const char *role, const char *group, const char *host,
                             moeq_instance **out, char *errstr, size_t errstr_size);

/* The claimed id, e.g. "worker-7.0"; valid until destroy. */
const char *moeq_instance_id(const moeq_instance *inst);

/* Releases the slot. NULL is safe. */
void moeq_instance_destroy(moeq_instance *inst);

#ifdef __cplusplus
}
#endif

#endif
