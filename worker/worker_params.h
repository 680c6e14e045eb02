/*
 * worker_params.h — the worker's configuration: the params struct, its
 * property table and the pure helpers over it (worker_params.c). Apart from
 * worker.h so that the worker's modules that need only the configuration
 * (worker_io.c, the Redis side) do not include the shell's header, which
 * includes theirs.
 */
#ifndef MOEQ_WORKER_PARAMS_H
#define MOEQ_WORKER_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "moeq/config.h"
#include "moeq/err.h"
#include "moeq/ep.h"
#include "moeq/job.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moeq_worker_params {
    char model[512];              /* model directory (config.json, safetensors, tokenizer)       */
    char worker_id[128];          /* consumer name and heartbeat key; "" = hostname-pid          */
    char kafka_brokers[512];      /* bootstrap servers                                          */
    char redis_url[512];          /* redis://host:port[/db] or host:port                          */
    char redis_prefix[64];        /* keys: <prefix>:batches:p0..p3, <prefix>:job:<id>, <prefix>:worker:<id> */
    char group[64];               /* consumer group shared by all workers                         */
    char results_topic[256];      /* default results topic (jobs without reply_to)               */
    char results_allowed_topics[1024]; /* comma-separated topics a reply_to may name (the coordinator's key);
                                     "" = results_topic only; old name allowed_topics                */
    char dlq_topic[256];          /* dead-letter topic                                            */
    int64_t visibility_timeout_ms;/* a batch pending this long on a silent worker is reclaimed    */
    int64_t max_deliveries;       /* dead-letter a batch delivered more often than this            */
    int64_t max_seqs;             /* sequences in the engine at once                               */
    int64_t max_step_tokens;      /* tokens per engine step                                        */
    int64_t kv_cache_tokens;      /* KV cache capacity in tokens                                   */
    int64_t n_threads;            /* engine compute threads; 0 = all cores                         */
    char backend[16];             /* engine backend by name: cpu | cuda (a build with CUDA)         */
    int64_t device;               /* device ordinal for backend cuda (one worker process per GPU)   */
    int64_t kv_block_tokens;      /* tokens per KV cache block (the engine's)                      */
    char cuda_graphs[8];          /* the engine's cuda_graphs: off | auto | on                      */
    char cuda_matrix[8];          /* the engine's cuda_matrix: lanes | auto                         */
    char mtp_draft[8];            /* the engine's mtp_draft: f8 | exact                             */
    char cpu_matrix[8];           /* the engine's cpu_matrix: auto | lanes | amx                     */
    char head_screen[8];          /* the engine's head_screen: auto | off                            */
    char cpu_prefetch[8];         /* the engine's cpu_prefetch: auto | l1 | l2                       */
    char cpu_f8_widen[8];         /* the engine's cpu_f8_widen: auto | f16 | f32                     */
    char cpu_k_blocked[8];        /* the engine's cpu_k_blocked: auto | on | off                     */
    int64_t max_batches_held;     /* batches taken and not yet acknowledged, at most                */
    int64_t block_ms;             /* XREADGROUP BLOCK when idle                                     */
    int64_t heartbeat_interval_ms;/* heartbeat period; the key's TTL is 3 periods                  */
    int64_t cancel_poll_ms;       /* how often running jobs' records are checked for cancellation  */
    int64_t drain_timeout_ms;     /* on SIGTERM: finish held batches within this, else hand back    */
    int64_t http_port;            /* /metrics, /livez, /readyz, /healthz; 0 = ephemeral (logged), -1 = off;
                                     9465; old name metrics_port                                    */
    char http_addr[64];           /* IPv4 bind address of that endpoint; "0.0.0.0"                  */
    int64_t livez_stall_ms;       /* /livez fails when the loop has not ticked for this long          */
    char log_level[16];           /* debug | info | warn | error (the coordinator's key)             */
    int64_t dedupe_window_s;      /* TTL set on a job record when marked done (the dedupe window, as
                                     the coordinator's key of the same name), s; 0 = keep; 604800 */
    int64_t mtp_k;                /* MTP drafts per speculative round for jobs with mtp on;
                                     0 = off; used only when the model has an MTP layer; [0, 3];
                                     MOEQ_PROP_AUTO (`auto`, the default): chosen per job and step
                                     (mtp_auto.h)                                                   */
    int64_t mtp_max_batch;        /* rounds only while at most this many sequences decode; 0 = always;
                                     MOEQ_PROP_AUTO: 16 with a fixed mtp_k, 0 with mtp_k auto          */
    int64_t prefix_share_min;     /* a new job forks a running job's cached prompt prefix when they
                                     share at least this many tokens; 0 = never                     */
    int prefix_cache;             /* 1: the engine's prefix cache serves every job (docs/PREFIX_CACHE.md) */
    char kv_admission[8];         /* shared: admit by the engine's blocks, shared ones once; whole: every
                                     job's whole length reserved (docs/WORKER.md)                     */
    double prefix_cache_share;    /* most of the KV pool cached blocks no job uses may hold, 0..1     */
    int prefix_affinity;          /* 1: hand a fresh batch whose prefix key a live peer advertises
                                     (and this worker does not hold) to that peer                     */
    int64_t grammar_cache_entries; /* compiled response_formats kept (LRU, by content); 64          */
    int64_t grammar_cache_bytes;   /* the most memory they may hold; 1 GiB (0 = no bound)           */
    int64_t grammar_max_nfa_states; /* one response_format's automaton; 200000                      */
    int64_t grammar_max_dfa_states; /* DFA states one grammar may reach (1 KiB each + a 16 KiB mask
                                      when used, at DeepSeek's vocabulary); 20000                   */
    int64_t grammar_max_string_chars; /* largest minLength/maxLength of a string; 4096               */
    int64_t grammar_max_recursion; /* levels a recursive schema nests below its first; 0 refuses; 4  */
    double mtp_min_acceptance;    /* a job pauses drafting while its acceptance is below this;
                                     -1 = auto (1.5 x a draft's share of a step's weight bytes)     */
    moeq_job_limits limits;       /* the job codec's limits, the coordinator's keys (max_job_bytes, ...) */
    int64_t max_model_len;        /* context: prompt + max_new_tokens per job, at most; 0 = the model's
                                     max_position_embeddings (never more)                           */
    int check_weights;            /* 1: scan every tensor for non-finite values at start-up (reads
                                     every page); refuse to start when one has any                  */
    char expert_stats_path[512];  /* where the routed-expert load is written (moeq ep-plan --stats);
                                     "" = not written                                                 */
    int64_t expert_stats_interval_ms; /* how often it is rewritten (and once at exit); 60000         */
    /* An expert-parallel group (docs/EP.md): ep_group "" = no group, this process runs the whole model */
    char ep_group[64];            /* group name: the rendezvous key <redis_prefix>:ep:<group>        */
    char ep_placement[512];       /* placement file (moeq ep-plan); "" = the identity                 */
    int64_t ep_join_timeout_ms;   /* at start, how long a rank waits for the others to join            */
    moeq_ep_params ep;            /* ep.transport, ep.rank, ep.ranks, ep.payload, ep.timeout_ms       */
} moeq_worker_params;

/* The worker's own keys (the field names), without the job limits. */
extern const moeq_prop moeq_worker_props[];

/*
 * The whole table: moeq_worker_props plus moeq_job_limits_props under
 * their own names (the coordinator's), so one file gives both roles the same
 * limits. Built on first use (not thread-safe on that first call).
 */
const moeq_prop *moeq_worker_config_props(void);

/* Defaults from the table. */
moeq_err moeq_worker_default_params(moeq_worker_params *params, char *errstr, size_t errstr_size);

/* Cross-field checks (max_step_tokens >= max_seqs, model set, ...). Message names the key. */
moeq_err moeq_worker_params_check(const moeq_worker_params *params, char *errstr, size_t errstr_size);

/* 1 when topic may receive results: results_topic or an entry of results_allowed_topics. Pure. */
int moeq_worker_topic_allowed(const moeq_worker_params *params, const char *topic);

/* Name of the stream of priority p (0..3) into out. */
void moeq_worker_stream_name(const moeq_worker_params *params, int p, char *out, size_t out_size);

/* Seed for a job without one: FNV-1a 64 of the id (stable across workers and restarts). */
uint64_t moeq_worker_seed_for_id(const char *id, size_t id_len);

#ifdef __cplusplus
}
#endif

#endif
