// moeq-client — submit moeq jobs from Node.js and await their results by id.
//
//   const { MoeqClient } = require('moeq-client');
//   const moeq = new MoeqClient({ brokers: ['127.0.0.1:9092'] });
//   await moeq.start();
//   const result = await moeq.run({ id: 'doc-1', prompt: 'Summarise ...', max_new_tokens: 64 });
//   await moeq.close();
//
// Jobs are schemas/job.md (the client adds v: 1); results schemas/result.md.
// Every job ends in exactly one of: a result (status ok, error, cancelled...:
// resolved, never rejected), or a `duplicate` dead letter when its id was
// already accepted in the dedupe window (rejected with a DuplicateError). A
// result is matched by job id and by job_hash (FNV-1a 64 of the bytes this
// client sent), so an earlier job's result with the same id is never taken.
// Results are read from just before start() (offsets by timestamp, less
// clockSkewMs), by a consumer of its own group, so no fast result is missed.
// Kafka settings (ssl, sasl) go to kafkajs through `kafka`.
'use strict';
const crypto = require('crypto');
const { Kafka, Partitioners, logLevel } = require('kafkajs');
const { encode, decode } = require('@msgpack/msgpack');

class DuplicateError extends Error {
  constructor(jobId, reason) {
    super(`job ${jobId} was not run: ${reason}`);
    this.name = 'DuplicateError';
    this.jobId = jobId;
    this.reason = reason;
  }
}

// FNV-1a 64 of a job message value, as results carry it (schemas/result.md job_hash).
function jobHash(buf) {
  let h = 0xcbf29ce484222325n;
  for (const b of buf) h = BigInt.asUintN(64, (h ^ BigInt(b)) * 0x100000001b3n);
  return h.toString(16).padStart(16, '0');
}

function header(message, name) {
  const v = message.headers && message.headers[name];
  return v === undefined ? undefined : Buffer.isBuffer(v) ? v.toString('utf8') : String(v);
}

class MoeqClient {
  constructor({ brokers, jobsTopic = 'moeq.jobs', resultsTopic = 'moeq.results', dlqTopic = 'moeq.dlq',
                kafka = {}, encoding = 'msgpack', clockSkewMs = 60000, connectTimeoutMs = 15000 } = {}) {
    if (!brokers || !brokers.length) throw new Error('moeq client: brokers are required');
    if (encoding !== 'msgpack' && encoding !== 'json') throw new Error('encoding must be msgpack or json');
    Object.assign(this, { brokers, jobsTopic, resultsTopic, dlqTopic, encoding, clockSkewMs });
    this.kafka = new Kafka({ clientId: 'moeq-client-node', brokers, logLevel: logLevel.NOTHING,
                             connectionTimeout: connectTimeoutMs, retry: { retries: 2 }, ...kafka });
    this.waiting = new Map(); // job id -> { hash, resolve, reject }
  }

  async start() {
    const startMs = Date.now() - this.clockSkewMs;
    this.admin = this.kafka.admin();
    try {
      await this.admin.connect();
      const offsets = {};
      for (const topic of [this.resultsTopic, this.dlqTopic]) {
        offsets[topic] = await this.admin.fetchTopicOffsetsByTimestamp(topic, startMs);
      }
      this.offsets = offsets;
    } catch (e) {
      await this.admin.disconnect().catch(() => {});
      throw new Error(`moeq client: cannot reach the brokers ${this.brokers.join(',')}: ${e.message}`);
    }
    this.producer = this.kafka.producer({ idempotent: true, maxInFlightRequests: 1,
                                          createPartitioner: Partitioners.DefaultPartitioner });
    await this.producer.connect();
    this.consumer = this.kafka.consumer({ groupId: `moeq-client-${crypto.randomUUID()}` });
    await this.consumer.connect();
    await this.consumer.subscribe({ topics: [this.resultsTopic, this.dlqTopic] });
    const joined = new Promise((resolve) => {
      const off = this.consumer.on(this.consumer.events.GROUP_JOIN, () => { off(); resolve(); });
    });
    await this.consumer.run({ autoCommit: false, eachMessage: async ({ topic, message }) => this.onMessage(topic, message) });
    await joined;
    // From just before start, whatever the group's (fresh, empty) committed offsets say.
    for (const [topic, parts] of Object.entries(this.offsets)) {
      for (const { partition, offset } of parts) this.consumer.seek({ topic, partition, offset });
    }
    await this.admin.disconnect();
  }

  encodeJob(job) {
    if (!job || typeof job.id !== 'string') throw new Error('a job needs a string id (schemas/job.md)');
    const full = { v: 1, ...job };
    if (this.encoding === 'json') return { value: Buffer.from(JSON.stringify(full)), type: 'application/json' };
    return { value: Buffer.from(encode(full)), type: 'application/msgpack' };
  }

  // Send one job; resolves once the broker has it, to a promise of its result.
  async submit(job) {
    const { value, type } = this.encodeJob(job);
    if (this.waiting.has(job.id)) throw new Error(`job ${job.id} is already waiting for its result in this client`);
    let entry;
    const result = new Promise((resolve, reject) => { entry = { hash: jobHash(value), resolve, reject }; });
    result.catch(() => {}); // rejections are the caller's once awaited
    this.waiting.set(job.id, entry);
    try {
      await this.producer.send({ topic: this.jobsTopic, messages: [{ key: job.id, value, headers: { 'content-type': type } }] });
    } catch (e) {
      this.waiting.delete(job.id);
      throw new Error(`job ${job.id} did not reach the broker: ${e.message}`);
    }
    return { result };
  }

  // Submit and wait: resolves to the result object; rejects with DuplicateError or on timeout.
  async run(job, { timeoutMs } = {}) {
    const { result } = await this.submit(job);
    if (!timeoutMs) return result;
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`job ${job.id}: no result within ${timeoutMs} ms`)), timeoutMs);
    });
    try {
      return await Promise.race([result, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  onMessage(topic, message) {
    if (!message.key) return;
    const id = message.key.toString('utf8');
    const entry = this.waiting.get(id);
    if (!entry) return;
    if (topic === this.dlqTopic) {
      if (header(message, 'moeq-reason-code') !== 'duplicate') return; // others come with an error result
      const h = header(message, 'moeq-job-hash');
      if (h && h !== entry.hash) return;
      this.waiting.delete(id);
      entry.reject(new DuplicateError(id, header(message, 'moeq-reason') || 'duplicate'));
      return;
    }
    const type = header(message, 'content-type');
    const r = type === 'application/json' || message.value[0] === 0x7b ? JSON.parse(message.value.toString('utf8'))
                                                                       : decode(message.value);
    if (r.job_hash && r.job_hash !== entry.hash) return; // answers an earlier job with the same id
    this.waiting.delete(id);
    entry.resolve(r);
  }

  async close() {
    await Promise.allSettled([this.consumer && this.consumer.disconnect(), this.producer && this.producer.disconnect()]);
  }
}

module.exports = { MoeqClient, DuplicateError, jobHash };
