#!/usr/bin/env node
// Submit documents and await each one's result, with the Node client (clients/node).
//
//   node examples/node/submit_and_wait.js --brokers 127.0.0.1:9092 --count 3
//
// Each job's promise resolves to its result (by id); a job whose id was
// already accepted rejects with DuplicateError.
'use strict';
const crypto = require('crypto');
const { MoeqClient } = require('../../clients/node');

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

async function main() {
  const brokers = arg('brokers', process.env.MOEQ_KAFKA_BROKERS || '127.0.0.1:9092').split(',');
  const moeq = new MoeqClient({ brokers, jobsTopic: arg('topic', 'moeq.jobs') });
  await moeq.start();
  try {
    const run = crypto.randomUUID().slice(0, 8);
    const jobs = [...Array(Number(arg('count', '3'))).keys()].map((i) => ({
      id: `node-wait-${run}-${i}`, prompt: `Summarise document ${i} in one sentence.`, max_new_tokens: 32, temperature: 0 }));
    for (const r of await Promise.all(jobs.map((j) => moeq.run(j, { timeoutMs: 600000 })))) {
      console.log(r.id, r.status, JSON.stringify(r.text || '').slice(0, 80));
    }
  } finally {
    await moeq.close();
  }
}

main().catch((e) => { console.error(e.message); process.exit(1); });
