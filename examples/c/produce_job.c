/*
 * produce_job.c — a C producer: encode one job with the schemas codec and put
 * it on Kafka, waiting for the broker's acknowledgement.
 *
 *   moeq-example-produce BROKERS TOPIC ID "PROMPT"
 *
 * Producers in other languages do the same with their msgpack library (see
 * examples/python, examples/node, examples/kcat). The job id is the
 * idempotency key: producing the same id twice runs the job once.
 */
#include <stdio.h>
#include <string.h>

#include "moeq/job.h"
#include "moeq/kafka.h"
#include "moeq/wire.h"

static void on_delivery(const moeq_kafka_delivery *d, void *opaque) {
    int *ok = opaque;
    *ok = d->err == MOEQ_OK;
    if (d->err) fprintf(stderr, "delivery failed: %s\n", d->errstr);
    else printf("delivered to %s [%d] at offset %lld\n", d->topic, d->partition, (long long)d->offset);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s BROKERS TOPIC ID PROMPT\n", argv[0]);
        return 2;
    }
    /* The job: plain data, the fields of schemas/job.md. */
    moeq_job job = {0};
    job.version = MOEQ_JOB_VERSION;
    job.id = argv[3];
    job.id_len = strlen(argv[3]);
    job.priority = 1;
    job.input = MOEQ_JOB_INPUT_PROMPT;
    job.prompt = argv[4];
    job.prompt_len = strlen(argv[4]);
    job.max_new_tokens = 64;
    job.temperature = 0.0; /* greedy */
    job.top_p = 1.0;
    job.mtp = 1;

    moeq_buf buf = {0};
    if (moeq_job_encode(&job, MOEQ_WIRE_MSGPACK, &buf) != MOEQ_OK) {
        fprintf(stderr, "encode failed\n");
        return 1;
    }

    char err[512];
    int ok = 0;
    moeq_kafka_producer_params params = {.brokers = argv[1], .on_delivery = on_delivery, .cb_opaque = &ok};
    moeq_kafka_producer *producer = NULL;
    if (moeq_kafka_producer_new(&params, NULL, &producer, err, sizeof err) != MOEQ_OK) {
        fprintf(stderr, "producer: %s\n", err);
        moeq_buf_free(&buf);
        return 1;
    }
    /* The content-type header tells the coordinator the encoding (it can also sniff it). */
    const char *ct = moeq_wire_content_type(MOEQ_WIRE_MSGPACK);
    moeq_kafka_header header = {"content-type", ct, strlen(ct)};
    moeq_kafka_out msg = {.topic = argv[2], .partition = MOEQ_KAFKA_PARTITION_ANY, .key = job.id,
                          .key_len = job.id_len, .value = buf.data, .value_len = buf.len,
                          .headers = &header, .n_headers = 1};
    moeq_err e = moeq_kafka_produce(producer, &msg, err, sizeof err);
    if (e == MOEQ_OK) e = moeq_kafka_producer_flush(producer, 10000, err, sizeof err);
    if (e != MOEQ_OK) fprintf(stderr, "produce: %s\n", err);
    moeq_kafka_producer_destroy(producer);
    moeq_buf_free(&buf);
    return e == MOEQ_OK && ok ? 0 : 1;
}
