// Trains the `tiny` test model's byte-level BPE tokenizer (exactly 1024 ids)
// and writes tokenizer/data/tiny/tokenizer.json + tokenizer_config.json.
//
//   ids 0..2     <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>, <｜▁pad▁｜>
//                (added special tokens, DeepSeek's spelling)
//   ids 3..258   the 256 ByteLevel symbols, in byte order
//   ids 259..    merges learned from SAMPLE below, most frequent pair first
//                (ties: the smaller pair of ids), until id 1023
//
// normalizer, pre_tokenizer, post_processor and decoder are DeepSeek-V3's
// (read, with its chat_template, from .deps/tokenizers/deepseek_v3/, which
// scripts/setup.sh creates). Deterministic: the same inputs give the same
// bytes. Usage: node tokenizer/data/train_tiny.js
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '../..');
const dsDir = path.join(root, '.deps/tokenizers/deepseek_v3');
const ds = JSON.parse(fs.readFileSync(path.join(dsDir, 'tokenizer.json'), 'utf8'));
const dsConfig = JSON.parse(fs.readFileSync(path.join(dsDir, 'tokenizer_config.json'), 'utf8'));

const SAMPLE = `
The quick brown fox jumps over the lazy dog. A batch inference worker reads jobs
from a queue, groups them by length, and runs them through the model together.
Every request carries a prompt, a maximum number of new tokens, and a deadline.
When the deadline passes, the job is cancelled and the worker moves on; when the
model finishes, the result is written back with the tokens that were generated.
It was the best of times, it was the worst of times, it was the age of wisdom,
it was the age of foolishness, it was the epoch of belief, it was the epoch of
incredulity, it was the season of Light, it was the season of Darkness.
In the beginning the Universe was created. This has made a lot of people very
angry and been widely regarded as a bad move. There is a theory which states
that if ever anyone discovers exactly what the Universe is for and why it is
here, it will instantly disappear and be replaced by something even more
bizarre and inexplicable. There is another theory which states that this has
already happened. The weather today is sunny with a light breeze from the west;
temperatures will reach 23 degrees in the afternoon and fall to 12 at night.
Please remember to bring your tickets, your passport, and a pen to the meeting.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2048 65536 3.14159 2.71828 1e-9
2024-05-17 12:34:56 +0000, $19.99, 50%, #1, @user, user@example.com, v1.2.3

#include <stdio.h>
#include <stdlib.h>

static int add(int a, int b) { return a + b; }

int main(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        printf("%d: %s\\n", i, argv[i]);
    }
    if (argc > 1) return add(argc, 1);
    return 0;
}

def tokenize(text: str) -> list[int]:
    """Split text into tokens and return their ids."""
    ids = []
    for word in text.split():
        if word in vocab:
            ids.append(vocab[word])
        else:
            ids.extend(encode_bytes(word.encode("utf-8")))
    return ids

class Worker:
    def __init__(self, queue, model):
        self.queue = queue
        self.model = model

    def run(self):
        while True:
            batch = self.queue.get(timeout=1.0)
            if batch is None:
                break
            self.model.generate(batch)

function greet(name) {
  const message = \`Hello, \${name}!\`;
  console.log(message);
  return { ok: true, length: message.length };
}
export default async function main() { await Promise.all([greet("a"), greet("b")]); }
SELECT id, name, created_at FROM users WHERE active = 1 ORDER BY created_at DESC;
{"id": "job-1", "prompt": "Hello", "max_tokens": 16, "temperature": 0.7}

人工智能是计算机科学的一个分支，它试图理解智能的实质，并生产出一种新的能以人类智能相似的方式做出反应的智能机器。
今天天气很好，我们一起去公园散步吧。中文分词和机器翻译都是自然语言处理的重要任务。
北京是中国的首都，上海是最大的城市。我爱学习，学习使我快乐。
日本語の文章も少し入れておきます。東京は日本の首都です。今日はとても良い天気ですね。
ひらがなとカタカナとかんじをつかいます。コンピュータはとてもべんりです。
한국어 문장도 조금 넣습니다. 서울은 대한민국의 수도입니다. 오늘 날씨가 정말 좋네요.
안녕하세요, 만나서 반갑습니다. 감사합니다.
Привет, мир! Это пример текста на русском языке. Ελληνικά: γεια σου κόσμε.
مرحبا بالعالم. שלום עולם. नमस्ते दुनिया। Emoji: 😀 👍 🚀 ❤️ 🎉
`;

// DeepSeek-V3's Split regexes, in JS syntax, for counting words while training.
const SPLITS = ds.pre_tokenizer.pretokenizers
  .filter((p) => p.type === 'Split')
  .map((p) => new RegExp(p.pattern.Regex.replace(/[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]/g,
    (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0')), 'gu'));

function split(pieces, re) {
  const out = [];
  for (const p of pieces) {
    let last = 0;
    for (const m of p.matchAll(re)) {
      if (m.index > last) out.push(p.slice(last, m.index));
      if (m[0].length) out.push(m[0]);
      last = m.index + m[0].length;
    }
    if (last < p.length) out.push(p.slice(last));
  }
  return out;
}

// GPT-2 bytes_to_unicode.
const byteToChar = [];
{
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    byteToChar[b] = String.fromCodePoint(printable ? b : 256 + n++);
  }
}

const SPECIALS = ['<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>', '<｜▁pad▁｜>'];
const VOCAB_SIZE = 1024;
const idToStr = [...SPECIALS, ...byteToChar];
const strToId = new Map(idToStr.map((s, i) => [s, i]));

// words: Map key -> {syms: [ids], count}
const words = new Map();
for (const w of SPLITS.reduce(split, [SAMPLE])) {
  const e = words.get(w);
  if (e) e.count++;
  else words.set(w, { syms: [...Buffer.from(w, 'utf8')].map((b) => b + SPECIALS.length), count: 1 });
}

const merges = [];
while (idToStr.length < VOCAB_SIZE) {
  const counts = new Map();
  for (const { syms, count } of words.values())
    for (let i = 0; i + 1 < syms.length; i++) {
      const k = syms[i] * 65536 + syms[i + 1];
      counts.set(k, (counts.get(k) || 0) + count);
    }
  let best = -1, bestCount = 0;
  for (const [k, c] of counts) if (c > bestCount || (c === bestCount && k < best)) (best = k), (bestCount = c);
  if (best < 0) throw new Error(`sample too small: ran out of pairs at ${idToStr.length} ids`);
  const a = Math.floor(best / 65536), b = best % 65536;
  const s = idToStr[a] + idToStr[b];
  let id = strToId.get(s);
  if (id === undefined) {
    id = idToStr.length;
    idToStr.push(s);
    strToId.set(s, id);
  }
  merges.push(idToStr[a] + ' ' + idToStr[b]);
  for (const w of words.values()) {
    const out = [];
    for (let i = 0; i < w.syms.length; i++) {
      if (i + 1 < w.syms.length && w.syms[i] === a && w.syms[i + 1] === b) out.push(id), i++;
      else out.push(w.syms[i]);
    }
    w.syms = out;
  }
}

const vocab = {};
idToStr.forEach((s, i) => (vocab[s] = i));
const tokenizer = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: SPECIALS.map((content, id) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  })),
  normalizer: ds.normalizer,
  pre_tokenizer: ds.pre_tokenizer,
  post_processor: ds.post_processor,
  decoder: ds.decoder,
  model: {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab, merges,
  },
};
const tokenAt = (id) => ({
  __type: 'AddedToken', content: SPECIALS[id], lstrip: false, normalized: true, rstrip: false, single_word: false,
});
const config = {
  add_bos_token: true,
  add_eos_token: false,
  bos_token: tokenAt(0),
  clean_up_tokenization_spaces: false,
  eos_token: tokenAt(1),
  legacy: true,
  model_max_length: 4096,
  pad_token: tokenAt(1),
  unk_token: null,
  tokenizer_class: 'LlamaTokenizerFast',
  chat_template: dsConfig.chat_template,
};
const out = path.join(__dirname, 'tiny');
fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify(tokenizer, null, 1) + '\n');
fs.writeFileSync(path.join(out, 'tokenizer_config.json'), JSON.stringify(config, null, 2) + '\n');
console.log(`tiny tokenizer: ${idToStr.length} ids, ${merges.length} merges -> ${out}`);
