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
    moeq_err (*create)(const moeq_backend_config *config, moeq_backend **out, char *errstr, size_t errstr_size);
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
    for (int i = 0; i < N_BACKENDS; i++)
        if (name && !strcmp(name, registry[i].name)) return registry[i].create(config, out, errstr, errstr_size);
    if (name && !strcmp(name, "cuda"))
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "backend \"cuda\": this build has no CUDA backend (it needs nvcc and the cuBLAS wheels at "
                         "configure time: scripts/setup.sh, -DMOEQ_CUDA=ON; see docs/CUDA.md); built: %s",
                         moeq_backend_names());
    return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "backend \"%s\" is unknown (known: %s)",
                     name ? name : "(null)", moeq_backend_names());
}
