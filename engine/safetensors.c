/*
 * safetensors.c — parse, validate and mmap safetensors files; resolve a
 * model directory into its shards.
 *
 * Every tensor is checked before anyone reads it: dtype supported, shape
 * sane, data_offsets inside the file and equal to shape x dtype size, no two
 * tensors overlapping. A file that passes cannot make a reader run off the
 * mapping. Deliberately not here: what the tensors mean (model.c).
 */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moeq/util.h"

#define MAX_JSON_INT 9007199254740992.0 /* 2^53: exact in a double */

int moeq_dtype_from_name(const char *name, moeq_dtype *dtype) {
    static const struct {
        const char *name;
        moeq_dtype dtype;
    } names[] = {{"F32", MOEQ_DTYPE_F32}, {"BF16", MOEQ_DTYPE_BF16}, {"F16", MOEQ_DTYPE_F16},
                 {"F8_E4M3", MOEQ_DTYPE_F8_E4M3}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i].name)) {
            *dtype = names[i].dtype;
            return 0;
        }
    return -1;
}

void moeq_safetensors_free_tensors(moeq_tensor *tensors, int n_tensors) {
    if (!tensors) return;
    for (int i = 0; i < n_tensors; i++) free((char *)tensors[i].name);
    free(tensors);
}

static int json_uint(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return -1;
    double v = item->valuedouble;
    if (!(v >= 0 && v <= MAX_JSON_INT) || v != (double)(uint64_t)v) return -1;
    *out = (uint64_t)v;
    return 0;
}

/* Fill t (dtype, shape, offsets) from one header entry; begin/end are relative to the data region. */
static moeq_err parse_entry(const cJSON *entry, const char *file, moeq_tensor *t, uint64_t *begin, uint64_t *end,
                            char *errstr, size_t errstr_size) {
    const char *name = entry->string;
    if (!cJSON_IsObject(entry))
        return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "%s: tensor '%s': entry is not an object", file, name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offsets))
        return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size,
                         "%s: tensor '%s': needs string 'dtype', array 'shape', array 'data_offsets'", file, name);
    if (moeq_dtype_from_name(dtype->valuestring, &t->dtype) != 0)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size,
                         "%s: tensor '%s' has dtype %s (supported: F32, BF16, F16, F8_E4M3)", file, name,
                         dtype->valuestring);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > 4)
        return moeq_errf(MOEQ_ERR_UNSUPPORTED, errstr, errstr_size, "%s: tensor '%s' has %d dimensions (at most 4)",
                         file, name, ndim);
    t->ndim = ndim;
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        uint64_t dim;
        if (json_uint(cJSON_GetArrayItem(shape, d), &dim) != 0 || dim > ((uint64_t)1 << 40))
            return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "%s: tensor '%s': bad shape[%d]", file, name, d);
        t->shape[d] = (int64_t)dim;
        if (dim && numel > UINT64_MAX / dim)
            return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "%s: tensor '%s': shape overflows", file, name);
        numel *= dim;
    }
    if (cJSON_GetArraySize(offsets) != 2 || json_uint(cJSON_GetArrayItem(offsets, 0), begin) != 0 ||
        json_uint(cJSON_GetArrayItem(offsets, 1), end) != 0 || *end < *begin)
        return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "%s: tensor '%s': bad data_offsets", file, name);
    size_t esize = moeq_dtype_size(t->dtype);
    if (numel > UINT64_MAX / esize || *end - *begin != numel * esize)
        return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size,
                         "%s: tensor '%s': data_offsets span %llu bytes but shape x %s needs %llu", file, name,
                         (unsigned long long)(*end - *begin), moeq_dtype_name(t->dtype),
                         (unsigned long long)(numel * esize));
    t->nbytes = (size_t)(*end - *begin);
    return MOEQ_OK;
}

typedef struct span {
    uint64_t begin, end;
    int index;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* No two non-empty tensors may share bytes. */
static moeq_err check_overlaps(span *spans, int n, const moeq_tensor *tensors, const char *file, char *errstr,
                               size_t errstr_size) {
    qsort(spans, (size_t)n, sizeof *spans, span_cmp);
    uint64_t covered = 0;
    int last = -1;
    for (int i = 0; i < n; i++) {
        if (spans[i].begin == spans[i].end) continue;
        if (last >= 0 && spans[i].begin < covered)
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size, "%s: tensors '%s' and '%s' overlap", file,
                             tensors[last].name, tensors[spans[i].index].name);
        covered = spans[i].end;
        last = spans[i].index;
    }
    return MOEQ_OK;
}

/* Validate and bind every entry of the parsed header. */
static moeq_err parse_entries(const cJSON *root, const uint8_t *data, uint64_t data_size, const char *file,
                              moeq_tensor *tensors, span *spans, int *n_out, char **metadata_json, char *errstr,
                              size_t errstr_size) {
    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e))
                return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "%s: __metadata__ is not an object", file);
            *metadata_json = cJSON_PrintUnformatted(e);
            continue;
        }
        moeq_tensor *t = &tensors[n];
        memset(t, 0, sizeof *t);
        uint64_t begin = 0, end = 0;
        moeq_err err = parse_entry(e, file, t, &begin, &end, errstr, errstr_size);
        if (err) return err;
        if (end > data_size)
            return moeq_errf(MOEQ_ERR_FORMAT, errstr, errstr_size,
                             "%s: tensor '%s' ends at data byte %llu but the file holds only %llu data bytes "
                             "(truncated file?)",
                             file, e->string, (unsigned long long)end, (unsigned long long)data_size);
        t->data = data + begin;
        t->name = strdup(e->string);
        if (!t->name) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "%s: out of memory", file);
        spans[n] = (span){begin, end, n};
        *n_out = ++n;
    }
    return check_overlaps(spans, n, tensors, file, errstr, errstr_size);
}

moeq_err moeq_safetensors_parse(const uint8_t *buf, size_t file_size, const char *file_name,
                                moeq_tensor **tensors_out, int *n_tensors_out, char **metadata_json,
                                char *errstr, size_t errstr_size) {
    *tensors_out = NULL;
    *n_tensors_out = 0;
    *metadata_json = NULL;
    if (file_size < 8)
        return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "%s: %zu bytes, too short for a safetensors header",
                         file_name, file_size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > MOEQ_SAFETENSORS_MAX_HEADER || hlen > file_size - 8)
        return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size,
                         "%s: header length %llu runs past the end of the file (%zu bytes) or over the %llu limit",
                         file_name, (unsigned long long)hlen, file_size,
                         (unsigned long long)MOEQ_SAFETENSORS_MAX_HEADER);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)buf + 8, (size_t)hlen, &end, 0);
    if (!root || !cJSON_IsObject(root)) {
        long at = end ? (long)(end - (const char *)buf - 8) : -1;
        cJSON_Delete(root);
        return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "%s: header is not a JSON object (error near byte %ld)",
                         file_name, at);
    }
    int cap = cJSON_GetArraySize(root);
    moeq_tensor *tensors = calloc((size_t)cap + 1, sizeof *tensors);
    span *spans = calloc((size_t)cap + 1, sizeof *spans);
    int n = 0;
    moeq_err err = MOEQ_OK;
    if (!tensors || !spans)
        err = moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "%s: out of memory", file_name);
    else
        err = parse_entries(root, buf + 8 + hlen, file_size - 8 - hlen, file_name, tensors, spans, &n, metadata_json,
                            errstr, errstr_size);
    cJSON_Delete(root);
    free(spans);
    if (err) {
        moeq_safetensors_free_tensors(tensors, n);
        free(*metadata_json);
        *metadata_json = NULL;
        return err;
    }
    *tensors_out = tensors;
    *n_tensors_out = n;
    return MOEQ_OK;
}

void moeq_mapped_file_close(moeq_mapped_file *file) {
    if (!file) return;
    if (file->map) munmap(file->map, file->size);
    moeq_safetensors_free_tensors(file->tensors, file->n_tensors);
    free(file->metadata_json);
    free(file->path);
    free(file);
}

static moeq_err map_file(moeq_mapped_file *f, char *errstr, size_t errstr_size) {
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return moeq_errf(errno == ENOENT ? MOEQ_ERR_NOT_FOUND : MOEQ_ERR_IO, errstr, errstr_size, "%s: %s", f->path,
                         strerror(errno));
    struct stat st;
    moeq_err err = MOEQ_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        err = moeq_errf(MOEQ_ERR_IO, errstr, errstr_size, "%s: not a regular file", f->path);
        goto close_fd;
    }
    f->size = (size_t)st.st_size;
    if (f->size == 0) goto close_fd; /* the parser reports it as too short */
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        err = moeq_errf(MOEQ_ERR_IO, errstr, errstr_size, "%s: mmap: %s", f->path, strerror(errno));
    }
close_fd:
    close(fd);
    return err;
}

moeq_err moeq_mapped_file_open(const char *path, moeq_mapped_file **out, char *errstr, size_t errstr_size) {
    *out = NULL;
    moeq_mapped_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "%s: out of memory", path);
    }
    moeq_err err = map_file(f, errstr, errstr_size);
    if (!err) {
        static const uint8_t empty[1];
        err = moeq_safetensors_parse(f->map ? f->map : empty, f->size, path, &f->tensors, &f->n_tensors,
                                     &f->metadata_json, errstr, errstr_size);
    }
    if (err) {
        moeq_mapped_file_close(f);
        return err;
    }
    *out = f;
    return MOEQ_OK;
}

/* ---- directories --------------------------------------------------------- */

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Shard names must be plain file names: no directories, no "..". */
static int shard_name_ok(const char *name) {
    return name[0] && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
}

static int find_shard(char **names, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return i;
    return -1;
}

static const moeq_tensor *file_find(const moeq_mapped_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

/* Distinct shard file names of a weight_map, in first-seen order. */
static moeq_err index_shards(const cJSON *map, const char *index_path, char ***names_out, int *n_out, char *errstr,
                             size_t errstr_size) {
    int cap = cJSON_GetArraySize(map), n = 0;
    char **names = calloc((size_t)cap + 1, sizeof *names);
    if (!names) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "%s: out of memory", index_path);
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !shard_name_ok(e->valuestring)) {
            free(names);
            return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "%s: weight_map['%s'] is not a shard file name",
                             index_path, e->string);
        }
        if (find_shard(names, n, e->valuestring) < 0) names[n++] = e->valuestring;
    }
    *names_out = names;
    *n_out = n;
    return MOEQ_OK;
}

/* Every tensor the index lists must be in the shard it names. */
static moeq_err check_weight_map(const cJSON *map, char **names, moeq_mapped_file **files, int n,
                                 const char *index_path, char *errstr, size_t errstr_size) {
    for (const cJSON *e = map->child; e; e = e->next) {
        int s = find_shard(names, n, e->valuestring);
        if (!file_find(files[s], e->string))
            return moeq_errf(MOEQ_ERR_NOT_FOUND, errstr, errstr_size, "%s: tensor '%s' is listed for %s but not in it",
                             index_path, e->string, files[s]->path);
    }
    return MOEQ_OK;
}

static moeq_err open_index(const char *dir, const char *index_path, moeq_mapped_file ***files_out, int *n_out,
                           char *errstr, size_t errstr_size) {
    char *text = NULL;
    size_t len = 0;
    moeq_err err = moeq_read_file(index_path, (size_t)64 << 20, &text, &len, errstr, errstr_size);
    if (err) return err;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return moeq_errf(MOEQ_ERR_PARSE, errstr, errstr_size, "%s: not JSON with a 'weight_map' object", index_path);
    }
    char **names = NULL;
    int n = 0;
    moeq_mapped_file **files = NULL;
    err = index_shards(map, index_path, &names, &n, errstr, errstr_size);
    if (err) goto free_root;
    files = calloc((size_t)n + 1, sizeof *files);
    if (!files) {
        err = moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "%s: out of memory", index_path);
        goto free_names;
    }
    for (int i = 0; i < n && !err; i++) {
        char *path = path_join(dir, names[i]);
        err = path ? moeq_mapped_file_open(path, &files[i], errstr, errstr_size)
                   : moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
        free(path);
    }
    if (!err) err = check_weight_map(map, names, files, n, index_path, errstr, errstr_size);
    if (err) {
        for (int i = 0; i < n; i++) moeq_mapped_file_close(files[i]);
        free(files);
        goto free_names;
    }
    *files_out = files;
    *n_out = n;
free_names:
    free(names);
free_root:
    cJSON_Delete(root);
    return err;
}

moeq_err moeq_safetensors_open_dir(const char *dir, moeq_mapped_file ***files, int *n_files, char *errstr,
                                   size_t errstr_size) {
    *files = NULL;
    *n_files = 0;
    char *index = path_join(dir, "model.safetensors.index.json");
    char *single = path_join(dir, "model.safetensors");
    moeq_err err = MOEQ_OK;
    if (!index || !single) {
        err = moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
    } else if (file_exists(index)) {
        err = open_index(dir, index, files, n_files, errstr, errstr_size);
    } else if (file_exists(single)) {
        *files = calloc(1, sizeof **files);
        if (!*files) err = moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "out of memory");
        if (!err) err = moeq_mapped_file_open(single, &(*files)[0], errstr, errstr_size);
        if (err) {
            free(*files);
            *files = NULL;
        } else {
            *n_files = 1;
        }
    } else {
        err = moeq_errf(MOEQ_ERR_NOT_FOUND, errstr, errstr_size,
                        "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    free(index);
    free(single);
    return err;
}
