/*
 * cmd_submit.c — `moeq submit`: produce a JSONL file of jobs (moeq or OpenAI
 * Batch lines), wait for one result per job, write them in the file's
 * dialect, end with a summary line and an exit code that says how it went.
 * A thin shell: what a line means, what a result becomes, and which exit
 * code a run earns are decided in submit/ (batch_dialect.h, submit_tally.h);
 * here are the files, Kafka and the clock.
 *
 * Results answer this submission: the results (and dead-letter) readers
 * start at the first message produced from shortly before the first job was
 * sent (offsets_for_times), and a result whose job_hash is not the hash of
 * the line sent answers an earlier job with the same id: it is reported as
 * stale and not taken. A `duplicate` dead letter for one of our jobs (its id
 * was already accepted) settles that job at once, reported, not waited for,
 * unless --resume sent it again: then the earlier run's job (same content) is
 * the one to wait for, and the readers start early enough to see its result.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "batch_dialect.h"
#include "cli.h"
#include "moeq/config.h"
#include "moeq/job.h"
#include "moeq/kafka.h"
#include "moeq/log.h"
#include "moeq/result.h"
#include "moeq/util.h"
#include "submit_params.h"
#include "submit_tally.h"

int moeq_cmd_submit(int argc, char **argv);

enum { JOB_WAITING = 0, JOB_DONE, JOB_DUPLICATE };

typedef struct submit_job {
    moeq_submit_line req;          /* id, the job as sent, the OpenAI endpoint and model */
    size_t lineno;                 /* 1-based line of the input file */
    char hash[MOEQ_JOB_HASH_SIZE]; /* moeq_job_content_hash of the job as sent */
    int state;                     /* JOB_* */
    int stale_seen, resent;        /* resent: --resume sends it again (an earlier run may have sent it) */
} submit_job;

typedef struct submit_opts {
    const char *in, *out, *errors;
    int skip_invalid, resume;
} submit_opts;

typedef struct submit_state {
    moeq_submit_params p;
    submit_opts o;
    moeq_dialect dialect;
    submit_job *jobs;              /* file order */
    submit_job **by_id;            /* sorted by id, for lookups */
    size_t n, cap, n_settled, n_acked, n_failed;
    moeq_submit_tally tally;
    moeq_buf invalid;              /* errors-file lines of the skipped input lines */
    char errors_path[1100];
    FILE *out, *errors;
    int64_t since_ms;              /* results produced before this are not read */
    volatile sig_atomic_t stop;
} submit_state;

static submit_state *g_submit;

static void submit_signal(int sig) {
    (void)sig;
    if (g_submit) g_submit->stop = 1;
}

static int cmp_job(const void *a, const void *b) {
    return strcmp((*(submit_job *const *)a)->req.id, (*(submit_job *const *)b)->req.id);
}

/* By id, then line: a repeated id's lines are reported in file order. */
static int cmp_job_line(const void *a, const void *b) {
    int c = cmp_job(a, b);
    if (c) return c;
    size_t la = (*(submit_job *const *)a)->lineno, lb = (*(submit_job *const *)b)->lineno;
    return la < lb ? -1 : la > lb;
}

static submit_job *find_job(submit_state *s, const char *id) {
    submit_job key = {.req.id = (char *)id}, *kp = &key;
    submit_job **hit = s->by_id ? bsearch(&kp, s->by_id, s->n, sizeof *s->by_id, cmp_job) : NULL;
    return hit ? *hit : NULL;
}

static void on_submit_delivery(const moeq_kafka_delivery *d, void *opaque) {
    submit_state *s = opaque;
    if (d->err) {
        if (!s->n_failed)
            fprintf(stderr, "moeq submit: the broker did not take a job: %s\n", d->errstr ? d->errstr : "");
        s->n_failed++;
    } else {
        s->n_acked++;
    }
}

static void progress(const submit_state *s, int64_t t0, int final) {
    if (!isatty(2)) return;
    double el = (double)(moeq_now_ms() - t0) / 1000.0;
    double rate = el > 0 ? (double)s->n_settled / el : 0;
    double eta = rate > 0 ? (double)(s->n - s->n_settled) / rate : 0;
    int width = 30, fill = s->n ? (int)((double)width * (double)s->n_settled / (double)s->n) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r[%s] %zu/%zu  %.1f jobs/s  ETA %.0fs   %s", bar, s->n_settled, s->n, rate, eta,
            final ? "\n" : "");
}

/* ---- the input file ------------------------------------------------------------- */

static int add_job(submit_state *s, moeq_submit_line *req, size_t lineno) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        submit_job *v = realloc(s->jobs, cap * sizeof *v);
        if (!v) return -1;
        s->jobs = v;
        s->cap = cap;
    }
    submit_job *j = &s->jobs[s->n++];
    memset(j, 0, sizeof *j);
    j->req = *req; /* takes ownership */
    j->lineno = lineno;
    moeq_job_content_hash(j->req.job, j->req.job_len, j->hash);
    return 0;
}

/* A bad line: an error (nothing is sent), or with --skip-invalid a line for the errors file. */
static int bad_line(submit_state *s, size_t lineno, moeq_submit_line *req, size_t n_bad) {
    if (n_bad < 20) /* a file of garbage is named by its first lines and counted, not echoed */
        fprintf(stderr, "moeq submit: %s line %zu: %s%s\n", s->o.in, lineno, req->message,
                s->o.skip_invalid ? " (skipped)" : "");
    else if (n_bad == 20)
        fprintf(stderr, "moeq submit: %s: more invalid lines (counted, not shown)\n", s->o.in);
    if (!s->o.skip_invalid) return 1;
    s->tally.invalid++;
    if (moeq_submit_invalid_line(s->dialect, lineno, req, &s->invalid) || moeq_buf_append(&s->invalid, "\n", 1))
        return -1;
    return 0;
}

/* Read every line; returns 0, or -1 after printing why (bad lines without --skip-invalid: each is named). */
static int read_jobs(submit_state *s) {
    FILE *f = strcmp(s->o.in, "-") ? fopen(s->o.in, "r") : stdin;
    if (!f) return fprintf(stderr, "moeq submit: cannot open %s\n", s->o.in), -1;
    char *line = NULL;
    size_t cap = 0, lineno = 0, n_bad = 0;
    ssize_t len;
    int rc = 0, detected = 0;
    while (rc >= 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        if (!detected++) s->dialect = moeq_dialect_detect(line, (size_t)len);
        moeq_submit_line req;
        moeq_err e = moeq_submit_line_parse(s->dialect, line, (size_t)len, &s->p.limits, &req);
        if (e == MOEQ_ERR_NOMEM) rc = -1;
        else if (e) {
            int b = bad_line(s, lineno, &req, n_bad + s->tally.invalid);
            n_bad += b > 0;
            rc = b < 0 ? -1 : 0;
            moeq_submit_line_free(&req);
        } else if (add_job(s, &req, lineno)) {
            moeq_submit_line_free(&req);
            rc = -1;
        }
    }
    free(line);
    if (f != stdin) fclose(f);
    if (rc < 0) fprintf(stderr, "moeq submit: out of memory\n");
    if (n_bad)
        fprintf(stderr, "moeq submit: %s: %zu invalid line%s: nothing was sent (--skip-invalid sends the others)\n",
                s->o.in, n_bad, n_bad > 1 ? "s" : "");
    return rc < 0 || n_bad ? -1 : 0;
}

/* Index the jobs by id; an id on two lines is an error naming them (nothing is sent). */
static int index_jobs(submit_state *s) {
    s->by_id = malloc((s->n ? s->n : 1) * sizeof *s->by_id);
    if (!s->by_id) return fprintf(stderr, "moeq submit: out of memory\n"), -1;
    for (size_t i = 0; i < s->n; i++) s->by_id[i] = &s->jobs[i];
    qsort(s->by_id, s->n, sizeof *s->by_id, cmp_job_line);
    int dups = 0;
    for (size_t i = 0; i < s->n;) {
        size_t k = i + 1;
        while (k < s->n && !strcmp(s->by_id[k]->req.id, s->by_id[i]->req.id)) k++;
        if (k - i > 1) {
            char lines[256];
            int off = 0;
            for (size_t j = i; j < k && off < 200; j++)
                off += snprintf(lines + off, sizeof lines - (size_t)off, "%s%zu", j > i ? ", " : "", s->by_id[j]->lineno);
            fprintf(stderr, "moeq submit: %s: job id '%s' is on lines %s: one id, one job (nothing was sent)\n",
                    s->o.in, s->by_id[i]->req.id, lines);
            dups++;
        }
        i = k;
    }
    return dups ? -1 : 0;
}

/* ---- --resume: what an earlier run wrote ------------------------------------------ */

/* Take the answers of one earlier file; *mtime_ms receives its modification time (0 when absent). */
static void resume_file(submit_state *s, const char *path, int64_t *mtime_ms) {
    struct stat st;
    *mtime_ms = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fstat(fileno(f), &st)) *mtime_ms = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
    char *line = NULL, id[MOEQ_JOB_ID_HARD_MAX + 1];
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        moeq_result_status status;
        if (!len || !moeq_submit_answer_parse(s->dialect, line, (size_t)len, id, sizeof id, &status)) continue;
        submit_job *job = find_job(s, id);
        if (!job || job->state != JOB_WAITING) continue;
        job->state = JOB_DONE;
        s->n_settled++;
        s->tally.by_status[status]++;
        s->tally.resumed++;
    }
    free(line);
    fclose(f);
}

/*
 * Jobs answered in --out (or the errors file) are not sent again. A job an
 * earlier run sent and got no answer for has its result produced after that
 * run last wrote (else it would have written it), so the readers start at
 * the earlier of the two files' modification times, less the clock margin.
 */
static void resume(submit_state *s) {
    int64_t t_out = 0, t_err = 0;
    resume_file(s, s->o.out, &t_out);
    resume_file(s, s->errors_path, &t_err);
    int64_t t = t_out && t_err ? (t_out < t_err ? t_out : t_err) : t_out ? t_out : t_err;
    if (t && t - s->p.clock_skew_s * 1000 < s->since_ms) s->since_ms = t - s->p.clock_skew_s * 1000;
    for (size_t i = 0; i < s->n; i++) s->jobs[i].resent = s->jobs[i].state == JOB_WAITING && t;
    fprintf(stderr, "moeq submit: --resume: %zu of %zu jobs already answered in %s%s\n", s->tally.resumed, s->n,
            s->o.out, t ? "" : " (no earlier output: a fresh run)");
}

/* ---- results -------------------------------------------------------------------- */

static FILE *errors_file(submit_state *s) {
    if (!s->errors) s->errors = fopen(s->errors_path, s->o.resume ? "a" : "w");
    if (!s->errors) fprintf(stderr, "moeq submit: cannot write %s\n", s->errors_path);
    return s->errors;
}

static void write_result(submit_state *s, const void *value, size_t len, const char *ct) {
    moeq_result r;
    char err[256];
    if (moeq_result_decode(value, len, ct, 0, &r, err, sizeof err)) return;
    submit_job *job = find_job(s, r.id);
    if (!job || job->state == JOB_DONE) goto done;
    if (r.job_hash && strcmp(r.job_hash, job->hash)) { /* results of older writers carry no hash: taken */
        if (!job->stale_seen)
            fprintf(stderr, "moeq submit: job %s: skipped a stale result: it answers an earlier job with this id "
                    "(job_hash %s; line %zu sent %s)\n", job->req.id, r.job_hash, job->lineno, job->hash);
        s->tally.stale += !job->stale_seen;
        job->stale_seen = 1;
        goto done;
    }
    if (job->state != JOB_WAITING) goto done;
    job->state = JOB_DONE;
    s->n_settled++;
    s->tally.by_status[r.status < MOEQ_RESULT_STATUS__COUNT ? r.status : MOEQ_RESULT_ERROR]++;
    moeq_buf buf = {0};
    int to_errors = 0;
    if (moeq_submit_result_line(s->dialect, &job->req, &r, job->hash, moeq_now_ms() / 1000, &buf, &to_errors, err,
                                sizeof err) == MOEQ_OK) {
        FILE *f = to_errors ? errors_file(s) : s->out;
        if (f) {
            fwrite(buf.data, 1, buf.len, f);
            fputc('\n', f);
            fflush(f); /* what --resume reads back, should this run be killed */
        }
    } else {
        fprintf(stderr, "moeq submit: job %s: its result could not be written: %s\n", job->req.id, err);
    }
    moeq_buf_free(&buf);
done:
    moeq_result_free(&r);
}

static void header_str(const moeq_kafka_msg *m, const char *name, char *out, size_t n) {
    const void *v = NULL;
    size_t len = 0;
    out[0] = 0;
    if (moeq_kafka_msg_header(m, name, &v, &len) == MOEQ_OK && v)
        snprintf(out, n, "%.*s", (int)(len < n ? len : n - 1), (const char *)v);
}

/*
 * A dead letter: a `duplicate` of one of our jobs (by id, and by hash when it
 * says one) settles it, unless --resume sent it again with the content an
 * earlier run sent: that job's result is the one to wait for.
 */
static void read_dead_letter(submit_state *s, const moeq_kafka_msg *m) {
    char code[32], hash[32], same[16], reason[640], id[MOEQ_JOB_ID_HARD_MAX + 1];
    header_str(m, "moeq-reason-code", code, sizeof code);
    if (strcmp(code, "duplicate")) return; /* other dead letters come with an error result */
    size_t kl = 0;
    const char *k = moeq_kafka_msg_key(m, &kl);
    if (!k || kl > MOEQ_JOB_ID_HARD_MAX) return;
    snprintf(id, sizeof id, "%.*s", (int)kl, k);
    submit_job *job = find_job(s, id);
    header_str(m, "moeq-job-hash", hash, sizeof hash);
    header_str(m, "moeq-duplicate-same-content", same, sizeof same);
    if (!job || job->state != JOB_WAITING || (hash[0] && strcmp(hash, job->hash))) return;
    if (job->resent && !strcmp(same, "true")) {
        job->resent = 0; /* reported once */
        moeq_log(MOEQ_LOG_INFO, "submit", "resume_wait", "id=%s msg=\"an earlier run sent it; waiting for its result\"",
                 id);
        return;
    }
    header_str(m, "moeq-reason", reason, sizeof reason);
    fprintf(stderr, "moeq submit: job %s (line %zu) was not run: %s\n", id, job->lineno, reason);
    job->state = JOB_DUPLICATE;
    s->n_settled++;
    s->tally.not_run++;
}

static void read_result_msg(submit_state *s, const moeq_kafka_msg *m) {
    size_t len = 0;
    const void *v = moeq_kafka_msg_value(m, &len);
    char ct[64];
    header_str(m, "content-type", ct, sizeof ct);
    if (v) write_result(s, v, len, ct[0] ? ct : NULL);
}

/* ---- arguments -------------------------------------------------------------------- */

static void submit_usage(void) {
    printf("usage: moeq submit --in FILE --out FILE [--errors FILE] [--skip-invalid] [--resume]\n"
           "                   [--config FILE] [--key=value ...] [--kafka.<prop>=v] [--print-config]\n\n"
           "Produces each line of FILE (moeq jobs, schemas/job.md, or OpenAI Batch requests,\n"
           "schemas/openai_batch.md: detected from the first line) keyed by its id, waits for\n"
           "one result per id and writes them in the file's dialect: moeq results to --out;\n"
           "OpenAI output lines to --out and the failed requests to the errors file (default\n"
           "--out with .errors.jsonl), as OpenAI's Batch API does. A bad line is an error\n"
           "naming it and nothing is sent; with --skip-invalid the others are sent and the bad\n"
           "ones go to the errors file. An id on two lines is an error before anything is sent.\n"
           "--resume sends only the jobs --out (and the errors file) does not answer yet, and\n"
           "appends. Results are read from shortly before the start (clock_skew_s) and taken\n"
           "only when their job_hash is the hash of the job sent (others are reported stale);\n"
           "a job whose id was already accepted is dead-lettered `duplicate`: reported, not\n"
           "waited for. Ends with one line `moeq submit: summary jobs=N ok=N error=N expired=N\n"
           "cancelled=N not_run=N no_result=N invalid=N resumed=N stale=N seconds=S exit=C`.\n\n"
           "Exit: 0 every job ok; 1 every job settled, some not ok (error, expired, cancelled,\n"
           "not run, invalid lines skipped); 2 usage, configuration or input error (nothing\n"
           "sent); 3 the broker unreachable (within connect_timeout_s) or refusing the jobs;\n"
           "4 some jobs without a result (timeout_s, or interrupted): --resume waits for them.\n\n"
           "--brokers and --topic are short for --kafka_brokers and --job_topic. Keys (file <\n"
           "MOEQ_<KEY> env < flags; kafka.<prop> via MOEQ_KAFKA__<PROP>, e.g.\n"
           "MOEQ_KAFKA__SECURITY__PROTOCOL=SASL_SSL):\n\n");
    moeq_props_print_help(moeq_submit_props(), stdout);
}

static int set_key(moeq_submit_params *p, const char *key, const char *v) {
    char err[512];
    if (moeq_props_set(moeq_submit_props(), p, key, v, err, sizeof err) == MOEQ_OK) return 0;
    fprintf(stderr, "moeq submit: %s\n", err);
    return MOEQ_SUBMIT_EXIT_USAGE;
}

/* What cli_load left: the run's own arguments. Returns 0 or an exit code. */
static int submit_args(int rest, char **argv, submit_state *s) {
    submit_opts *o = &s->o;
    for (int i = 1; i < rest; i++) {
        const char *k = argv[i], *v = i + 1 < rest ? argv[i + 1] : NULL;
        if (!strcmp(k, "--skip-invalid") || !strcmp(k, "--skip_invalid")) {
            o->skip_invalid = 1;
            continue;
        }
        if (!strcmp(k, "--resume")) {
            o->resume = 1;
            continue;
        }
        if (k[0] != '-') return fprintf(stderr, "moeq submit: unexpected argument %s (see --help)\n", k), 2;
        if (!v) return fprintf(stderr, "moeq submit: %s needs a value (see --help)\n", k), 2;
        i++; /* the options below take a value */
        if (!strcmp(k, "--in")) o->in = v;
        else if (!strcmp(k, "--out")) o->out = v;
        else if (!strcmp(k, "--errors")) o->errors = v;
        else if (!strcmp(k, "--brokers")) { if (set_key(&s->p, "kafka_brokers", v)) return 2; }
        else if (!strcmp(k, "--topic")) { if (set_key(&s->p, "job_topic", v)) return 2; }
        else return fprintf(stderr, "moeq submit: unknown option %s (see --help)\n", k), 2;
    }
    if (!o->in || !o->out) return fprintf(stderr, "moeq submit: --in and --out are required (see --help)\n"), 2;
    size_t n = strlen(o->out);
    if (o->errors) snprintf(s->errors_path, sizeof s->errors_path, "%s", o->errors);
    else if (n > 6 && !strcmp(o->out + n - 6, ".jsonl"))
        snprintf(s->errors_path, sizeof s->errors_path, "%.*s.errors.jsonl", (int)(n - 6), o->out);
    else snprintf(s->errors_path, sizeof s->errors_path, "%s.errors.jsonl", o->out);
    char err[512];
    if (moeq_submit_params_check(&s->p, err, sizeof err))
        return fprintf(stderr, "moeq submit: %s\n", err), MOEQ_SUBMIT_EXIT_USAGE;
    return 0;
}

/* ---- Kafka ---------------------------------------------------------------------------- */

static moeq_err open_reader(const submit_state *s, const moeq_kvlist *kafka, const char *topic, const char *role,
                            moeq_kafka_consumer **out, char *err, size_t n) {
    char group[128];
    snprintf(group, sizeof group, "moeq-submit-%s-%d-%lld", role, (int)getpid(), (long long)moeq_now_ms());
    const char *topics[] = {topic};
    moeq_kafka_consumer_params cp = {.brokers = s->p.kafka_brokers, .group_id = group, .client_id = "moeq-submit",
                                     .topics = topics, .n_topics = 1, .start_ms = s->since_ms};
    moeq_kvlist *kv = moeq_kvlist_new(); /* the dead-letter topic may appear only later: notice it soon */
    if (!kv) return moeq_errf(MOEQ_ERR_NOMEM, err, n, "out of memory");
    moeq_kvlist_set(kv, "topic.metadata.refresh.interval.ms", "1000");
    for (size_t i = 0; i < moeq_kvlist_count(kafka); i++) { /* the user's keys win */
        const char *k, *v;
        moeq_kvlist_at(kafka, i, &k, &v);
        moeq_kvlist_set(kv, k, v);
    }
    moeq_err e = moeq_kafka_consumer_new(&cp, kv, out, err, n);
    moeq_kvlist_destroy(kv);
    return e;
}

/*
 * Wait (bounded) until the results reader has partitions, reading what comes
 * meanwhile: results already there (stale ones) are then read before our new
 * jobs can be dead-lettered. Nothing depends on it (readers start at `since`
 * whenever assigned); it only makes the report complete.
 */
static void wait_assigned(submit_state *s, moeq_kafka_consumer *c, int timeout_ms) {
    char err[256];
    for (int64_t end = moeq_now_ms() + timeout_ms; moeq_now_ms() < end;) {
        moeq_kafka_msg *m = NULL;
        moeq_kafka_partition *parts = NULL;
        size_t n = 0;
        if (moeq_kafka_consumer_poll(c, 100, &m, err, sizeof err)) return;
        if (m) read_result_msg(s, m);
        moeq_kafka_msg_destroy(m);
        moeq_kafka_consumer_assignment(c, &parts, &n, err, sizeof err);
        free(parts);
        if (n) return;
    }
}

static moeq_err produce_jobs(submit_state *s, moeq_kafka_producer *producer, char *err, size_t n) {
    moeq_kafka_header h = {"content-type", "application/json", 16};
    moeq_err e = MOEQ_OK;
    for (size_t i = 0; i < s->n && !s->stop && !e; i++) {
        const submit_job *j = &s->jobs[i];
        if (j->state != JOB_WAITING) continue;
        moeq_kafka_out msg = {.topic = s->p.job_topic, .partition = MOEQ_KAFKA_PARTITION_ANY, .key = j->req.id,
                              .key_len = strlen(j->req.id), .value = j->req.job, .value_len = j->req.job_len,
                              .headers = &h, .n_headers = 1};
        while ((e = moeq_kafka_produce(producer, &msg, err, n)) == MOEQ_ERR_TRANSIENT && !s->stop)
            moeq_kafka_producer_poll(producer, 50);
    }
    return e;
}

static void wait_results(submit_state *s, moeq_kafka_consumer *results, moeq_kafka_consumer *dlq, int64_t t0) {
    char err[512];
    int64_t deadline = t0 + s->p.timeout_s * 1000, last = 0;
    while (s->n_settled < s->n && !s->stop && moeq_now_ms() < deadline) {
        moeq_kafka_msg *m = NULL;
        if (moeq_kafka_consumer_poll(results, 100, &m, err, sizeof err)) break;
        if (m) read_result_msg(s, m);
        moeq_kafka_msg_destroy(m);
        m = NULL;
        if (moeq_kafka_consumer_poll(dlq, 0, &m, err, sizeof err)) break;
        if (m) read_dead_letter(s, m);
        moeq_kafka_msg_destroy(m);
        if (moeq_now_ms() - last > 200) {
            progress(s, t0, 0);
            last = moeq_now_ms();
        }
    }
    /* Settled by duplicates before the older results were read: read them (briefly) to report them stale. */
    for (int64_t end = moeq_now_ms() + 1500; s->tally.not_run && !s->stop && moeq_now_ms() < end;) {
        moeq_kafka_msg *m = NULL;
        if (moeq_kafka_consumer_poll(results, 100, &m, err, sizeof err)) break;
        if (m) read_result_msg(s, m);
        moeq_kafka_msg_destroy(m);
    }
    progress(s, t0, 1);
}

/*
 * Send what is waiting and read the results. The broker must answer first
 * (connect_timeout_s): a wrong address or protocol fails in seconds, naming
 * the brokers, rather than after librdkafka's delivery timeout.
 */
static void run_kafka(submit_state *s, const moeq_kvlist *kafka, int64_t t0) {
    char err[512] = "";
    moeq_kafka_producer *producer = NULL;
    moeq_kafka_consumer *results = NULL, *dlq = NULL;
    moeq_kafka_producer_params pp = {.brokers = s->p.kafka_brokers, .client_id = "moeq-submit",
                                     .on_delivery = on_submit_delivery, .cb_opaque = s};
    moeq_err e = moeq_kafka_producer_new(&pp, kafka, &producer, err, sizeof err);
    if (!e && moeq_kafka_producer_ping(producer, (int)s->p.connect_timeout_s * 1000, err, sizeof err)) {
        fprintf(stderr, "moeq submit: kafka broker %s did not answer within %llds (%s): check kafka_brokers and the "
                "kafka.* security keys; nothing was sent\n", s->p.kafka_brokers, (long long)s->p.connect_timeout_s, err);
        s->tally.broker_failed = 1;
        goto done;
    }
    if (!e) e = open_reader(s, kafka, s->p.results_topic, "results", &results, err, sizeof err);
    if (!e) e = open_reader(s, kafka, s->p.dlq_topic, "dlq", &dlq, err, sizeof err);
    if (e) {
        fprintf(stderr, "moeq submit: kafka %s: %s: %s\n", s->p.kafka_brokers, moeq_err_str(e), err);
        s->tally.broker_failed = 1;
        goto done;
    }
    wait_assigned(s, results, 5000);
    e = produce_jobs(s, producer, err, sizeof err);
    if (!e && moeq_kafka_producer_flush(producer, 30000, err, sizeof err)) e = MOEQ_ERR_TIMEOUT;
    if (e || s->n_failed) {
        fprintf(stderr, "moeq submit: kafka %s: %zu of the jobs were not taken by the broker%s%s\n",
                s->p.kafka_brokers, s->n_failed + (e ? moeq_kafka_producer_outq_len(producer) : 0), e ? ": " : "",
                e ? err : "");
        s->tally.broker_failed = 1;
        goto done;
    }
    wait_results(s, results, dlq, t0);
done:
    moeq_kafka_consumer_destroy(results);
    moeq_kafka_consumer_destroy(dlq);
    moeq_kafka_producer_destroy(producer);
}

/* ---- the command ---------------------------------------------------------------------- */

static int open_outputs(submit_state *s) {
    s->out = fopen(s->o.out, s->o.resume ? "a" : "w");
    if (!s->out) return fprintf(stderr, "moeq submit: cannot write %s\n", s->o.out), -1;
    struct stat st; /* --resume: the skipped lines are in the errors file the earlier run wrote */
    int written = s->o.resume && !stat(s->errors_path, &st) && st.st_size > 0;
    if (s->invalid.len && !written &&
        (!errors_file(s) || fwrite(s->invalid.data, 1, s->invalid.len, s->errors) != s->invalid.len))
        return -1;
    return 0;
}

static void finish(submit_state *s, int64_t t0) {
    char line[512];
    moeq_submit_summary(&s->tally, (double)(moeq_now_ms() - t0) / 1000.0, line, sizeof line);
    fprintf(stderr, "moeq submit: %s -> %s%s%s\n", line, s->o.out, s->errors ? ", " : "",
            s->errors ? s->errors_path : "");
}

static void free_state(submit_state *s) {
    if (s->out) fclose(s->out);
    if (s->errors) fclose(s->errors);
    for (size_t i = 0; i < s->n; i++) moeq_submit_line_free(&s->jobs[i].req);
    free(s->jobs);
    free(s->by_id);
    moeq_buf_free(&s->invalid);
}

int moeq_cmd_submit(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return submit_usage(), 0;
    submit_state s = {.p = moeq_submit_default_params()};
    moeq_kvlist *kafka = moeq_kvlist_new(), *redis = moeq_kvlist_new();
    int rest = 0, printed = 0, rc = MOEQ_SUBMIT_EXIT_USAGE;
    char err[512];
    if (!kafka || !redis || moeq_cli_load("submit", moeq_submit_props(), &s.p, kafka, redis, argc, argv, &rest,
                                          &printed))
        goto done;
    if (printed) {
        rc = 0;
        goto done;
    }
    moeq_log_level level;
    if (moeq_log_parse_level(s.p.log_level, &level)) moeq_log_set_level(level);
    if ((rc = submit_args(rest, argv, &s))) goto done;
    rc = MOEQ_SUBMIT_EXIT_USAGE;
    if (moeq_kafka_conf_validate(kafka, MOEQ_KAFKA_PRODUCER, err, sizeof err) ||
        moeq_kafka_conf_validate(kafka, MOEQ_KAFKA_CONSUMER, err, sizeof err)) {
        fprintf(stderr, "moeq submit: %s\n", err);
        goto done;
    }
    int64_t t0 = moeq_now_ms();
    s.since_ms = t0 - s.p.clock_skew_s * 1000;
    if (read_jobs(&s) || index_jobs(&s)) goto done;
    s.tally.jobs = s.n;
    if (s.o.resume) resume(&s);
    if (open_outputs(&s)) goto done;
    g_submit = &s;
    signal(SIGINT, submit_signal);
    signal(SIGTERM, submit_signal);
    if (s.n_settled < s.n) run_kafka(&s, kafka, t0);
    finish(&s, t0);
    rc = moeq_submit_exit_code(&s.tally);
done:
    g_submit = NULL;
    free_state(&s);
    moeq_kvlist_destroy(kafka);
    moeq_kvlist_destroy(redis);
    return rc;
}
