/*
 * backend_reg.c — the backends by name. A new backend is a folder
 * (engine/<name>/, its own sources, built when its toolkit is found) plus one
 * line in this table; nothing else in the engine names a backend.
 *
 * "cuda" is always a name the registry knows: in a build without the CUDA
 * backend (no nvcc or no cuBLAS; MOEQ_HAVE_CUDA_BACKEND undefined) asking for
 * it is a clear error saying so, not "unknown". In a build with it, the
 * backend is a plugin (libmoeq_backend_cuda.so, engine/CMakeLists.txt) loaded
 * on first use, so no process that runs on the CPU maps the CUDA libraries.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef MOEQ_HAVE_CUDA_BACKEND
#include <dlfcn.h>
#endif

#include "backend.h"

typedef struct backend_entry {
    const char *name;
    moeq_backend_create_fn create;
} backend_entry;

static moeq_err cpu_create(const moeq_backend_config *config, moeq_backend **out, char *errstr, size_t errstr_size) {
    if (!(*out = moeq_backend_cpu_new(config)))
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "backend cpu: out of memory creating it");
    return MOEQ_OK;
}

/*
 * "cpu-device": the CPU backend behind a device's contract (host_visible = 0). The engine then takes the paths a
 * GPU takes (lm_head into the arena, logits records reduced by the backend, rows brought back by download only
 * where a reader needs them) and so does the worker's loop, with the CPU's arithmetic: the same tokens as "cpu".
 * It exists so that those paths run end to end on any machine (tests/test_worker_pipeline.c), not only on a GPU.
 */
static moeq_err cpu_device_create(const moeq_backend_config *config, moeq_backend **out, char *errstr,
                                  size_t errstr_size) {
    moeq_err err = cpu_create(config, out, errstr, errstr_size);
    if (!err) (*out)->host_visible = 0;
    return err;
}

#ifdef MOEQ_HAVE_CUDA_BACKEND
#define CUDA_PLUGIN "libmoeq_backend_cuda.so"

/* Where the plugin may be: $MOEQ_BACKEND_DIR, beside the executable, its ../lib/moeq, the build tree. */
static void *open_cuda_plugin(char *why, size_t why_size) {
    char paths[4][PATH_MAX + 64];
    int n = 0;
    const char *dir = getenv("MOEQ_BACKEND_DIR");
    if (dir && *dir) snprintf(paths[n++], sizeof paths[0], "%s/" CUDA_PLUGIN, dir);
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(paths[n++], sizeof paths[0], "%s/" CUDA_PLUGIN, exe);
        snprintf(paths[n++], sizeof paths[0], "%s/../lib/moeq/" CUDA_PLUGIN, exe);
    }
    snprintf(paths[n++], sizeof paths[0], "%s", MOEQ_CUDA_BACKEND_BUILD_PATH);
    why[0] = 0;
    for (int i = 0; i < n; i++) {
        if (access(paths[i], F_OK) != 0) continue;
        void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        snprintf(why, why_size, "%s", dlerror()); /* there, but it or a library it needs would not load */
        return NULL;
    }
    snprintf(why, why_size, "%s is not in $MOEQ_BACKEND_DIR, beside the executable, in ../lib/moeq or at %s",
             CUDA_PLUGIN, MOEQ_CUDA_BACKEND_BUILD_PATH);
    return NULL;
}

static moeq_err cuda_create(const moeq_backend_config *config, moeq_backend **out, char *errstr, size_t errstr_size) {
    static moeq_backend_create_fn create; /* the plugin stays loaded for the process's life */
    if (!create) {
        char why[PATH_MAX + 256];
        void *h = open_cuda_plugin(why, sizeof why);
        if (h) *(void **)&create = dlsym(h, "moeq_backend_cuda_new");
        if (h && !create) snprintf(why, sizeof why, "%s has no moeq_backend_cuda_new", CUDA_PLUGIN);
        if (!create)
            return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "backend cuda: cannot load the plugin: %s",
                             why);
    }
    return create(config, out, errstr, errstr_size);
}
#endif

static const backend_entry registry[] = {
    {"cpu", cpu_create},
    {"cpu-device", cpu_device_create},
#ifdef MOEQ_HAVE_CUDA_BACKEND
    {"cuda", cuda_create},
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
    return "cpu,cuda,cpu-device";
#else
    return "cpu,cpu-device";
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
