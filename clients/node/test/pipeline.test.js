// Run by tests/clients_check.py against a real coordinator + worker (topics in the environment).
'use strict';
const assert = require('assert');
const { MoeqClient, DuplicateError, jobHash } = require('..');

async function main() {
  // The hash every writer uses (schemas/vectors: FNV-1a 64 of "a" is af63dc4c8601ec8c).
  assert.strictEqual(jobHash(Buffer.from('a')), 'af63dc4c8601ec8c');
  const env = process.env;
  const moeq = new MoeqClient({ brokers: env.MOEQ_BROKERS.split(','), jobsTopic: env.MOEQ_JOBS_TOPIC,
                                resultsTopic: env.MOEQ_RESULTS_TOPIC, dlqTopic: env.MOEQ_DLQ_TOPIC });
  await moeq.start();
  try {
    const jobs = [...Array(6).keys()].map((i) => ({ id: `cl-node-${env.MOEQ_RUN}-${i}`, prompt: `node ${i}`,
                                                    max_new_tokens: 5, temperature: 0 }));
    const results = await Promise.all(jobs.map((j) => moeq.run(j, { timeoutMs: 120000 })));
    results.forEach((r, i) => { assert.strictEqual(r.id, jobs[i].id); assert.strictEqual(r.status, 'ok', JSON.stringify(r)); });
    await assert.rejects(moeq.run({ id: jobs[0].id, prompt: 'other content', max_new_tokens: 5 }, { timeoutMs: 60000 }),
                         (e) => e instanceof DuplicateError && e.jobId === jobs[0].id);
  } finally {
    await moeq.close();
  }
  const t0 = Date.now();
  const dead = new MoeqClient({ brokers: ['127.0.0.1:1'], connectTimeoutMs: 2000 });
  await assert.rejects(dead.start(), (e) => /127\.0\.0\.1:1/.test(e.message));
  assert.ok(Date.now() - t0 < 30000, `the dead broker took ${Date.now() - t0} ms to be named`);
  console.log('node client: 6 concurrent jobs answered, the duplicate rejected, the dead broker named');
}

main().catch((e) => { console.error(e); process.exit(1); });
