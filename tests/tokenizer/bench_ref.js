// The reference side of bench-tokenizer: HF `tokenizers` encodes the same
// documents (one JSON string per line of DOCS), one at a time on one thread
// (RAYON_NUM_THREADS=1, each call awaited before the next), timing only the
// encode calls. Prints {"seconds", "tokens", "ids_fnv1a64"} — the hash over
// all ids in order, as little-endian int32, for bench/tokenizer.c to compare.
// Usage: node bench_ref.js REF_DIR TOKENIZER_JSON DOCS
'use strict';
process.env.RAYON_NUM_THREADS = '1';
process.env.TOKENIZERS_PARALLELISM = 'false';
const fs = require('fs');

const [refDir, tokPath, docsPath] = process.argv.slice(2);
const { Tokenizer } = require(require.resolve('tokenizers', { paths: [refDir] }));
const tok = Tokenizer.fromFile(tokPath);
const docs = fs.readFileSync(docsPath, 'utf8').split('\n').filter((l) => l).map((l) => JSON.parse(l));

async function main() {
  await tok.encode('warm up'); // load-time work out of the timing
  const all = [];
  let seconds = 0;
  for (const doc of docs) {
    const t0 = process.hrtime.bigint();
    const enc = await tok.encode(doc);
    seconds += Number(process.hrtime.bigint() - t0) / 1e9;
    all.push(enc.getIds());
  }
  let h = 0xcbf29ce484222325n, tokens = 0;
  for (const ids of all)
    for (const id of ids) {
      tokens++;
      for (let k = 0; k < 4; k++) h = ((h ^ BigInt((id >>> (8 * k)) & 0xff)) * 0x100000001b3n) & 0xffffffffffffffffn;
    }
  console.log(JSON.stringify({ seconds, tokens, ids_fnv1a64: h.toString(16).padStart(16, '0') }));
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
