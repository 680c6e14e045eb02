/*
 * http_client.h — tests: a loopback port that is free, and a plain HTTP/1.0
 * GET against 127.0.0.1 (the processes' /metrics and health routes).
 */
#ifndef MOEQ_TEST_HTTP_CLIENT_H
#define MOEQ_TEST_HTTP_CLIENT_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

/* A loopback port that was free a moment ago. */
static inline int h_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* GET path from 127.0.0.1:port into out (NUL-terminated, headers included); bytes read or -1. */
static inline int h_http_get(int port, const char *path, char *out, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t got = 0;
    ssize_t r;
    while (got + 1 < cap && (r = read(fd, out + got, cap - 1 - got)) > 0) got += (size_t)r;
    out[got] = 0;
    close(fd);
    return (int)got;
}

/* GET path into page (headers included); its status code, or -1 when nothing answers. */
static inline int h_http_page(int port, const char *path, char *page, size_t size) {
    int code = -1;
    if (h_http_get(port, path, page, size) <= 0 || sscanf(page, "HTTP/%*s %d", &code) != 1) return -1;
    return code;
}

/* The status code of GET path, or -1 when nothing answers. */
static inline int h_http_status(int port, const char *path) {
    char page[4096];
    return h_http_page(port, path, page, sizeof page);
}

#endif
