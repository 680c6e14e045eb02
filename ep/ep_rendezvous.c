/*
 * ep_rendezvous.c — the directory rendezvous: rank r writes dir/rank-<r>.addr
 * (to a temporary name, then rename, so a reader never sees half a file) and
 * readers poll for it. For tests and single-host groups; a worker group's
 * Redis rendezvous implements the same two functions.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moeq/ep.h"
#include "moeq/util.h"

static void addr_path(char *out, size_t size, const char *dir, int rank, const char *suffix) {
    snprintf(out, size, "%s/rank-%d.addr%s", dir, rank, suffix);
}

static moeq_err dir_publish(void *ctx, int rank, const void *addr, size_t len, char *errstr, size_t n) {
    char tmp[4096], path[4096];
    addr_path(tmp, sizeof tmp, ctx, rank, ".tmp");
    addr_path(path, sizeof path, ctx, rank, "");
    FILE *f = fopen(tmp, "wb");
    if (!f) return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep rendezvous: cannot write %s", tmp);
    int ok = fwrite(addr, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) return moeq_errf(MOEQ_ERR_IO, errstr, n, "ep rendezvous: cannot write %s", path);
    return MOEQ_OK;
}

static moeq_err dir_lookup(void *ctx, int rank, int timeout_ms, void **addr, size_t *len, char *errstr, size_t n) {
    char path[4096];
    addr_path(path, sizeof path, ctx, rank, "");
    int64_t deadline = moeq_now_ms() + timeout_ms;
    for (;;) {
        if (access(path, R_OK) == 0) {
            char *buf = NULL;
            moeq_err err = moeq_read_file(path, 1 << 20, &buf, len, errstr, n);
            *addr = buf;
            return err;
        }
        if (moeq_now_ms() >= deadline)
            return moeq_errf(MOEQ_ERR_TIMEOUT, errstr, n, "ep rendezvous: rank %d did not publish %s within %d ms",
                             rank, path, timeout_ms);
        nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
    }
}

moeq_ep_rendezvous moeq_ep_rendezvous_dir(const char *dir) {
    return (moeq_ep_rendezvous){(void *)dir, dir_publish, dir_lookup};
}
