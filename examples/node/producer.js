#!/usr/bin/env node
// Put moeq jobs on Kafka from Node.js (msgpack, the primary encoding).
//
//   node examples/node/producer.js --brokers 127.0.0.1:9092 --topic moeq.jobs --count 3
//
// Needs kafkajs and @msgpack/msgpack (scripts/setup.d/20-node-examples.sh runs
// `npm ci` here). The job format is schemas/job.md; results come back on the
// topic moeq.results (or the job's reply_to), keyed by job id.
'use strict';
const crypto = require('crypto');
const { Kafka, Partitioners, logLevel } = require('kafkajs');
const { encode } = require('@msgpack/msgpack');

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

// Job i: cycles through the three input kinds a job may carry.
function makeJob(i, run) {
  const job = {
    v: 1,                    // format version: always 1
    id: `node-${run}-${i}`,  // producer-chosen idempotency key
    priority: i % 4,         // 0 = highest .. 3
    max_new_tokens: 64,
    temperature: 0.7,
    seed: 2000 + i,          // same seed + same input = same result
    metadata: { source: 'examples/node', n: i }, // echoed back in the result
  };
  if (i % 3 === 0) job.prompt = `Summarise document ${i} in one sentence.`;
  else if (i % 3 === 1) job.messages = [{ role: 'user', content: `What is ${i} squared?` }];
  else job.tokens = [0, 1, 2, 3 + i]; // pre-tokenised input (ids of the served model)
  return job;
}

async function main() {
  const brokers = arg('brokers', process.env.MOEQ_KAFKA_BROKERS || '127.0.0.1:9092').split(',');
  const topic = arg('topic', 'moeq.jobs');
  const count = Number(arg('count', '3'));
  const kafka = new Kafka({ clientId: 'moeq-example-node', brokers, logLevel: logLevel.WARN });
  // Idempotence: a retried send is never written twice or out of order.
  const producer = kafka.producer({
    idempotent: true,
    maxInFlightRequests: 1,
    createPartitioner: Partitioners.DefaultPartitioner, // Java-compatible key hashing
  });
  await producer.connect();
  const run = crypto.randomBytes(4).toString('hex');
  const messages = [];
  for (let i = 0; i < count; i++) {
    const job = makeJob(i, run);
    messages.push({
      key: job.id, // keyed by id: one job's retries stay in one partition
      value: Buffer.from(encode(job)),
      headers: { 'content-type': 'application/msgpack' },
    });
  }
  await producer.send({ topic, acks: -1, messages }); // resolves once every broker ack is in
  await producer.disconnect();
  console.log(`producer.js: ${count} jobs on ${topic} (ids node-${run}-*)`);
}

main().catch((err) => {
  console.error(`producer.js: ${err.stack || err}`);
  process.exit(1);
});
