/*
 * moeq/engine.h — the DeepSeek-V3-style Mixture-of-Experts inference engine.
 *
 * A library other programs can link: load a model directory in the Hugging
 * Face layout (config.json + *.safetensors, mmapped), create an engine (KV
 * cache pool + scratch sized at creation), then run steps. One step is a list
 * of (sequence, tokens) items mixing prefill chunks and decode tokens of many
 * sequences (continuous batching); it appends the tokens to each sequence's
 * paged MLA cache and returns logits.
 *
 * Exactness: a sequence's logits are bit-identical whatever else is in the
 * step (batch invariance, on by default).
 *
 * Threading: a model is immutable after load and may be shared by engines. An
 * engine is used from one thread at a time; it runs its own worker threads.
 *
 * What it does not do: tokenization (moeq/tokenizer.h), job scheduling (the
 * worker), networking.
 */
#ifndef MOEQ_ENGINE_H
#define MOEQ_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/config.h"
#include "moeq/err.h"
#include "moeq/ep.h"
#include "moeq/model_config.h" /* moeq_model_config, moeq_model_config_load */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- model ---------------------------------------------------------------- */

typedef struct moeq_model moeq_model;

typedef struct moeq_model_params {
    int load_mtp;         /* load the MTP layer(s) when present (default 1)          */
    int verify_tensors;   /* reject unknown ("extra") tensors (default 1)            */
} moeq_model_params;

moeq_model_params moeq_model_default_params(void);

/*
 * Load dir/config.json and dir/model.safetensors or the shards listed in
 * dir/model.safetensors.index.json, memory-mapped (no copy). Errors, never a
 * crash, for missing/extra tensors, wrong shapes, truncated files, bad header
 * JSON, unknown dtype, unsupported model_type; errstr names file and tensor.
 */
moeq_err moeq_model_load(const char *dir, const moeq_model_params *params, moeq_model **out,
                         char *errstr, size_t errstr_size);
void moeq_model_destroy(moeq_model *model); /* NULL is safe */

/* Borrowed; valid for the model's lifetime. */
const moeq_model_config *moeq_model_get_config(const moeq_model *model);

/* Bytes of weights a decode step reads for one token (attention + dense + k active experts + head). */
size_t moeq_model_active_bytes_per_token(const moeq_model *model);
/* The same for one draft of the MTP layer (eh_proj, its block, its head, one embedding row); 0 without one. */
size_t moeq_model_mtp_active_bytes_per_token(const moeq_model *model);
size_t moeq_model_total_params(const moeq_model *model);

/* A weight this large (in magnitude) is reported by moeq_model_check_weights although finite: no trained
 * weight comes near, and a product with an ordinary activation, or a sum of a few, overflows float32. */
#define MOEQ_WEIGHT_HUGE 1e30f

/* One tensor with bad values, as moeq_model_check_weights reports it. */
typedef struct moeq_weight_issue {
    const char *tensor;   /* HF name, borrowed from the model                                   */
    int64_t nonfinite;    /* values that are NaN or inf once dequantised (FP8: value x scale)    */
    int64_t huge;         /* finite values with |x| >= MOEQ_WEIGHT_HUGE                          */
    int64_t first;        /* flat index (row * cols + col) of the first bad value               */
} moeq_weight_issue;

typedef void (*moeq_weight_issue_fn)(void *ctx, const moeq_weight_issue *issue);

/*
 * Scan every tensor of the model (reads every page: slow on big
 * checkpoints) for NaN, inf and huge values, dequantised as the forward
 * pass does; fn (may be NULL) is called once per bad tensor, in name order;
 * *n_bad counts them. MOEQ_OK whatever was found; MOEQ_ERR_NOMEM.
 */
moeq_err moeq_model_check_weights(const moeq_model *model, moeq_weight_issue_fn fn, void *ctx, int *n_bad,
                                  char *errstr, size_t errstr_size);

/* ---- engine --------------------------------------------------------------- */

typedef struct moeq_engine moeq_engine;
typedef struct moeq_sampler moeq_sampler; /* sampling, below */

typedef struct moeq_engine_params {
    int max_seqs;              /* sequences alive at once (default 64)                */
    int max_step_tokens;       /* tokens in one step, all items (default 2048)        */
    int kv_block_tokens;       /* tokens per cache block (default 16)                 */
    int64_t kv_cache_tokens;   /* cache capacity in tokens over all sequences (default 65536) */
    int n_threads;             /* compute threads; 0 = all cores (default 0)          */
    int batch_invariant;       /* fixed reduction order per row (default 1)           */
    int max_model_len;         /* positions a sequence may hold: 0 = the model's
                                  max_position_embeddings (default); at most that      */
    char backend[16];          /* compute backend by name (default "cpu"; the known
                                  ones are in engine/backend_reg.c)                    */
    int device;                /* device ordinal for a device backend (default 0)     */
    int prefix_cache;          /* keep full cache blocks of ended sequences for later
                                  ones with the same leading tokens (default 1;
                                  docs/PREFIX_CACHE.md)                                */
    double prefix_cache_share; /* most of the pool cached blocks may hold while no
                                  sequence uses them, 0..1 (default 1: all of it; they
                                  are evicted on demand either way)                    */
    char cpu_matrix[8];        /* the CPU backend's NT products: "auto" (default: AMX
                                  BF16 tiles where the CPU has them, else float32
                                  lanes), "lanes" or "amx" (fails where there is none) */
    char mtp_draft[8];         /* the weights MTP drafts are made with: "exact" (the
                                  checkpoint's), "f8" (default: 8-bit copies of the MTP
                                  layer's projections and head on host backends: int8 rows
                                  where the CPU has AVX512-VNNI, else F8 E4M3 with 128x128
                                  block scales) or "e4m3" (F8 E4M3 copies everywhere);
                                  drafts are only proposals, every emitted token is the
                                  main model's)                                        */
    char cuda_graphs[8];       /* CUDA graphs for decode steps of <= 256 sequences: "off"
                                  (default), "auto" (where the backend has them) or
                                  "on" (fails on a backend without them); docs/CUDA.md */
    char cuda_matrix[8];       /* the CUDA backend's own matrix products: "lanes" (default:
                                  the 16-lane kernels at every size) or "auto" (<= 8
                                  tokens: two threads a weight row with 16-byte loads;
                                  more: 32 x 32 tiles staged in shared memory; not yet run
                                  on a device); the same bits either way; docs/CUDA.md */
    char head_screen[8];       /* rows read only for their argmax (greedy draws, records
                                  nobody samples) on the CPU: "auto" (default: the head as
                                  an int8 copy with a proven error bound per logit, then
                                  the candidates that bound leaves on the exact path: the
                                  same token and value as the whole row; batch-invariant
                                  engines where the CPU has AVX512-VNNI) or "off" (every
                                  row whole); docs/ENGINE.md */
    char cpu_prefetch[8];      /* where the CPU kernels prefetch their weight streams:
                                  "auto" (default: this CPU's choice, cpu_kernels), "l1"
                                  or "l2"; process-wide, the same bits either way       */
    char cpu_f8_widen[8];      /* how the few-token CPU tiles widen F8 weights: "auto"
                                  (default), "f16" or "f32"; process-wide, same bits    */
    char cpu_k_blocked[8];     /* whether BF16/F16/F32 CPU products of 5-32 tokens with
                                  K > 1,024 walk K in steps: "auto" (default), "on" or
                                  "off"; process-wide, the same bits either way          */
    char expert_weights[8];    /* when the main layers' routed experts are made usable:
                                  "all" (default: every one, at creation) or "group" (at
                                  moeq_engine_join_group, only the rank's own: a GPU then
                                  holds 1/n_ranks of them; a step before joining maps
                                  them all first); docs/EP.md                            */
} moeq_engine_params;

moeq_engine_params moeq_engine_default_params(void);

/* One line on the backend an engine runs on: its name, and for a device backend the device, which paths
 * are own kernels and which a library, how weights are held (F8's dequantising path). Never NULL. */
const char *moeq_engine_backend_info(const moeq_engine *engine);

/* The CPU backend's matrix kernels on this CPU and its matrix features (AVX512-BF16, AMX), one line. */
const char *moeq_engine_cpu_kernels(void);
/* 1 when the CPU backend can run AMX BF16 tiles here (cpu_matrix = auto takes them); why or why not in words
 * ("amx_bf16 tiles", "no amx_bf16", a refusal by Linux). Thread-safe. */
int moeq_engine_cpu_amx(void);
const char *moeq_engine_cpu_amx_describe(void);
/* 1 when mtp_draft = f8 drafts with int8 copies here (the CPU backend's AVX512-VNNI draft kernels); why or why
 * not in words ("avx512_vnni int8 dot products", "no avx512_vnni: ..."). Thread-safe. */
int moeq_engine_cpu_draft(void);
const char *moeq_engine_cpu_draft_describe(void);

/* Property table of moeq_engine_params (name, type, range, default, doc), for
 * `key = value` configuration of the engine by the worker and tools. */
extern const moeq_prop moeq_engine_params_props[];

/* The model is borrowed and must outlive the engine. */
moeq_err moeq_engine_new(const moeq_model *model, const moeq_engine_params *params, moeq_engine **out,
                         char *errstr, size_t errstr_size);
void moeq_engine_destroy(moeq_engine *engine); /* NULL is safe */

/*
 * The context: the most tokens one sequence may hold (max_model_len, or the
 * model's max_position_embeddings). A step or MTP draft that would put a
 * token at a position >= this fails with MOEQ_ERR_LIMIT, nothing appended:
 * RoPE/YaRN are only defined (trained) below it.
 */
int moeq_engine_max_model_len(const moeq_engine *engine);

/* Bytes of KV cache per token (compressed latent + rope key, all layers). */
size_t moeq_engine_kv_bytes_per_token(const moeq_engine *engine);
/* Bytes of the step arena (activations of max_step_tokens tokens) the backend holds for this engine. */
size_t moeq_engine_step_arena_bytes(const moeq_engine *engine);

/* The memory of the device the engine runs on (see backend.h's memory op): 0 when its backend cannot say. */
void moeq_engine_device_memory(const moeq_engine *engine, size_t *used, size_t *total);

/* A sequence: a slot with its own block table. Returns MOEQ_ERR_LIMIT when max_seqs are alive. */
moeq_err moeq_engine_seq_new(moeq_engine *engine, int *seq_id);
void moeq_engine_seq_free(moeq_engine *engine, int seq_id);
/* Tokens currently cached for the sequence. */
int moeq_engine_seq_len(const moeq_engine *engine, int seq_id);
/*
 * The KV pools as an admission policy sees them (the worker's scheduler, which counts blocks that sequences
 * share once). mtp = 0: the main cache; 1: the MTP layer's (0 and 0 without one). *takeable: the blocks a
 * sequence can take now, free ones and cached ones (no sequence holds them; evicted on demand); *total: the pool.
 */
void moeq_engine_kv_blocks(const moeq_engine *engine, int mtp, int64_t *takeable, int64_t *total);
/*
 * Blocks growing seq_id to n_tokens would take from its pool (mtp = 1: its MTP entries), the copy of a shared
 * last block included; 0 when it is that long already; -1 when it is not alive (mtp = 1: or not marked).
 */
int64_t moeq_engine_seq_blocks_to_grow(const moeq_engine *engine, int seq_id, int mtp, int64_t n_tokens);
/*
 * The first layer whose MoE router saw a non-finite score (NaN, inf) for
 * one of the sequence's tokens (0-based; MTP layers after the main ones),
 * or -1. Only routers are watched (cheap: they read every score anyway), so
 * a NaN in dense layers shows at the next MoE layer; logits are checked by
 * the caller (moeq_sampler_sample returns -1). -1 for a dead sequence.
 */
int moeq_engine_seq_nonfinite_layer(const moeq_engine *engine, int seq_id);
/* Drop cached positions >= n_tokens (rollback of rejected draft tokens). */
moeq_err moeq_engine_seq_truncate(moeq_engine *engine, int seq_id, int n_tokens);

/*
 * A new sequence (*dst_seq) whose first n_tokens are src_seq's: a shared
 * prompt prefix, prefilled once. The cache blocks below n_tokens are shared
 * (reference counted; a block is copied before either sequence writes into
 * it), a partial last block is copied; nothing is recomputed, so the new
 * sequence continues bit for bit as if it had been prefilled with those
 * tokens itself. src_seq is unchanged.
 *
 * mtp = 0: the new sequence is not marked for speculative decoding, whatever
 * src_seq is. mtp = 1: it is marked (src_seq must be marked) and shares
 * src_seq's MTP entries 0..n_tokens-1 as well; entry n_tokens-1 reads the
 * token at position n_tokens, so src_seq must hold more than n_tokens tokens
 * and next_token, the token the new sequence appends first, must be the one
 * src_seq holds there (the caller compares prompts; a different first token
 * makes that step fail with INVALID_ARG instead of using a wrong entry).
 * src_seq's pending MTP entries below n_tokens are computed first.
 *
 * INVALID_ARG: n_tokens < 1 or past src_seq's length (mtp = 1: its length -
 * 1), src_seq not alive, mtp = 1 on an unmarked src_seq. LIMIT: no free
 * sequence slot or cache block. On error nothing changes (but pending MTP
 * entries of src_seq may have been computed, which changes no result).
 */
moeq_err moeq_engine_seq_fork(moeq_engine *engine, int src_seq, int n_tokens, int mtp, int32_t next_token,
                              int *dst_seq, char *errstr, size_t errstr_size);

/* ---- prefix cache (docs/PREFIX_CACHE.md) ---------------------------------- */

/*
 * Leading tokens of prompt a new sequence would find computed in the prefix
 * cache: whole cache blocks, at most n_prompt - 1 (the last prompt token is
 * always stepped: its logits are the first output). mtp = 1: only as far as
 * the MTP entries are cached too. Changes nothing; 0 with the cache off.
 */
int moeq_engine_prefix_lookup(const moeq_engine *engine, const int32_t *prompt, int n_prompt, int mtp);
/*
 * Of the blocks moeq_engine_prefix_lookup finds, the leading ones a live sequence holds: a sequence opened on
 * this prompt now would take them without allocating anything (mtp = 1: the MTP cache's, as far as its chain
 * is held). 0 without the prefix cache.
 */
int64_t moeq_engine_prefix_held_blocks(const moeq_engine *engine, const int32_t *prompt, int n_prompt, int mtp);

/*
 * moeq_engine_seq_new (and moeq_engine_seq_set_mtp when mtp = 1) for a
 * sequence that will hold prompt, whose first *n_cached tokens (whole
 * blocks, at most max_cached when >= 0, at most n_prompt - 1) are taken from
 * the prefix cache: they are computed already, the caller steps prompt +
 * *n_cached onwards. The result is bit for bit that of a sequence that
 * prefilled them itself (a hit compares tokens, never only hashes). *n_cached
 * may be 0 (a miss). INVALID_ARG: no prompt, n_prompt < 1, mtp not 0/1;
 * UNSUPPORTED: mtp = 1 without an MTP layer; LIMIT: no free sequence slot.
 */
moeq_err moeq_engine_seq_new_prefix(moeq_engine *engine, const int32_t *prompt, int n_prompt, int max_cached, int mtp,
                                    int *seq_id, int *n_cached, char *errstr, size_t errstr_size);

typedef struct moeq_engine_prefix_stats {
    int64_t lookups;           /* moeq_engine_seq_new_prefix calls                               */
    int64_t hits;              /* of them, those that took >= 1 block                            */
    int64_t lookup_tokens;     /* prompt tokens they could have taken (n_prompt - 1 each)        */
    int64_t hit_tokens;        /* tokens they took                                               */
    int64_t cached_blocks;     /* main-cache blocks cached now (no sequence uses them)           */
    int64_t registered_blocks; /* main-cache blocks with a key now (cached or in use)            */
    int64_t evictions;         /* cached blocks reused for other entries (main and MTP caches)   */
    int64_t collisions;        /* key matches rejected by the token comparison (both caches)     */
} moeq_engine_prefix_stats;

void moeq_engine_get_prefix_stats(const moeq_engine *engine, moeq_engine_prefix_stats *stats);

typedef struct moeq_step_item {
    int seq_id;
    const int32_t *tokens;  /* appended at positions seq_len .. seq_len+n_tokens-1 */
    int n_tokens;
    int all_logits;         /* 0: logits of the last token only; 1: of every token */
} moeq_step_item;

/*
 * Run one forward step over all items. logits receives, item after item,
 * 1 or n_tokens rows (all_logits) of vocab_size floats; logits_rows is its
 * capacity in rows. Fails with MOEQ_ERR_LIMIT (nothing appended) when the
 * cache or step size would overflow.
 */
moeq_err moeq_engine_step(moeq_engine *engine, const moeq_step_item *items, int n_items, float *logits,
                          size_t logits_rows, char *errstr, size_t errstr_size);

/*
 * moeq_engine_step plus the main model's last hidden state (after the final
 * norm: what the MTP module takes) of every logits row: hidden receives
 * hidden_size floats per logits row, in the same order; hidden_rows is its
 * capacity. hidden may be NULL (then this is moeq_engine_step).
 */
moeq_err moeq_engine_step_hidden(moeq_engine *engine, const moeq_step_item *items, int n_items, float *logits,
                                 size_t logits_rows, float *hidden, size_t hidden_rows, char *errstr,
                                 size_t errstr_size);

/* ---- logits records: the lm_head's rows reduced where they are computed ------ */

/*
 * A device backend (not host_visible) computes the logits in its own memory;
 * bringing every row back costs vocab_size floats per row (517 KB for
 * DeepSeek-V3's 129 280). A record is what the samplers read of a row, a few
 * hundred bytes: greedy, temperature / top-k / top-p draws and the MTP argmax
 * are decided from it exactly whenever it suffices (moeq_sampler_sample_record),
 * and the engine brings the whole row only where it does not (docs/CUDA.md).
 * MOEQ_LOGITS_TOP candidates: every top_k up to 64 (HF's default 50), top_logprobs
 * (at most 20) and, in practice, the top-p nucleus and most temperature draws.
 */
#define MOEQ_LOGITS_TOP 64

typedef struct moeq_logits_record {
    int32_t argmax;      /* moeq_sampler_argmax of the row: the lowest id of the highest value (NaNs skipped;
                            0 when the row starts with a NaN)                                               */
    int32_t finite;      /* 1 when every value is finite (the sampler's check: else it gives -1)             */
    float max;           /* row[argmax]                                                                      */
    int32_t n_top;       /* min(MOEQ_LOGITS_TOP, vocab_size); 0 in the CPU's screened records (argmax, finite
                            and max only, no sums: rows read for their argmax alone; docs/ENGINE.md)          */
    double temperature;  /* what sum_t was taken at; <= 0: no sum_t                                          */
    double sum_t;        /* finite rows, temperature > 0: the sum over the row of
                            (float)exp(((double)x - max) * (1.0 / temperature)), in double, in the
                            backend's order (another order differs within moeq_logits_sum_bound); else 0     */
    double sum_1;        /* finite rows: the sum of exp((double)x - max) (log-sum-exp: max + log(sum_1)); else 0 */
    int32_t top_id[MOEQ_LOGITS_TOP];  /* the n_top best ids: value descending, id ascending on ties, NaN below -inf */
    float top_logit[MOEQ_LOGITS_TOP]; /* their values                                                        */
} moeq_logits_record;

/* How far two summation orders of sum_t (or sum_1) over vocab terms can be apart, the device's exp
 * included (one float ulp per term, the double rounding of each order): the margin the sampler decides with. */
double moeq_logits_sum_bound(double sum, int64_t vocab);
/* The same for sum_1, whose terms are doubles (no float rounding): two exps a few double ulps apart. */
double moeq_logits_sum1_bound(double sum_1, int64_t vocab);

/*
 * The log-probabilities the worker's logprobs record (worker/decode_proc.c: (float)((double)x - lse), lse =
 * max + log(the sum of exp(x - max)) over the row) of token and of the k best ids (k <= rec->n_top: those
 * are rec's first k), from rec alone: 0, or MOEQ_SAMPLE_INSUFFICIENT when token is not among rec's
 * candidates, k > n_top, the row is not finite, or a value's float rounding is not the same at both ends of
 * sum_1's bound (the row is needed). Not yet used by the worker (its logprobs run in the sampler hook).
 */
int moeq_logits_record_logprobs(const moeq_logits_record *rec, int64_t vocab, int32_t token, int k,
                                float *token_logprob, int32_t *top_ids, float *top_logprobs);

/* One logits row's reader in a step (moeq_step_out.use). */
typedef struct moeq_row_use {
    moeq_sampler *sampler; /* the sampler whose draw reads this row (borrowed for the call), or NULL: the
                              caller reads only the record (argmax, finite)                                 */
    int draw;              /* which of its draws reads it: 0 = its next, 1 = the one after, ...             */
    int full;              /* 1: the whole row, whatever the record says (rejection sampling, a hook's draft) */
} moeq_row_use;

/*
 * Where a step's logits go (moeq_engine_step_out, moeq_engine_mtp_step_out).
 * records NULL: every row whole into logits (moeq_engine_step's behaviour).
 * Otherwise, on a backend whose memory the host reads (the CPU): every row
 * whole, have_row[r] = 1, records untouched (the caller samples the rows, as
 * before), except the main head's rows read only for their argmax (use NULL,
 * or use[r] without sampler or with a greedy one without a hook, and not
 * full) when head_screen = auto applies: those get a record with the whole
 * row's argmax and max, n_top 0 (the screened head, docs/ENGINE.md), and
 * have_row[r] = 0 unless the screen could not decide (then the row whole).
 * On any other backend: records[r] for every row, and row r whole
 * (have_row[r] = 1) only when use[r].full, or use[r].sampler's draw
 * use[r].draw cannot be decided by the record (moeq_sampler_record_decides;
 * a sampler with a hook never can: processors read the whole row); use NULL:
 * records only. Rows not brought are left as they were.
 */
typedef struct moeq_step_out {
    float *logits;               /* logits_rows rows of vocab_size floats                                   */
    size_t logits_rows;
    moeq_logits_record *records; /* logits_rows records, or NULL                                           */
    const moeq_row_use *use;     /* one per row, or NULL                                                    */
    uint8_t *have_row;           /* out, one per row (required with records)                                */
} moeq_step_out;

/* moeq_engine_step with its logits as out says. */
moeq_err moeq_engine_step_out(moeq_engine *engine, const moeq_step_item *items, int n_items,
                              const moeq_step_out *out, char *errstr, size_t errstr_size);

/*
 * The screened head's work so far (engine key head_screen; docs/ENGINE.md): rows decided as records from the
 * int8 copy, the candidates those rows computed on the exact path, rows it could not decide (computed
 * whole instead), rows whose first pass (hi codes alone) left more than 64 candidates and took the second
 * (the split codes on those), the bytes the screen holds (0: none made: off, not applicable, or no such row
 * yet) and those of the head it stands in for (a screened row reads the copy instead: a roofline counts the
 * copy's bytes); state says in words which: "on", "not yet used", or why not (head_screen = off, a device,
 * batch_invariant = false, no int8 kernels, or the copy's failure: out of memory).
 */
typedef struct moeq_head_screen_stats {
    int64_t rows, candidates, fallbacks, refined;
    size_t bytes, head_bytes;
    const char *state; /* borrowed from the engine: valid while it lives */
} moeq_head_screen_stats;
moeq_head_screen_stats moeq_engine_head_screen_stats(const moeq_engine *engine);

/* 1 when the engine's rows come back as records (its backend is not host_visible): a caller may then plan
 * for rows it will not have. */
int moeq_engine_logits_on_device(const moeq_engine *engine);

/* ---- a rank of an expert-parallel group (docs/EP.md) ------------------------ */

/*
 * The ep handle's shape for this engine: base (transport, rank, n_ranks,
 * payload, timeout_ms) with n_experts, hidden and top_k from the model and
 * max_tokens = max_step_tokens. INVALID_ARG when the model has no routed
 * experts.
 */
moeq_err moeq_engine_ep_params(const moeq_engine *engine, const moeq_ep_params *base, moeq_ep_params *out,
                               char *errstr, size_t errstr_size);

/*
 * Make this engine rank params->rank of its group: every MoE layer then
 * exchanges through ep (borrowed: it must outlive the engine's steps; made
 * with moeq_engine_ep_params), runs only the experts ep's placement gives
 * this rank and gives back what the others' experts held (the CPU: their
 * pages; a device backend: their device memory, which with expert_weights =
 * group it never took; dense weights, attention and shared experts stay on
 * every rank). Call once, before any
 * sequence. MTP stays on: the MTP layers run whole on every rank (their
 * experts are held by all), so drafts exchange nothing and a speculative
 * round's verify step is the rank's one main step of the tick. From then on every step is a
 * collective: each rank calls moeq_engine_step once per tick, with n_items = 0
 * when it has nothing (an empty step still serves the others' rows); a step
 * that fails its checks still takes part, then returns the error. An exchange
 * failure (a rank died or was silent for ep.timeout_ms) fails the step with
 * TIMEOUT or IO naming the rank; the engine's results are then void and
 * every later step fails the same way.
 */
moeq_err moeq_engine_join_group(moeq_engine *engine, moeq_ep *ep, const moeq_ep_params *params, char *errstr,
                                size_t errstr_size);

/*
 * Main forward passes run so far, a group's empty steps included. A group's
 * lockstep needs exactly one per rank and tick: a caller whose step failed
 * (e.g. a speculative round refused before its verify step) runs an empty step
 * when this did not move.
 */
int64_t moeq_engine_main_steps(const moeq_engine *engine);

/* 1 when the engine is a rank of a group (moeq_engine_join_group). */
int moeq_engine_in_group(const moeq_engine *engine);

/*
 * The main layers' routed experts this engine's backend holds: *held (layer, expert) pairs of *total, and
 * *bytes their weights (F8 scales included). Every one once mapped outside a group; a rank's own (its
 * placement's, replicas included) in a group; none while expert_weights = group waits for its join.
 */
void moeq_engine_expert_residency(const moeq_engine *engine, int64_t *held, int64_t *total, size_t *bytes);

/*
 * The load each routed expert has seen since the engine was made: counts[l *
 * n_experts + x] = slots of this engine's tokens that layer l's router sent to
 * expert x (prefill, decode and MTP verification tokens alike; in a group,
 * this rank's tokens only, so the ranks' tables add up to the group's). l is
 * the model's layer index (dense layers' rows stay 0); MTP layers follow the
 * main ones. The table is the engine's (valid for its life, updated by each
 * step: read it between steps; on a device backend the counts stay on the
 * device and each call brings them back: call again to refresh). NULL, with *n_layers = *n_experts = 0, when
 * the model has no routed experts. What `moeq ep-plan --stats` plans from
 * (docs/EP.md "Measuring the load").
 */
const uint64_t *moeq_engine_expert_counts(const moeq_engine *engine, int *n_layers, int *n_experts);

/* MOEQ_OK, or the group's first exchange failure (TIMEOUT / IO naming the rank): a failed group, not a refused step. */
moeq_err moeq_engine_group_status(const moeq_engine *engine, char *errstr, size_t errstr_size);

/* ---- multi-token prediction (speculative decoding; docs/MTP.md) ----------- */

/* Most draft tokens per sequence and round. */
#define MOEQ_MTP_MAX_K 8

/* 1 when the model's MTP layer was loaded (the engine can draft), else 0. */
int moeq_engine_mtp_available(const moeq_engine *engine);

/*
 * Mark a new sequence (seq_len 0) as speculative: every step then also keeps
 * what the MTP layer's own cache needs (the main hidden rows and tokens of
 * its new positions); the MTP entries they feed are computed by the next
 * draft, in the same pass as the draft (or by a later step when more than
 * MOEQ_MTP_MAX_K are pending). INVALID_ARG when the sequence already has
 * tokens, UNSUPPORTED without an MTP layer. seq_free clears the mark. The
 * first mark of an engine with mtp_draft = f8 or e4m3 makes the 8-bit copies drafts use
 * (NOMEM when their memory cannot be had: the sequence stays unmarked).
 */
moeq_err moeq_engine_seq_set_mtp(moeq_engine *engine, int seq_id, int on);

/*
 * Entries in the sequence's MTP cache (position i: from main hidden h_i and token i+1), counting the pending
 * ones not yet computed: seq_len - 1 after a step, more after drafts; -1 when not alive.
 */
int moeq_engine_mtp_seq_len(const moeq_engine *engine, int seq_id);

typedef struct moeq_mtp_item {
    int seq_id;
    int32_t token;  /* the token after the MTP position: the pending (sampled, not yet cached) token on
                       the first call of a round, then the previous draft */
} moeq_mtp_item;

/*
 * Run the MTP module one position further for each item, all in one batch,
 * and write one row of draft logits (vocab_size floats) per item. The first
 * call after a main step works at position seq_len - 1
 * from the main model's hidden state there; each further call continues the
 * chain from the MTP module's own output hidden state (as vLLM chains one
 * MTP layer). The first call also computes the sequence's pending entries
 * (one batch; split into passes of at most max_step_tokens rows, whole
 * sequences each). Draft entries are dropped by the sequence's next main
 * step (except the first, kept when that step appends the token it was
 * drafted with) or by moeq_engine_seq_truncate. INVALID_ARG when the sequence has no MTP
 * state at that position (not marked with moeq_engine_seq_set_mtp, or
 * truncated below its last step), LIMIT when the MTP cache is full. Nothing changes on error.
 */
moeq_err moeq_engine_mtp_step(moeq_engine *engine, const moeq_mtp_item *items, int n_items, float *logits,
                              size_t logits_rows, char *errstr, size_t errstr_size);

/* moeq_engine_mtp_step with its draft logits as out says (moeq_step_out): greedy drafts need records only. */
moeq_err moeq_engine_mtp_step_out(moeq_engine *engine, const moeq_mtp_item *items, int n_items,
                                  const moeq_step_out *out, char *errstr, size_t errstr_size);

/* ---- sampling ------------------------------------------------------------- */

typedef struct moeq_sampling_params {
    double temperature;   /* 0 = greedy (default 0)                        */
    int top_k;            /* 0 = off                                       */
    double top_p;         /* 1.0 = off                                     */
    uint64_t seed;        /* per sequence; same seed, same tokens          */
} moeq_sampling_params;

moeq_sampling_params moeq_sampling_default_params(void);

moeq_err moeq_sampler_new(const moeq_sampling_params *params, int vocab_size, moeq_sampler **out);
void moeq_sampler_destroy(moeq_sampler *sampler);
/* Pick the next token from one row of logits. Deterministic given the seed and call count; every call is
 * one draw (also greedy ones). Returns -1 when the row holds a non-finite value (NaN or inf: broken weights
 * or an overflow), never a token chosen from it; the sequence cannot go on. Not thread-safe per sampler. */
int32_t moeq_sampler_sample(moeq_sampler *sampler, const float *logits);

/*
 * A per-sequence logits processor (structured output, penalties, logprobs;
 * worker/decode_proc.c): when set, each moeq_sampler_sample copies the row
 * into the sampler's own buffer, calls process(ctx, raw, work) to change
 * the copy (masks set -inf, penalties), draws from the copy, then calls
 * accept(ctx, raw, token) with the model's unchanged row. process must
 * leave at least one finite logit. Because every draw goes through the hook
 * in order, a stateful processor sees exactly the emitted tokens, also in
 * speculative exact mode (a draft the processor forbids can never equal the
 * draw, so it is rejected like any other). NULL hook: off. The hook is
 * copied; ctx is borrowed for the sampler's life.
 */
typedef struct moeq_sampler_hook {
    void *ctx;
    void (*process)(void *ctx, const float *raw, float *work, int vocab);
    void (*accept)(void *ctx, const float *raw, int32_t token);
    /* Optional (NULL: argmax): speculative exact mode's draft from an MTP row, given the n_prefix drafts
     * already made this round after the last draw — e.g. the best token the grammar allows there. It
     * only moves acceptance: the output is the draws' either way. */
    int32_t (*draft)(void *ctx, const float *draft_row, int vocab, const int32_t *prefix, int n_prefix);
} moeq_sampler_hook;
void moeq_sampler_set_hook(moeq_sampler *sampler, const moeq_sampler_hook *hook);

/* moeq_sampler_sample_record: the record cannot decide this draw exactly; the caller samples the whole row. */
#define MOEQ_SAMPLE_INSUFFICIENT (-2)

/*
 * The token moeq_sampler_sample would draw from the row rec summarises,
 * decided from rec alone: the same token and the same draw count, or
 * MOEQ_SAMPLE_INSUFFICIENT with no draw used. -1 (one draw used) when the
 * row holds a non-finite value. Insufficient: a hook (processors read the
 * row); top_k above rec->n_top (and below the vocabulary); a top-p or
 * temperature draw that leaves the n_top candidates, or whose decision lies
 * within moeq_logits_sum_bound of sum_t; sum_t taken at another
 * temperature. Greedy is always decided.
 */
int32_t moeq_sampler_sample_record(moeq_sampler *sampler, const moeq_logits_record *rec);

/* 1 when moeq_sampler_sample_record would decide the draw `ahead` draws after the next one from rec (it
 * does not draw). A pure function of the sampler's state and rec: the engine asks it to choose the rows it
 * brings whole. */
int moeq_sampler_record_decides(const moeq_sampler *sampler, const moeq_logits_record *rec, int ahead);

/* A step row's draw: moeq_sampler_sample(row) when the row was brought (row not NULL), else from rec. */
int32_t moeq_sampler_sample_out(moeq_sampler *sampler, const moeq_logits_record *rec, const float *row);

/* The temperature the sampler draws at (what the engine takes sum_t at). */
double moeq_sampler_temperature(const moeq_sampler *sampler);

/* ---- speculative decoding with the MTP module (batched; docs/MTP.md) ------- */

/*
 * One speculative sequence, plain data owned by the caller. Before the first
 * round: the sequence was marked with moeq_engine_seq_set_mtp, its prompt stepped, and next_token sampled from its
 * last logits (it is output already, but not yet in the cache).
 *
 * Two ways to sample (temperature > 0):
 *  - sampler == NULL: rejection mode. Drafts are sampled, then speculative
 *    rejection sampling; the output is equal in distribution to plain
 *    sampling with `sampling`, not token for token. `draws` is the counter.
 *  - sampler set: exact mode. The sequence's own moeq_sampler (the one that
 *    sampled next_token; `sampling` and `draws` are then unused for
 *    choosing tokens): drafts are greedy, each verify row in order gets one
 *    moeq_sampler_sample draw, kept while it equals the draft; the first
 *    differing draw (or the bonus row's) ends the round. The sampler makes
 *    exactly one draw per emitted token, so the tokens are those of plain
 *    decoding with that sampler, token for token. Greedy samplers give
 *    greedy output in either mode.
 */
typedef struct moeq_spec_seq {
    int seq_id;
    int32_t next_token;              /* in/out: the last output token, not yet cached             */
    int k;                           /* in: drafts this round, 0..max_k (0 = one plain decode step) */
    moeq_sampling_params sampling;   /* in: greedy when temperature == 0                          */
    uint64_t draws;                  /* in/out: random draws used (counter-based, per sequence);
                                        rejection mode only                                       */
    moeq_sampler *sampler;           /* in, optional, borrowed for the call: exact mode (below)   */
    int32_t out[MOEQ_MTP_MAX_K + 1]; /* out: new tokens: the accepted drafts, then the main model's */
    int n_out;                       /* out: 1..k+1                                               */
    int64_t drafted, accepted;       /* in/out: running totals                                    */
    int numerical_error;             /* out: 1 when a verify row the round read held a non-finite
                                        value: n_out is 0, nothing was appended, the sequence must
                                        end (moeq_engine_seq_nonfinite_layer may say where)        */
} moeq_spec_seq;

typedef struct moeq_mtp_decoder moeq_mtp_decoder;

/* Buffers for rounds of up to max_seqs sequences and max_k drafts each (sized here, reused). */
moeq_err moeq_mtp_decoder_new(moeq_engine *engine, int max_seqs, int max_k, moeq_mtp_decoder **out, char *errstr,
                              size_t errstr_size);
void moeq_mtp_decoder_destroy(moeq_mtp_decoder *decoder); /* NULL is safe */
/* Wall time of the last round's draft passes (the MTP layer's, before its verify step), ns; 0 when it drafted
 * nothing. A scheduler that chooses k by cost (the worker's mtp_k = auto) measures drafts apart with it. */
int64_t moeq_mtp_decoder_last_draft_ns(const moeq_mtp_decoder *decoder);

/*
 * One round for every sequence, batched: chain the MTP module k times
 * (drafts), verify [next_token, drafts] in one main-model step with all
 * logits, accept the longest agreeing prefix plus one token of the main
 * model (greedy: on equality; sampling: speculative rejection sampling, so
 * the output distribution is exactly the model's; exact mode: the
 * sequence's sampler's draws, so the tokens are plain decoding's), and roll
 * both caches back to the accepted tokens. Sequences may each accept a
 * different number of tokens. Errors leave the caches as before the round (LIMIT: the step did
 * not fit; retry with fewer sequences or smaller k).
 */
moeq_err moeq_mtp_decode_step(moeq_mtp_decoder *decoder, moeq_spec_seq *seqs, int n_seqs, char *errstr,
                              size_t errstr_size);

/*
 * moeq_mtp_decode_step whose verify step also runs ordinary items of other
 * sequences (prefill chunks, plain decode tokens; all_logits 0, at most the
 * engine's max_seqs): one pass over the weights instead of a step of their
 * own plus the round's. Their last-token logits go to extra_logits, item
 * after item (extra_rows: its capacity in rows), bit-identical to what
 * moeq_engine_step would give. With n_seqs 0 this is moeq_engine_step.
 * On error nothing is appended to any sequence.
 */
moeq_err moeq_mtp_decode_step_with(moeq_mtp_decoder *decoder, moeq_spec_seq *seqs, int n_seqs,
                                   const moeq_step_item *extra, int n_extra, float *extra_logits, size_t extra_rows,
                                   char *errstr, size_t errstr_size);

/*
 * moeq_mtp_decode_step_with whose ordinary items' rows go as extra_out says
 * (moeq_step_out, its rows and records counted from 0; use may name each
 * item's sampler): on a device, records, and rows only where needed. The
 * round's own rows follow the same rule (greedy: records only; exact mode:
 * the rows its sampler's draws cannot take from the record).
 */
moeq_err moeq_mtp_decode_step_out(moeq_mtp_decoder *decoder, moeq_spec_seq *seqs, int n_seqs,
                                  const moeq_step_item *extra, int n_extra, const moeq_step_out *extra_out,
                                  char *errstr, size_t errstr_size);

/* ---- generation (convenience over engine + sampler, used by `moeq generate`) */

typedef struct moeq_generate_stats {
    int64_t drafted, accepted;    /* MTP draft tokens proposed / accepted (0 without mtp_k) */
    int64_t rounds;               /* main-model decode steps                                */
} moeq_generate_stats;

typedef struct moeq_generate_params {
    moeq_sampling_params sampling;
    int max_new_tokens;            /* default 64                                  */
    const int32_t *stop_ids;       /* generation ends after any of these          */
    int n_stop_ids;
    int mtp_k;                     /* MTP drafts per round, 0 = off (default), 1..MOEQ_MTP_MAX_K;
                                      the output is the same tokens as without (exact mode) */
    int mtp_rejection;             /* sampling with mtp_k: 0 = exact mode (default: the plain
                                      sampler's tokens, as the worker gives), 1 = speculative
                                      rejection sampling (the same distribution, other tokens) */
    moeq_generate_stats *stats;    /* optional out                                 */
    const moeq_sampler_hook *hook; /* optional logits processor for every draw (structured output:
                                      worker/decode_proc.h); not with mtp_rejection */
} moeq_generate_params;

/* Generate for one prompt; *out (malloc'd, caller frees) receives the new ids. */
moeq_err moeq_generate(moeq_engine *engine, const int32_t *prompt, int n_prompt, const moeq_generate_params *params,
                       int32_t **out, int *n_out, char *errstr, size_t errstr_size);

#ifdef __cplusplus
}
#endif
#endif
