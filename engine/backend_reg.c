/*
 * backend_reg.c — the backends by name. A new backend is a folder
 * (engine/<name>/, its own sources, built when its toolkit is found) plus one
 * line in this table; nothing else in the engine names a backend.
 */
#include <string.h>

#include "backend.h"

typedef struct backend_entry {
    const char *name;
    moeq_backend *(*create)(const moeq_backend_config *config);
} backend_entry;

static const backend_entry registry[] = {
    {"cpu", moeq_backend_cpu_new},
};

#define N_BACKENDS ((int)(sizeof(registry) / sizeof(registry[0])))

const char *moeq_backend_names(void) { return "cpu"; }

moeq_err moeq_backend_new(const char *name, const moeq_backend_config *config, moeq_backend **out, char *errstr,
                          size_t errstr_size) {
    *out = NULL;
    for (int i = 0; i < N_BACKENDS; i++) {
        if (!name || strcmp(name, registry[i].name)) continue;
        if (!(*out = registry[i].create(config)))
            return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "backend %s: out of memory creating it", name);
        return MOEQ_OK;
    }
    return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "backend \"%s\" is unknown (known: %s)",
                     name ? name : "(null)", moeq_backend_names());
}
