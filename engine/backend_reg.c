/*
 * backend_reg.c — the backends by name. A new backend is a folder
 * (engine/<name>/, its own sources, built when its toolkit is found) plus one
 * line in this table; nothing else in the engine names a backend.
 *
 * "cuda" is always a name the registry knows: in a build without the CUDA
 * backend (no nvcc or no cuBLAS; MOEQ_HAVE_CUDA_BACKEND undefined) asking for
 * it is a clear error saying so, not "unknown".
 */
#include <string.h>

#include "backend.h"
#ifdef MOEQ_HAVE_CUDA_BACKEND
#include "cuda/backend_cuda.h"
#endif

typedef struct backend_entry {
    const char *name;
    moeq_backend_create_fn create;
} backend_entry;

static moeq_err cpu_create(const moeq_backend_config *config, moeq_backend **out, char *errstr, size_t errstr_size) {
    if (!(*out = moeq_backend_cpu_new(config)))
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "backend cpu: out of memory creating it");
    return MOEQ_OK;
}

static const backend_entry registry[] = {
    {"cpu", cpu_create},
#ifdef MOEQ_HAVE_CUDA_BACKEND
    {"cuda", moeq_backend_cuda_new},
#endif
};

#define N_BACKENDS ((int)(sizeof(registry) / sizeof(registry[0])))
#define N_EXTRA 4

static backend_entry extra[N_EXTRA]; /* tests' backends (moeq_backend_register) */

static const backend_entry *find(const char *name) {
    for (int i = 0; name && i < N_BACKENDS; i++)
        if (!strcmp(name, registry[i].name)) return &registry[i];
    for (int i = 0; name && i < N_EXTRA; i++)
        if (extra[i].name && !strcmp(name, extra[i].name)) return &extra[i];
    return NULL;
}

moeq_err moeq_backend_register(const char *name, moeq_backend_create_fn create) {
    if (!name || !create || find(name) || !strcmp(name, "cuda")) return MOEQ_ERR_INVALID_ARG;
    for (int i = 0; i < N_EXTRA; i++)
        if (!extra[i].name) {
            extra[i] = (backend_entry){name, create};
            return MOEQ_OK;
        }
    return MOEQ_ERR_LIMIT;
}

const char *moeq_backend_names(void) {
#ifdef MOEQ_HAVE_CUDA_BACKEND
    return "cpu,cuda";
#else
    return "cpu";
#endif
}

moeq_err moeq_backend_new(const char *name, const moeq_backend_config *config, moeq_backend **out, char *errstr,
                          size_t errstr_size) {
    *out = NULL;
    const backend_entry *b = find(name);
    if (b) return b->create(config, out, errstr, errstr_size);
    if (name && !strcmp(name, "cuda"))
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "backend \"cuda\": this build has no CUDA backend (it needs nvcc and the cuBLAS wheels at "
                         "configure time: scripts/setup.sh, -DMOEQ_CUDA=ON; see docs/CUDA.md); built: %s",
                         moeq_backend_names());
    return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "backend \"%s\" is unknown (known: %s)",
                     name ? name : "(null)", moeq_backend_names());
}
