/*
 * worker_params.c — the worker's property table and the pure helpers over
 * its params (topic allow-list, stream names, default seeds). No I/O.
 */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "moeq/kafka.h"
#include "moeq/log.h"
#include "moeq/redis.h"
#include "worker_params.h"

#define P(field) offsetof(moeq_worker_params, field), sizeof(((moeq_worker_params *)0)->field)

const moeq_prop moeq_worker_props[] = {
    {"model", MOEQ_PROP_STR, P(model), 0, 0, "", "model directory (config.json, *.safetensors, tokenizer.json)"},
    {"worker_id", MOEQ_PROP_STR, P(worker_id), 0, 0, "", "consumer name and heartbeat id; empty = <hostname>-<pid>"},
    {"kafka_brokers", MOEQ_PROP_STR, P(kafka_brokers), 0, 0, MOEQ_KAFKA_BROKERS_DEFAULT,
     "Kafka bootstrap servers, host:port[,host:port...]"},
    {"redis_url", MOEQ_PROP_STR, P(redis_url), 0, 0, MOEQ_REDIS_URL_DEFAULT,
     "Redis: host:port, redis://[user:password@]host:port or unix:/path (the stack of scripts/services.sh)"},
    {"redis_prefix", MOEQ_PROP_STR, P(redis_prefix), 0, 0, "moeq",
     "Redis key prefix (as the coordinator's): <prefix>:batches:p0..p3, <prefix>:job:<id>, <prefix>:worker:<id>"},
    {"group", MOEQ_PROP_STR, P(group), 0, 0, "workers", "consumer group shared by all workers"},
    {"results_topic", MOEQ_PROP_STR, P(results_topic), 0, 0, "moeq.results", "results of jobs without reply_to"},
    {"results_allowed_topics", MOEQ_PROP_STR, P(results_allowed_topics), 0, 0, "",
     "comma-separated topics a job's reply_to may name (results_topic always may); old name allowed_topics"},
    {"dlq_topic", MOEQ_PROP_STR, P(dlq_topic), 0, 0, "moeq.dlq", "dead-letter topic for poison batches"},
    {"visibility_timeout_ms", MOEQ_PROP_INT, P(visibility_timeout_ms), 1000, 86400000, "30000",
     "ms a batch may stay pending on a worker before another reclaims it (XAUTOCLAIM)"},
    {"max_deliveries", MOEQ_PROP_INT, P(max_deliveries), 1, 1000, "3",
     "a batch delivered more often than this is dead-lettered with error results"},
    {"max_seqs", MOEQ_PROP_INT, P(max_seqs), 1, 4096, "32", "sequences the engine runs at once"},
    {"max_step_tokens", MOEQ_PROP_INT, P(max_step_tokens), 1, 1048576, "512", "tokens per engine step (>= max_seqs)"},
    {"kv_cache_tokens", MOEQ_PROP_INT, P(kv_cache_tokens), 16, (double)(1LL << 40), "65536",
     "KV cache capacity in tokens over all sequences"},
    {"n_threads", MOEQ_PROP_INT, P(n_threads), 0, 1024, "0", "engine compute threads; 0 = all cores"},
    {"backend", MOEQ_PROP_STR, P(backend), 0, 0, "cpu",
     "engine backend: cpu, or cuda in a build with CUDA (docs/CUDA.md); cpu-device: the CPU behind a GPU's contract "
     "(the device paths on the CPU, for tests); anything else fails the worker's start"},
    {"device", MOEQ_PROP_INT, P(device), 0, 1024, "0",
     "GPU ordinal for backend = cuda; run one worker process per GPU, each with its own device"},
    {"kv_block_tokens", MOEQ_PROP_INT, P(kv_block_tokens), 1, 1 << 16, "16",
     "tokens per KV cache block (page): the prefix cache shares and keeps whole blocks"},
    {"cuda_graphs", MOEQ_PROP_STR, P(cuda_graphs), 0, 0, "off",
     "the engine's cuda_graphs: off, auto or on (CUDA graphs for decode steps of up to 256 sequences; docs/CUDA.md)"},
    {"cuda_matrix", MOEQ_PROP_STR, P(cuda_matrix), 0, 0, "lanes",
     "the engine's cuda_matrix: lanes (the 16-lane kernels at every size) or auto (two threads a row at <= 8 "
     "tokens, shared-memory tiles past that; not yet run on a device); the same bits either way (docs/CUDA.md)"},
    {"mtp_draft", MOEQ_PROP_STR, P(mtp_draft), 0, 0, "f8",
     "the engine's mtp_draft: f8 (drafts from 8-bit copies of the MTP layer's projections and head, host "
     "backends: int8 rows where the CPU has AVX512-VNNI, else F8 E4M3), e4m3 (F8 E4M3 copies) or exact; the "
     "emitted tokens are the same either way (docs/MTP.md)"},
    {"cpu_matrix", MOEQ_PROP_STR, P(cpu_matrix), 0, 0, "auto",
     "the engine's cpu_matrix: auto (AMX BF16 tiles where the CPU has AMX, else the float32 lanes), lanes (the "
     "same bits on every x86 CPU) or amx (the worker fails to start where there is none); each batch-invariant"},
    {"head_screen", MOEQ_PROP_STR, P(head_screen), 0, 0, "auto",
     "the engine's head_screen: auto (a greedy row's token from the lm_head's int8 copy and a proven error bound, "
     "then its few candidates exactly: the same token and value) or off (every row whole)"},
    {"cpu_prefetch", MOEQ_PROP_STR, P(cpu_prefetch), 0, 0, "auto",
     "the engine's cpu_prefetch: auto, l1 or l2 (where the CPU kernels prefetch their weight streams; the same "
     "bits; bench-engine --tune says which is faster on this host)"},
    {"cpu_f8_widen", MOEQ_PROP_STR, P(cpu_f8_widen), 0, 0, "auto",
     "the engine's cpu_f8_widen: auto, f16 or f32 (how the CPU's few-token tiles widen F8 weights; the same bits)"},
    {"cpu_k_blocked", MOEQ_PROP_STR, P(cpu_k_blocked), 0, 0, "auto",
     "the engine's cpu_k_blocked: auto, on or off (whether CPU products of 5-32 tokens walk K in steps; the same "
     "bits)"},
    {"max_batches_held", MOEQ_PROP_INT, P(max_batches_held), 1, 1024, "4",
     "batches taken and not yet acknowledged, at most"},
    {"block_ms", MOEQ_PROP_INT, P(block_ms), 1, 60000, "200", "XREADGROUP BLOCK when the worker is idle, ms"},
    {"heartbeat_interval_ms", MOEQ_PROP_INT, P(heartbeat_interval_ms), 100, 600000, "2000",
     "heartbeat period, ms; the heartbeat key lives 3 periods"},
    {"cancel_poll_ms", MOEQ_PROP_INT, P(cancel_poll_ms), 10, 600000, "250",
     "how often running jobs' records are checked for cancellation, ms"},
    {"drain_timeout_ms", MOEQ_PROP_INT, P(drain_timeout_ms), 0, 3600000, "20000",
     "on SIGTERM: finish held batches within this, then hand the rest back, ms"},
    {"http_port", MOEQ_PROP_INT, P(http_port), -1, 65535, "9465",
     "port of /metrics, /livez, /readyz and /healthz; 0 = ephemeral (the port is logged), -1 = off; old name "
     "metrics_port"},
    {"http_addr", MOEQ_PROP_STR, P(http_addr), 0, 0, "0.0.0.0", "IPv4 bind address of /metrics and the health routes"},
    {"livez_stall_ms", MOEQ_PROP_INT, P(livez_stall_ms), 1000, 86400000, "60000",
     "/livez fails when the loop has not ticked for this long (an engine step included), ms"},
    {"log_level", MOEQ_PROP_STR, P(log_level), 0, 0, "info", "debug, info, warn or error"},
    {"dedupe_window_s", MOEQ_PROP_INT, P(dedupe_window_s), 0, 31536000, "604800",
     "the dedupe window, one key for every process: a job record (moeq:job:<id>) lives this long after it is "
     "written and again after its job finishes; while it lives, a job with its id is not run again (a "
     "`duplicate` dead letter), s; 0 = forever"},
    {"mtp_k", MOEQ_PROP_INT_AUTO, P(mtp_k), 0, 3, "auto",
     "MTP speculative decoding: draft tokens per round for jobs with mtp on (needs a model with an MTP "
     "layer; output unchanged); 0 = off; auto = 0 to 3 per job and step, whichever gives the most tokens a "
     "second by the job's measured acceptance at each depth and the measured cost of the worker's steps"},
    {"mtp_max_batch", MOEQ_PROP_INT_AUTO, P(mtp_max_batch), 0, 4096, "auto",
     "speculate only while at most this many sequences decode: above it a step is compute bound and a "
     "round costs more than it yields (2 CPU cores, bench-mtp: 1.09x at 8, 0.97x at 32); 0 = always; auto "
     "= 16 with a fixed mtp_k, always with mtp_k = auto (its cost model finds where rounds stop paying)"},
    {"prefix_share_min", MOEQ_PROP_INT, P(prefix_share_min), 0, 1048576, "16",
     "a new job whose prompt starts with at least this many tokens of a running job's prompt (already "
     "prefilled) shares that job's cache for them instead of prefilling them again; 0 = never"},
    {"prefix_cache", MOEQ_PROP_BOOL, P(prefix_cache), 0, 1, "on",
     "prefix cache: full KV cache blocks of finished jobs stay cached, keyed by their tokens, and a new job "
     "whose prompt starts with them takes them instead of prefilling (results bit-identical; "
     "docs/PREFIX_CACHE.md); a running job's blocks are found the same way"},
    {"kv_admission", MOEQ_PROP_STR, P(kv_admission), 0, 0, "shared",
     "how jobs are admitted against the KV cache: shared (by the engine's blocks: what running jobs may still "
     "take plus the new job's whole length less the prompt blocks live sequences hold, so blocks that jobs "
     "share count once) or whole (each job's prompt + max_new_tokens reserved, shared or not; docs/WORKER.md)"},
    {"prefix_cache_share", MOEQ_PROP_DOUBLE, P(prefix_cache_share), 0, 1, "1",
     "most of the KV cache (kv_cache_tokens) that cached blocks no running job uses may hold, 0..1; they "
     "are evicted least recently used first whenever a job needs the room, so 1 costs running jobs nothing"},
    {"prefix_affinity", MOEQ_PROP_BOOL, P(prefix_affinity), 0, 1, "on",
     "advertise the prefix keys of the batches this worker ran (heartbeat) and hand a fresh batch whose key "
     "another live worker advertises, and this one does not, to that worker (XCLAIM: it runs there, or is "
     "reclaimed by any worker after visibility_timeout_ms if that worker is gone); at most one hand-off a batch"},
    {"grammar_cache_entries", MOEQ_PROP_INT, P(grammar_cache_entries), 1, 4096, "64",
     "structured output: compiled response_formats kept, least recently used first out; jobs with the same "
     "schema share one grammar, its automaton and its token masks"},
    {"grammar_cache_bytes", MOEQ_PROP_INT, P(grammar_cache_bytes), 0, 1099511627776, "1073741824",
     "structured output: the most memory the cached grammars may hold (automata and token masks, which grow as "
     "outputs reach new states), least recently used released first; 0 = no bound (grammar_cache_entries "
     "still applies)"},
    {"grammar_max_nfa_states", MOEQ_PROP_INT, P(grammar_max_nfa_states), 1000, 10000000, "200000",
     "structured output: automaton states one response_format may compile to; above it the job gets error "
     "grammar_too_large"},
    {"grammar_max_dfa_states", MOEQ_PROP_INT, P(grammar_max_dfa_states), 100, 1000000, "20000",
     "structured output: DFA states one grammar may reach while generating (each 1 KiB, plus a token mask "
     "of vocab/8 bytes once used); a job that needs more ends with grammar_too_large"},
    {"grammar_max_string_chars", MOEQ_PROP_INT, P(grammar_max_string_chars), 16, 65536, "4096",
     "structured output: the largest minLength/maxLength a JSON Schema string may have (each character position "
     "is a copy of the character's automaton: 13 states, or the pattern's minimal DFA beside a pattern or "
     "format); above it the job gets error grammar_too_large"},
    {"grammar_max_recursion", MOEQ_PROP_INT, P(grammar_max_recursion), 0, 16, "4",
     "structured output: levels a recursive JSON Schema (a $ref back into itself: a tree of sections) may "
     "nest below its first; deeper values are not produced; 0 refuses recursive schemas (unsupported_schema)"},
    {"mtp_min_acceptance", MOEQ_PROP_DOUBLE, P(mtp_min_acceptance), -1, 1, "-1",
     "a job whose last 16 drafts were accepted less often than this decodes plainly for 32 tokens (doubling "
     "while it stays low, up to 1024), then drafts again; -1 = auto: 1.5 x the share of a step's weights one "
     "draft reads (not used with mtp_k = auto, which judges each depth itself); 0 = never pause"},
    {"max_model_len", MOEQ_PROP_INT, P(max_model_len), 0, 1 << 30, "0",
     "context: a job whose prompt + max_new_tokens exceeds it gets error prompt_too_long (as the coordinator "
     "answers); 0 = the model's max_position_embeddings, which it may not exceed"},
    {"check_weights", MOEQ_PROP_BOOL, P(check_weights), 0, 1, "off",
     "scan every weight for NaN/inf (and FP8 values that overflow when scaled) at start-up and refuse to start "
     "on any, naming the tensors (moeq model-info --check-weights); reads every page of the checkpoint"},
    {"expert_stats_path", MOEQ_PROP_STR, P(expert_stats_path), 0, 0, "",
     "file the worker writes the routed-expert load to (slots per layer and expert of its tokens since start; "
     "`moeq ep-plan --stats` reads it, one file per rank of a group summed), every expert_stats_interval_ms and at "
     "exit, atomically (a temporary file renamed); empty = not written (metrics expert_slots_total still count)"},
    {"expert_stats_interval_ms", MOEQ_PROP_INT, P(expert_stats_interval_ms), 1000, 86400000, "60000",
     "how often expert_stats_path is rewritten, ms"},
    {"ep.group", MOEQ_PROP_STR, P(ep_group), 0, 0, "",
     "expert-parallel group this worker is a rank of (docs/EP.md): ep.ranks processes act as one model, each "
     "holding its share of the experts, stepping in lockstep; they meet through Redis (<redis_prefix>:ep:<group>); "
     "empty = no group"},
    {"ep.placement", MOEQ_PROP_STR, P(ep_placement), 0, 0, "",
     "placement file of the group (expert -> rank(s), as `moeq ep-plan` prints); every rank must name the same; "
     "empty = the identity (contiguous blocks)"},
    {"ep.join_timeout_ms", MOEQ_PROP_INT, P(ep_join_timeout_ms), 1000, 86400000, "300000",
     "at start, how long a rank of a group waits for the others to join (their model loads included), ms"},
    MOEQ_PROP_END,
};

#define N_PROPS_MAX 96

const moeq_prop *moeq_worker_config_props(void) {
    static moeq_prop table[N_PROPS_MAX + 1];
    if (table[0].name) return table;
    size_t n = 0;
    moeq_props_append(table, &n, N_PROPS_MAX, moeq_worker_props, 0, 0);
    moeq_props_append(table, &n, N_PROPS_MAX, moeq_job_limits_props, 0, offsetof(moeq_worker_params, limits));
    return moeq_props_append(table, &n, N_PROPS_MAX, moeq_ep_props, 0, offsetof(moeq_worker_params, ep));
}

moeq_err moeq_worker_default_params(moeq_worker_params *params, char *errstr, size_t errstr_size) {
    if (!params) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "NULL params");
    memset(params, 0, sizeof *params);
    return moeq_props_defaults(moeq_worker_config_props(), params, errstr, errstr_size);
}

/* An expert-parallel group needs its name, a rank inside it and a transport between processes. */
static moeq_err check_group(const moeq_worker_params *p, char *errstr, size_t errstr_size) {
    const moeq_ep_params *ep = &p->ep;
    if (!p->ep_group[0]) {
        if (ep->n_ranks > 1)
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "ep.ranks: %d ranks need an ep.group name",
                             ep->n_ranks);
        return MOEQ_OK;
    }
    for (const char *c = p->ep_group; *c; c++) /* it names a Redis key and goes into the heartbeat's JSON */
        if (!isalnum((unsigned char)*c) && !strchr("._:-", *c))
            return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                             "ep.group: '%s' has a '%c'; use letters, digits and . _ : -", p->ep_group, *c);
    if (ep->rank >= ep->n_ranks)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "ep.rank: %d is not below ep.ranks %d", ep->rank,
                         ep->n_ranks);
    if (ep->n_ranks > 1 && strcmp(ep->transport, "local") == 0)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "ep.transport: local joins no other process; a group of %d ranks needs ucx (or nccl)",
                         ep->n_ranks);
    return MOEQ_OK;
}

moeq_err moeq_worker_params_check(const moeq_worker_params *p, char *errstr, size_t errstr_size) {
    if (!p) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "NULL params");
    if (!p->model[0]) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "model: not set");
    if (p->max_step_tokens < p->max_seqs)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "max_step_tokens: %lld is below max_seqs %lld", (long long)p->max_step_tokens,
                         (long long)p->max_seqs);
    moeq_log_level level;
    if (!moeq_log_parse_level(p->log_level, &level))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "log_level: '%s' is not debug, info, warn or error",
                         p->log_level);
    if (!p->redis_prefix[0] || !p->group[0] || !p->results_topic[0])
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "redis_prefix, group and results_topic must not be empty");
    if (p->visibility_timeout_ms < 3 * p->heartbeat_interval_ms)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "visibility_timeout_ms: %lld is shorter than 3 heartbeat intervals (%lld)",
                         (long long)p->visibility_timeout_ms, (long long)(3 * p->heartbeat_interval_ms));
    if (strcmp(p->kv_admission, "shared") && strcmp(p->kv_admission, "whole"))
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "kv_admission: '%s' is neither shared nor whole",
                         p->kv_admission);
    moeq_err err = check_group(p, errstr, errstr_size);
    return err ? err : moeq_job_limits_check(&p->limits, errstr, errstr_size);
}

int moeq_worker_topic_allowed(const moeq_worker_params *params, const char *topic) {
    if (!params || !topic || !*topic) return 0;
    if (strcmp(topic, params->results_topic) == 0) return 1;
    size_t n = strlen(topic);
    const char *s = params->results_allowed_topics;
    while (*s) {
        while (*s == ',' || *s == ' ') s++;
        const char *e = s;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > s && t[-1] == ' ') t--;
        if ((size_t)(t - s) == n && memcmp(s, topic, n) == 0) return 1;
        s = e;
    }
    return 0;
}

void moeq_worker_stream_name(const moeq_worker_params *params, int p, char *out, size_t out_size) {
    snprintf(out, out_size, "%s:batches:p%d", params->redis_prefix, p);
}

uint64_t moeq_worker_seed_for_id(const char *id, size_t id_len) {
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < id_len; i++) {
        h ^= (unsigned char)id[i];
        h *= 1099511628211ULL;
    }
    return h;
}
