/*
 * services_env.h — how an integration test finds its Kafka broker and Redis.
 *
 * The ctest fixture `services` (tests/services.cmake) runs
 * scripts/test-services.sh, which starts private instances on free ports and
 * writes `KEY=value` lines to a file; moeq_add_test passes its path as
 * MOEQ_TEST_ENV_FILE. MOEQ_TEST_KAFKA / MOEQ_TEST_REDIS in the environment
 * win over the file, so a test binary can also be run by hand against any
 * stack (e.g. scripts/services.sh up: MOEQ_TEST_KAFKA=127.0.0.1:9092).
 *
 * Header-only, for tests only.
 */
#ifndef MOEQ_TESTS_SERVICES_ENV_H
#define MOEQ_TESTS_SERVICES_ENV_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ctest's SKIP_RETURN_CODE (tests/CMakeLists.txt). */
#define MOEQ_TEST_SKIP 77

/* Value of key in the env file, copied to out; 0 when found. */
static inline int moeq_test_env_file_get(const char *key, char *out, size_t out_size) {
    const char *path = getenv("MOEQ_TEST_ENV_FILE");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return -1;
    char line[512];
    size_t key_len = strlen(key);
    int found = -1;
    while (found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, key_len) != 0 || line[key_len] != '=') continue;
        char *value = line + key_len + 1;
        size_t len = strcspn(value, "\r\n");
        if (len + 1 > out_size) break; /* does not fit: treat as absent */
        memcpy(out, value, len);
        out[len] = '\0';
        found = 0;
    }
    fclose(f);
    return found;
}

/*
 * Address ("127.0.0.1:port") of the test service named key (MOEQ_TEST_KAFKA
 * or MOEQ_TEST_REDIS); 0 on success. On failure prints why to stderr.
 */
static inline int moeq_test_service(const char *key, char *out, size_t out_size) {
    const char *env = getenv(key);
    if (env && *env) {
        snprintf(out, out_size, "%s", env);
        return 0;
    }
    if (moeq_test_env_file_get(key, out, out_size) == 0) return 0;
    fprintf(stderr, "%s: not set and not in MOEQ_TEST_ENV_FILE (%s); run through ctest (fixture 'services') "
            "or start scripts/test-services.sh and export it\n", key,
            getenv("MOEQ_TEST_ENV_FILE") ? getenv("MOEQ_TEST_ENV_FILE") : "unset");
    return -1;
}

/* A name no other test or run uses: prefix.<pid>.<ns clock>.<counter> (topics, streams, groups). */
static inline void moeq_test_unique_name(char *out, size_t out_size, const char *prefix) {
    static unsigned counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(out, out_size, "%s.%ld.%lld%09ld.%u", prefix, (long)getpid(), (long long)ts.tv_sec, ts.tv_nsec,
             counter++);
}

#endif
