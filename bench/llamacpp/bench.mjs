#!/usr/bin/env node
// bench/llamacpp/bench.mjs — llama.cpp (as node-llama-cpp 3.21.1 ships it) on a GGUF:
// prefill and decode throughput measured the way bench-engine measures moeq, plus the
// greedy continuation of a fixed prompt, so that scripts/bench-cpu-anchor.sh can put the
// two side by side and check that they run the same model. Prints one JSON document.
//
//   node bench.mjs --model FILE.gguf [--threads 2] [--prefill 512,2048] [--batches 1,8,32,128]
//                  [--min-seconds 5] [--decode-prompt 16] [--ubatch 512]
//                  [--greedy-prompt 1,2,3] [--greedy-tokens 8] [--top 5]
//
// Prefill: one sequence, the prompt fed in --ubatch chunks (llama.cpp's default n_ubatch is
// 512), timed after an 8-token warm-up that maps the weights in. Decode at batch B: B
// sequences in one context, each with a --decode-prompt-token prompt, then all generating
// greedily at once: node-llama-cpp gathers the sequences' next tokens into one llama_decode
// per step (its batching), so a step is B tokens as in moeq's engine step. The first step is
// warm-up; tokens/s counts the rest, until --min-seconds or 200 steps.
// --greedy-prompt also gives, for every position of that prompt (teacher-forced), the --top
// most likely next ids with their log-probabilities, to set beside `moeq logits --top`.
// Prompt token ids follow bench-engine's ids_for(), so both sides see the same tokens.
// What this does not do: sampling other than greedy, or GPU offload (gpu: false).
import { readFileSync } from "node:fs";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const pkgVersion = (name) => {
    try {
        return JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url))).version;
    } catch {
        return null;
    }
};

function parseArgs(argv) {
    const a = { threads: 2, prefill: [512, 2048], batches: [1, 8, 32, 128], minSeconds: 5, decodePrompt: 16,
        ubatch: 512, greedyPrompt: [], greedyTokens: 8, top: 5 };
    const list = (v) => v.split(",").filter(Boolean).map(Number);
    for (let i = 2; i < argv.length; i += 2) {
        const k = argv[i], v = argv[i + 1];
        if (v === undefined) throw new Error(`${k}: missing value`);
        if (k === "--model") a.model = v;
        else if (k === "--threads") a.threads = Number(v);
        else if (k === "--prefill") a.prefill = list(v);
        else if (k === "--batches") a.batches = list(v);
        else if (k === "--min-seconds") a.minSeconds = Number(v);
        else if (k === "--decode-prompt") a.decodePrompt = Number(v);
        else if (k === "--ubatch") a.ubatch = Number(v);
        else if (k === "--greedy-prompt") a.greedyPrompt = list(v);
        else if (k === "--greedy-tokens") a.greedyTokens = Number(v);
        else if (k === "--top") a.top = Number(v);
        else throw new Error(`unknown option ${k}`);
    }
    if (!a.model) throw new Error("--model FILE.gguf is required");
    return a;
}

// bench/engine.c ids_for(): the same prompt ids on both sides (0 and 1 are bos/eos)
function idsFor(n, salt, vocab) {
    const ids = new Array(n);
    for (let i = 0; i < n; i++) ids[i] = Number((BigInt(i) * 7919n + BigInt(salt) * 104729n + 3n) % BigInt(vocab - 2)) + 2;
    return ids;
}

const now = () => Number(process.hrtime.bigint()) / 1e9;

async function prefill(model, a, n, vocab) {
    const ctx = await model.createContext({ contextSize: n + 16, batchSize: Math.min(a.ubatch, n), sequences: 1,
        threads: a.threads, ignoreMemorySafetyChecks: true });
    try {
        const seq = ctx.getSequence();
        const ids = idsFor(n, 1, vocab);
        await seq.evaluateWithoutGeneratingNewTokens(ids.slice(0, 8)); // warm-up: page in the weights
        await seq.clearHistory();
        const t0 = now();
        await seq.evaluateWithoutGeneratingNewTokens(ids);
        const s = now() - t0;
        return { tokens: n, ubatch: Math.min(a.ubatch, n), seconds: +s.toFixed(4), tokens_per_s: +(n / s).toFixed(2) };
    } finally {
        await ctx.dispose();
    }
}

// Counts llama_decode calls and the tokens in each, through node-llama-cpp's internal binding
// (LlamaContext._ctx: addToBatch / decodeBatch); null where that internal is not there. This
// proves that the B sequences really share one llama_decode per step.
function countDecodes(ctx) {
    const native = ctx._ctx, stats = { calls: 0, tokens: 0 };
    if (!native || typeof native.addToBatch !== "function" || typeof native.decodeBatch !== "function") return null;
    let pending = 0;
    const wrap = {
        addToBatch: (...args) => {
            pending += ArrayBuffer.isView(args[2]) || Array.isArray(args[2]) ? args[2].length : 1;
            return native.addToBatch(...args);
        },
        decodeBatch: (...args) => {
            stats.calls++;
            stats.tokens += pending;
            pending = 0;
            return native.decodeBatch(...args);
        },
    };
    try {
        ctx._ctx = new Proxy(native, {
            get: (t, k) => wrap[k] ?? (typeof t[k] === "function" ? t[k].bind(t) : t[k]),
        });
    } catch {
        return null;
    }
    return stats;
}

// node-llama-cpp's default schedule dispatches the batch on the next event-loop turn; the
// sequences' tokens are sampled on worker threads and come back one by one, so on a busy
// machine a step of B tokens was split into two or more llama_decode calls. This dispatches
// when every sequence still generating has queued its token (LlamaContext._queuedDecodeSequenceIds,
// an internal), or after 5 s (a safety net only), so that a step is one llama_decode of B
// tokens as in moeq.
function wholeStep(getCtx, active, dispatch) {
    const t0 = now();
    const tick = () => {
        const queued = getCtx()?._queuedDecodeSequenceIds?.size;
        if (queued === undefined || queued >= active() || now() - t0 > 5) dispatch();
        else setImmediate(tick);
    };
    setImmediate(tick);
}

// One sequence's greedy generation; `onToken` returns false to stop. A generation that ends
// (an end-of-generation token) starts again from a fixed token, so the step count stays B.
async function generate(seq, first, onToken) {
    let next = first;
    for (;;) {
        for await (const tok of seq.evaluate([next], { temperature: 0, yieldEogToken: true })) {
            if (!onToken(tok)) return;
            next = tok;
        }
        next = 2;
    }
}

async function decode(model, a, B, vocab) {
    const maxSteps = 200;
    let ctx = null, active = B; // sequences still generating
    ctx = await model.createContext({ contextSize: a.decodePrompt + maxSteps + 16, batchSize: Math.max(a.ubatch, B),
        sequences: B, threads: a.threads, ignoreMemorySafetyChecks: true,
        batching: { dispatchSchedule: (dispatch) => wholeStep(() => ctx, () => active, dispatch) } });
    try {
        const seqs = Array.from({ length: B }, () => ctx.getSequence());
        await Promise.all(seqs.map((s, b) => s.evaluateWithoutGeneratingNewTokens(idsFor(a.decodePrompt, 10 + b, vocab))));
        // steps[b] = tokens sequence b has generated; a step ends when every sequence has its token
        const done = new Array(B).fill(0);
        const decodes = countDecodes(ctx);
        let t0 = 0, t1 = 0, stepsTimed = 0, stop = false, calls0 = 0, tokens0 = 0, calls1 = 0, tokens1 = 0;
        const onToken = (b) => () => {
            done[b]++;
            const minDone = Math.min(...done);
            if (minDone === 1 && t0 === 0) { // first step = warm-up
                t0 = now();
                if (decodes) [calls0, tokens0] = [decodes.calls, decodes.tokens];
            }
            if (minDone > 1 && minDone - 1 > stepsTimed) {
                stepsTimed = minDone - 1;
                t1 = now();
                if (decodes) [calls1, tokens1] = [decodes.calls, decodes.tokens];
                if (t1 - t0 >= a.minSeconds || stepsTimed >= maxSteps - 1) stop = true;
            }
            return !stop && done[b] < maxSteps;
        };
        await Promise.all(seqs.map((s, b) => generate(s, b + 2, onToken(b)).finally(() => active--)));
        const s = t1 - t0;
        const r = { batch: B, steps: stepsTimed, tokens_per_s: s > 0 ? +(B * stepsTimed / s).toFixed(2) : 0,
            step_ms: stepsTimed ? +(s / stepsTimed * 1e3).toFixed(2) : 0 };
        if (decodes && calls1 > calls0) { // the decodes of the timed steps
            r.llama_decode_calls = calls1 - calls0;
            r.tokens_per_llama_decode = +((tokens1 - tokens0) / (calls1 - calls0)).toFixed(2);
        }
        return r;
    } finally {
        await ctx.dispose();
    }
}

async function greedy(model, a) {
    if (a.greedyPrompt.length === 0) return undefined;
    const ctx = await model.createContext({ contextSize: a.greedyPrompt.length + a.greedyTokens + 16, sequences: 1,
        threads: a.threads, ignoreMemorySafetyChecks: true });
    try {
        const tokens = [];
        for await (const tok of ctx.getSequence().evaluate(a.greedyPrompt, { temperature: 0, yieldEogToken: true })) {
            tokens.push(tok);
            if (tokens.length >= a.greedyTokens) break;
        }
        return { prompt_tokens: a.greedyPrompt, tokens, positions: await topPerPosition(model, a) };
    } finally {
        await ctx.dispose();
    }
}

// The --top next-token ids and log-probabilities (full softmax, no sampling filters) after each
// prompt position.
async function topPerPosition(model, a) {
    const ctx = await model.createContext({ contextSize: a.greedyPrompt.length + 16, sequences: 1,
        batchSize: Math.max(a.greedyPrompt.length, 32), threads: a.threads, ignoreMemorySafetyChecks: true });
    try {
        const all = { probabilities: true, options: { temperature: 1, topK: 0, topP: 1, minP: 0 } };
        const res = await ctx.getSequence().controlledEvaluate(a.greedyPrompt.map((t) => [t, { generateNext: all }]));
        return res.map((r, pos) => {
            const best = [...r.next.probabilities.entries()].sort((x, y) => y[1] - x[1]).slice(0, a.top);
            return { pos, ids: best.map((e) => e[0]), logprobs: best.map((e) => +Math.log(e[1]).toFixed(5)) };
        });
    } finally {
        await ctx.dispose();
    }
}

// llama.cpp's log, kept (not printed): it names the CPU variant ggml loaded
// (libggml-cpu-<variant>.so) and which weights went to the repacked (CPU_REPACK) kernels.
function captureLog(sink) {
    return (level, message) => {
        sink.push(message);
        if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) process.stderr.write(message);
    };
}

// The llama.cpp commit node-llama-cpp was built from: the head of the source bundle it ships
// (llama/gitRelease.bundle, a git bundle: "# v2 git bundle" then "<sha> HEAD").
function bundledCommit() {
    try {
        const head = readFileSync(new URL("./node_modules/node-llama-cpp/llama/gitRelease.bundle", import.meta.url))
            .subarray(0, 256).toString("latin1");
        return (head.match(/^([0-9a-f]{40}) /m) || [null, null])[1];
    } catch {
        return null;
    }
}

async function main() {
    const a = parseArgs(process.argv);
    const log = [];
    const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.debug, logger: captureLog(log),
        progressLogs: false });
    const t0 = now();
    const model = await llama.loadModel({ modelPath: a.model, gpuLayers: 0 });
    const loadS = now() - t0;
    const meta = model.fileInfo.metadata;
    const nVocab = Number(meta?.deepseek2?.vocab_size ?? meta?.tokenizer?.ggml?.tokens?.length);
    const out = {
        engine: "llama.cpp",
        runtime: { "node-llama-cpp": pkgVersion("node-llama-cpp"), "@node-llama-cpp/linux-x64": pkgVersion("@node-llama-cpp/linux-x64") },
        llama_cpp_release: { ...llama.llamaCppRelease, commit: bundledCommit() },
        build_type: llama.buildType,
        cpu_backend: (log.join("\n").match(/libggml-cpu-[a-z0-9_]+\.so/) || [null])[0],
        backend_log: log.filter((l) => /load_backend|REPACK|model buffer size/.test(l)).map((l) => l.trim()),
        system_info: llama.systemInfo.trim(),
        model: a.model, threads: a.threads, load_s: +loadS.toFixed(4), n_vocab: nVocab,
        file_type: meta?.general?.file_type,
        prefill: [], decode: [],
    };
    for (const n of a.prefill) out.prefill.push(await prefill(model, a, n, nVocab));
    for (const B of a.batches) out.decode.push(await decode(model, a, B, nVocab));
    out.greedy = await greedy(model, a);
    await model.dispose();
    await llama.dispose();
    process.stdout.write(JSON.stringify(out, null, 2) + "\n");
}

main().catch((e) => {
    process.stderr.write(`bench.mjs: ${e.stack || e}\n`);
    process.exit(1);
});
