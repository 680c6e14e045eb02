/*
 * instance.c — static member ids from per-host slot locks (see instance.h).
 */
#include "instance.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

struct moeq_instance {
    int fd;
    char id[160];
};

static void sanitize(char *s) {
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '.' ||
              *s == '_' || *s == '-'))
            *s = '_';
}

/* 1 when the lock was taken, 0 when another process holds it, -1 on an I/O error (errno set). */
static int try_slot(const char *path, int *fd_out) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        *fd_out = fd;
        return 1;
    }
    int busy = errno == EWOULDBLOCK;
    close(fd);
    return busy ? 0 : -1;
}

moeq_err moeq_instance_claim(const char *dir, const char *role, const char *group, const char *host,
                             moeq_instance **out, char *errstr, size_t n) {
    *out = NULL;
    char hostbuf[128] = {0}, groupbuf[128];
    if (!host) {
        if (gethostname(hostbuf, sizeof hostbuf - 1)) snprintf(hostbuf, sizeof hostbuf, "localhost");
        host = hostbuf;
    }
    snprintf(groupbuf, sizeof groupbuf, "%s", group);
    sanitize(groupbuf);
    for (int slot = 0; slot < MOEQ_INSTANCE_SLOTS; slot++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/moeq-%s.%s.%d.lock", dir, role, groupbuf, slot);
        int fd = -1, r = try_slot(path, &fd);
        if (r < 0)
            return moeq_errf(MOEQ_ERR_IO, errstr, n, "instance id: cannot lock %s: %s (set run_dir, or an explicit "
                             "group_instance_id)", path, strerror(errno));
        if (r == 0) continue;
        moeq_instance *inst = calloc(1, sizeof *inst);
        if (!inst) {
            close(fd);
            return moeq_errf(MOEQ_ERR_NOMEM, errstr, n, "instance id: out of memory");
        }
        inst->fd = fd;
        snprintf(inst->id, sizeof inst->id, "%.120s.%d", host, slot);
        sanitize(inst->id);
        *out = inst;
        return MOEQ_OK;
    }
    return moeq_errf(MOEQ_ERR_LIMIT, errstr, n, "instance id: all %d slots of %s/moeq-%s.%s.*.lock are held by live "
                     "processes", MOEQ_INSTANCE_SLOTS, dir, role, groupbuf);
}

const char *moeq_instance_id(const moeq_instance *inst) { return inst->id; }

void moeq_instance_destroy(moeq_instance *inst) {
    if (!inst) return;
    close(inst->fd);
    free(inst);
}
