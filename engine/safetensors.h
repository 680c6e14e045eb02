/*
 * safetensors.h — internal: read safetensors files (8-byte little-endian
 * header length, a JSON header, then the raw tensor bytes), memory-mapped and
 * validated, single-file or sharded through model.safetensors.index.json.
 *
 * The header parser is a pure function over bytes (tested directly); the
 * mapping functions are the thin I/O shell around it.
 */
#ifndef MOEQ_ENGINE_SAFETENSORS_H
#define MOEQ_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/err.h"
#include "tensor.h"

/* Header bound: real checkpoints' headers are well under 1 MiB per shard. */
#define MOEQ_SAFETENSORS_MAX_HEADER ((uint64_t)100 << 20)

/* Supported names: F32, BF16, F16, F8_E4M3. 0 on success, -1 when unknown. */
int moeq_dtype_from_name(const char *name, moeq_dtype *dtype);

/*
 * Parse and validate the header of a file of file_size bytes whose first
 * bytes are buf[0..buf_len) (buf_len >= the header's end; the whole mapping is
 * fine). On success *tensors (malloc'd, n_tensors entries; each name malloc'd)
 * has data pointing into buf, and *metadata_json (malloc'd or NULL) is the
 * "__metadata__" object re-printed. file_name only labels messages.
 * Errors: PARSE (short file, header length past EOF, bad JSON, bad entry),
 * UNSUPPORTED (dtype), FORMAT (offsets outside the file or not matching
 * shape x dtype size: a truncated file; overlapping tensors).
 */
moeq_err moeq_safetensors_parse(const uint8_t *buf, size_t file_size, const char *file_name,
                                moeq_tensor **tensors, int *n_tensors, char **metadata_json, char *errstr,
                                size_t errstr_size);

/* Free what moeq_safetensors_parse returned. */
void moeq_safetensors_free_tensors(moeq_tensor *tensors, int n_tensors);

/* One mmapped, validated file. Its tensors' names and data live as long as it does. */
typedef struct moeq_mapped_file {
    char *path;
    void *map;
    size_t size;
    moeq_tensor *tensors;
    int n_tensors;
    char *metadata_json; /* "__metadata__" or NULL */
} moeq_mapped_file;

moeq_err moeq_mapped_file_open(const char *path, moeq_mapped_file **out, char *errstr, size_t errstr_size);
void moeq_mapped_file_close(moeq_mapped_file *file); /* NULL is safe */

/*
 * Open dir/model.safetensors.index.json's shards (every tensor of weight_map
 * must be in the file it names) or else dir/model.safetensors. *files is
 * malloc'd (caller closes each and frees). NOT_FOUND when neither exists.
 */
moeq_err moeq_safetensors_open_dir(const char *dir, moeq_mapped_file ***files, int *n_files, char *errstr,
                                   size_t errstr_size);

#endif
