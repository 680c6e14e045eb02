/*
 * engine_props.c — the property table of moeq_engine_params: name, type,
 * range, default and unit of every field, for `key = value` configuration,
 * --help and docs/CONFIGURATION.md (see moeq/config.h).
 *
 * The defaults here are the ones moeq_engine_default_params() returns; a test
 * keeps the two equal. The ranges are what moeq_engine_new() accepts, bounded
 * above by what fits the field. Data only: no parsing, no I/O.
 *
 * The int fields are INT properties of size sizeof(int); the table parser
 * must store an INT by its `size` (4 or 8 bytes).
 */
#include <stddef.h>

#include "moeq/config.h"
#include "moeq/engine.h"

#define P(field) offsetof(moeq_engine_params, field), sizeof(((moeq_engine_params *)0)->field)

const moeq_prop moeq_engine_params_props[] = {
    {"max_seqs", MOEQ_PROP_INT, P(max_seqs), 1, 1 << 20, "64", "sequences alive at once (slots in the KV cache)"},
    {"max_step_tokens", MOEQ_PROP_INT, P(max_step_tokens), 1, 1 << 24, "2048",
     "tokens in one engine step over all items; sizes the per-step scratch arena"},
    {"kv_block_tokens", MOEQ_PROP_INT, P(kv_block_tokens), 1, 1 << 16, "16", "tokens per KV cache block (page)"},
    {"kv_cache_tokens", MOEQ_PROP_INT, P(kv_cache_tokens), 1, (double)(1LL << 40), "65536",
     "KV cache capacity in tokens over all sequences"},
    {"n_threads", MOEQ_PROP_INT, P(n_threads), 0, 4096, "0", "compute threads, the caller's included; 0 = all cores"},
    {"batch_invariant", MOEQ_PROP_BOOL, P(batch_invariant), 0, 1, "true",
     "fixed reduction order per output element (logits independent of the batch); false: OpenBLAS sgemm for "
     "matmuls of >= 16 tokens"},
    {"max_model_len", MOEQ_PROP_INT, P(max_model_len), 0, 1 << 30, "0",
     "context: most tokens (prompt + generated) one sequence may hold; 0 = the model's max_position_embeddings, "
     "never more"},
    {"backend", MOEQ_PROP_STR, P(backend), 0, 0, "cpu",
     "compute backend by name: \"cpu\" (the reference, always built) or \"cuda\" (a build with nvcc and "
     "cuBLAS; docs/CUDA.md); \"cpu-device\": the CPU behind a GPU's contract (the device paths, for tests); an "
     "unknown name, or cuda in a build without it, fails engine creation"},
    {"device", MOEQ_PROP_INT, P(device), 0, 1024, "0",
     "device ordinal a device backend (cuda) runs on; one worker process per GPU; ignored by cpu"},
    {"prefix_cache", MOEQ_PROP_BOOL, P(prefix_cache), 0, 1, "true",
     "prefix cache: full KV blocks of ended sequences stay cached (keyed by their tokens) for later sequences "
     "with the same leading tokens (docs/PREFIX_CACHE.md)"},
    {"prefix_cache_share", MOEQ_PROP_DOUBLE, P(prefix_cache_share), 0, 1, "1",
     "most of the KV pool that cached blocks no sequence uses may hold (0..1); cached blocks are evicted "
     "(least recently used first) whenever the free list runs out, whatever this says"},
    {"cpu_matrix", MOEQ_PROP_STR, P(cpu_matrix), 0, 0, "auto",
     "the CPU backend's matrix products: \"auto\" (AMX BF16 tiles where the CPU has AMX: the weight "
     "products with float32 activations split into two BF16 parts, MLA attention with both operands split "
     "into three; else the float32 lanes), \"lanes\" (the float32 lanes everywhere: "
     "the same bits on every x86 CPU) or \"amx\" (fails where there is no AMX); each is batch-invariant, "
     "their bits differ"},
    {"mtp_draft", MOEQ_PROP_STR, P(mtp_draft), 0, 0, "f8",
     "the weights MTP drafts are made with: \"f8\" (8-bit copies of the MTP layer's projections and head, "
     "about half of a BF16 draft's bytes, on host backends (elsewhere exact): int8 rows with exact int32 sums "
     "where the CPU has AVX512-VNNI, else F8 E4M3 with 128x128 block scales), \"e4m3\" (the F8 E4M3 copies "
     "everywhere) or \"exact\" (the checkpoint's weights); a draft is only a proposal that the main model "
     "verifies, so the emitted tokens are the same either way (docs/MTP.md)"},
    {"cuda_graphs", MOEQ_PROP_STR, P(cuda_graphs), 0, 0, "off",
     "CUDA graphs for decode steps of up to 256 sequences: \"off\", \"auto\" (where the backend has them) or "
     "\"on\" (fails on a backend without them: cpu). A step is padded to its bucket (1, 2, 4, ..., 256 tokens), "
     "its layers captured once per bucket and replayed; a capture that fails runs eagerly (backend_info says so). "
     "Batch-invariant: the same bits as off (tested on an H100, 2026-12-05, where decode ran 0.99-1.12x the speed "
     "of off: the steps' time is in the kernels, not their launches; docs/CUDA.md)"},
    {"cuda_matrix", MOEQ_PROP_STR, P(cuda_matrix), 0, 0, "lanes",
     "the CUDA backend's own matrix products: \"lanes\" (the 16-lane kernels at every size, run on an H100) or "
     "\"auto\" (up to 8 tokens, BF16/F8 weights whose rows are a multiple of 16: two threads a weight row, "
     "16-byte loads in flight ahead of their multiply-adds; more tokens: 32 x 32 tiles with both operands staged "
     "in shared memory; host-tested for the same bits, not yet run on a device: the default once a device run "
     "confirms it); the same bits either way (docs/CUDA.md)"},
    {"head_screen", MOEQ_PROP_STR, P(head_screen), 0, 0, "auto",
     "the lm_head of rows read only for their argmax (greedy draws, records nobody samples) on the CPU backend: "
     "\"auto\" (where the CPU has AVX512-VNNI and batch_invariant is on: the head as an int8 copy first, with a "
     "proven bound on each logit's error, then only the rows that bound cannot rule out on the exact path; the "
     "same token and value as the whole row, 2-2.7x faster on the float32 lanes; the copy, half the head's "
     "BF16 bytes, is made at the first such step) or \"off\" (every row whole) (docs/ENGINE.md)"},
    {"cpu_prefetch", MOEQ_PROP_STR, P(cpu_prefetch), 0, 0, "auto",
     "where the CPU kernels prefetch their weight streams (AVX-512 tiles, int8 draft kernels): \"auto\" (this "
     "CPU's choice: L2 on AMD Zen 3/4, L1 elsewhere; cpu_kernels in model-info says which), \"l1\" or \"l2\"; "
     "the same bits either way. Process-wide: an engine created with l1 or l2 sets it for the whole process "
     "(bench-engine --tune measures which is faster here; docs/BENCHMARKS.md)"},
    {"cpu_f8_widen", MOEQ_PROP_STR, P(cpu_f8_widen), 0, 0, "auto",
     "how the CPU's few-token tiles widen F8 E4M3 weights: \"auto\" (straight into float32 bits on AMD Zen 3/4, "
     "through float16 elsewhere), \"f16\" or \"f32\"; the same bits either way; process-wide like cpu_prefetch"},
    {"cpu_k_blocked", MOEQ_PROP_STR, P(cpu_k_blocked), 0, 0, "auto",
     "whether the CPU's BF16, F16 and F32 products of 5-32 tokens with rows over 1,024 columns walk K in steps "
     "of 1,024 (\"on\") or take the direct tiles over whole rows (\"off\"); \"auto\": off on AMD Zen 3/4, on "
     "elsewhere; more tokens always walk K; the same bits either way; process-wide like cpu_prefetch"},
    {"expert_weights", MOEQ_PROP_STR, P(expert_weights), 0, 0, "all",
     "when the main layers' routed experts are made usable: \"all\" (every one, when the engine is created) "
     "or \"group\" (when the engine joins an expert-parallel group, only the experts its placement gives the "
     "rank, replicas included: on a GPU a rank then holds 1/n_ranks of them; a step before joining maps them all "
     "first); the worker takes group whenever ep.group is set (docs/EP.md)"},
    MOEQ_PROP_END,
};
