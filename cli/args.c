/* args.c — see args.h. */
#include "args.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

int moeq_cli_int_arg(const char *flag, const char *v, int *out) {
    char *end = NULL;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < INT_MIN || n > INT_MAX) {
        fprintf(stderr, "moeq: %s: '%s' is not an integer\n", flag, v);
        return -1;
    }
    *out = (int)n;
    return 0;
}

int moeq_cli_double_arg(const char *flag, const char *v, double *out) {
    char *end = NULL;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || d != d) {
        fprintf(stderr, "moeq: %s: '%s' is not a number\n", flag, v);
        return -1;
    }
    *out = d;
    return 0;
}

int moeq_cli_u64_arg(const char *flag, const char *v, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 0);
    if (errno || end == v || *end || v[0] == '-') {
        fprintf(stderr, "moeq: %s: '%s' is not an unsigned integer\n", flag, v);
        return -1;
    }
    *out = n;
    return 0;
}
