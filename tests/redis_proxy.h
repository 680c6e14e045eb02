/*
 * redis_proxy.h — a TCP proxy in front of Redis that can drop a worker's
 * connection at one exact moment: when the bytes it sends carry an `XACK`
 * (the acknowledgement pipeline: record updates + XACK, written at once), the
 * proxy forwards none of them, closes every connection and refuses new ones
 * for down_ms, as a Redis that went away between the last result's delivery
 * and the acknowledgement would. Everything else is forwarded as is.
 *
 * One thread, poll(); blocking writes (the traffic is small). Header-only,
 * tests only.
 */
#ifndef MOEQ_TESTS_REDIS_PROXY_H
#define MOEQ_TESTS_REDIS_PROXY_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define REDIS_PROXY_MAX_CONNS 32

typedef struct redis_proxy {
    int listen_fd, port, up_port;
    int down_ms;                  /* how long Redis stays "down" after a cut       */
    atomic_int cuts_left;         /* acknowledgement writes still to cut            */
    atomic_int cuts_done;
    atomic_int stop;
    int64_t down_until_ms;
    int client[REDIS_PROXY_MAX_CONNS], upstream[REDIS_PROXY_MAX_CONNS];
    pthread_t thread;
} redis_proxy;

static inline int64_t redis_proxy_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int redis_proxy_has_xack(const char *b, size_t n) {
    for (size_t i = 0; i + 4 <= n; i++)
        if (!memcmp(b + i, "XACK", 4)) return 1;
    return 0;
}

static inline int redis_proxy_write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

static inline void redis_proxy_close(redis_proxy *p, int i) {
    if (p->client[i] >= 0) close(p->client[i]);
    if (p->upstream[i] >= 0) close(p->upstream[i]);
    p->client[i] = p->upstream[i] = -1;
}

static inline void redis_proxy_accept(redis_proxy *p) {
    int c = accept(p->listen_fd, NULL, NULL);
    if (c < 0) return;
    if (redis_proxy_now_ms() < p->down_until_ms) { /* Redis is "down" */
        close(c);
        return;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->up_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int u = socket(AF_INET, SOCK_STREAM, 0);
    if (u < 0 || connect(u, (struct sockaddr *)&a, sizeof a) != 0) {
        if (u >= 0) close(u);
        close(c);
        return;
    }
    for (int i = 0; i < REDIS_PROXY_MAX_CONNS; i++)
        if (p->client[i] < 0) {
            p->client[i] = c, p->upstream[i] = u;
            return;
        }
    close(c), close(u);
}

/* Bytes from connection i's client: forward them, or cut everything when they carry an armed XACK. */
static inline void redis_proxy_from_client(redis_proxy *p, int i) {
    char buf[65536];
    ssize_t n = recv(p->client[i], buf, sizeof buf, 0);
    if (n <= 0) {
        redis_proxy_close(p, i);
        return;
    }
    if (atomic_load(&p->cuts_left) > 0 && redis_proxy_has_xack(buf, (size_t)n)) {
        atomic_fetch_sub(&p->cuts_left, 1);
        atomic_fetch_add(&p->cuts_done, 1);
        p->down_until_ms = redis_proxy_now_ms() + p->down_ms;
        for (int k = 0; k < REDIS_PROXY_MAX_CONNS; k++) redis_proxy_close(p, k);
        return;
    }
    if (redis_proxy_write_all(p->upstream[i], buf, (size_t)n)) redis_proxy_close(p, i);
}

static inline void redis_proxy_from_upstream(redis_proxy *p, int i) {
    char buf[65536];
    ssize_t n = recv(p->upstream[i], buf, sizeof buf, 0);
    if (n <= 0 || redis_proxy_write_all(p->client[i], buf, (size_t)n)) redis_proxy_close(p, i);
}

static inline void *redis_proxy_main(void *opaque) {
    redis_proxy *p = opaque;
    while (!atomic_load(&p->stop)) {
        struct pollfd fds[1 + 2 * REDIS_PROXY_MAX_CONNS];
        int who[1 + 2 * REDIS_PROXY_MAX_CONNS], n = 0;
        fds[n] = (struct pollfd){p->listen_fd, POLLIN, 0}, who[n++] = -1;
        for (int i = 0; i < REDIS_PROXY_MAX_CONNS; i++) {
            if (p->client[i] < 0) continue;
            fds[n] = (struct pollfd){p->client[i], POLLIN, 0}, who[n++] = 2 * i;
            fds[n] = (struct pollfd){p->upstream[i], POLLIN, 0}, who[n++] = 2 * i + 1;
        }
        if (poll(fds, (nfds_t)n, 50) <= 0) continue;
        for (int k = 0; k < n; k++) {
            if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (who[k] < 0) redis_proxy_accept(p);
            else if (p->client[who[k] / 2] >= 0 && fds[k].fd == (who[k] % 2 ? p->upstream : p->client)[who[k] / 2])
                (who[k] % 2 ? redis_proxy_from_upstream : redis_proxy_from_client)(p, who[k] / 2);
        }
    }
    return NULL;
}

/* Listen on a free loopback port in front of Redis at 127.0.0.1:up_port; 0 on success. */
static inline int redis_proxy_start(redis_proxy *p, int up_port, int down_ms) {
    memset(p, 0, sizeof *p);
    for (int i = 0; i < REDIS_PROXY_MAX_CONNS; i++) p->client[i] = p->upstream[i] = -1;
    p->up_port = up_port;
    p->down_ms = down_ms;
    p->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (p->listen_fd < 0 || bind(p->listen_fd, (struct sockaddr *)&a, sizeof a) || listen(p->listen_fd, 16) ||
        getsockname(p->listen_fd, (struct sockaddr *)&a, &len))
        return -1;
    p->port = ntohs(a.sin_port);
    return pthread_create(&p->thread, NULL, redis_proxy_main, p) ? -1 : 0;
}

static inline void redis_proxy_stop(redis_proxy *p) {
    atomic_store(&p->stop, 1);
    pthread_join(p->thread, NULL);
    for (int i = 0; i < REDIS_PROXY_MAX_CONNS; i++) redis_proxy_close(p, i);
    close(p->listen_fd);
}

#endif
