// The corpus the golden vectors are made from: a list of {name, text}. Every
// case is built here, deterministically (a seeded PRNG, no files, no
// network), so gen_vectors.js always writes the same vectors.
'use strict';

function rng(seed) { // xorshift32
  let s = seed >>> 0 || 1;
  return () => ((s ^= s << 13), (s ^= s >>> 17), (s ^= s << 5), (s >>> 0) / 4294967296);
}
const cp = (...cps) => String.fromCodePoint(...cps);
const range = (a, b) => Array.from({ length: b - a + 1 }, (_, i) => a + i);

const PROSE = [
  'The quick brown fox jumps over the lazy dog.',
  "It's a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife. However little known the feelings or views of such a man may be on his first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is considered the rightful property of some one or other of their daughters.",
  'Call me Ishmael. Some years ago—never mind how long precisely—having little or no money in my purse, and nothing particular to interest me on shore, I thought I would sail about a little and see the watery part of the world.',
  "Don't stop believing; we'll see what they're doing. I'd say you've got it, and he'll know. She's here, isn't she? THEY'RE LOUD. We'VE mixed Case.",
  'Mixture-of-experts models route each token to a few experts: DeepSeek-V3 has 256 routed experts and 1 shared expert per layer, and activates 8 of them for every token.',
  '  Leading spaces, trailing spaces   ',
  'Hello\nworld\n\nNew paragraph.\r\nWindows line.\rOld Mac line.',
  'e.g. i.e. etc. Mr. Smith, Dr. Who & co. (2024) [draft] {v2} <tag> "quoted" \'single\' `code`',
  'Email: someone@example.com, URL: https://www.example.org/path/to/page?query=1&x=y#frag',
  'Prices: $1,234.56, €99, £5, ¥1000, 50% off; temperature −3 °C; 5 × 3 = 15; a ≤ b ≥ c ≠ d ± e',
];

const CJK = [
  '人工智能是计算机科学的一个分支，它企图了解智能的实质，并生产出一种新的能以人类智能相似的方式做出反应的智能机器。',
  '我们今天去北京大学参观，然后在清华大学附近吃饭。“你好！”他说。《红楼梦》是中国古典小说。',
  '東京は日本の首都です。今日はとても良い天気ですね。私はコーヒーを飲みます。カタカナ、ひらがな、漢字。',
  'ｶﾀｶﾅ（半角）とカタカナ（全角）、ＡＢＣ１２３、ー〜・「」『』',
  '서울은 대한민국의 수도입니다. 오늘 날씨가 정말 좋네요! 한국어 형태소 분석은 어렵습니다.',
  '繁體中文：臺灣的資訊科技產業發達。粵語：我哋今日去飲茶。',
  '中文English混合123テキスト한국어mixed',
  '𠀀𠀁𠀂 𪚥 𩸽 (CJK extension B and beyond)',
];

const CODE = [
  '#include <stdio.h>\n\nint main(void) {\n    printf("Hello, %s!\\n", "world");\n    return 0;\n}\n',
  'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nif __name__ == "__main__":\n    print([fib(i) for i in range(10)])\n',
  'const sum = (xs) => xs.reduce((a, b) => a + b, 0);\nexport default { sum };\n// TODO: handle NaN\n/* block */\n',
  'fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}\n',
  '{"id": 42, "name": "moeq", "tags": ["a", "b"], "nested": {"x": 1.5e-3, "y": null, "z": true}}',
  '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Test</title></head>\n<body><p class="x">Hi &amp; bye</p></body></html>',
  'for f in *.txt; do\n\techo "$f" | tr a-z A-Z >> out.log 2>&1\ndone\nif [[ -n "${X:-}" ]]; then exit 1; fi',
  'SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total > 100 GROUP BY u.id HAVING n >= 3;',
  'x+=1;y-=2;z*=3;w/=4;a&&b||c;!d;e!=f;g==h;i<=j;k>=l;m<<2;n>>3;o->p;q::r;s...t;u??v;',
  '    \tindented\twith\ttabs\n\t\t\tthree tabs\n        eight spaces\n',
];

const NUMBERS = [
  '0 1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890',
  '3.14159265358979323846264338327950288419716939937510',
  '2024-01-31T23:59:59.999Z 192.168.0.1 +1 (555) 123-4567 1,000,000 1_000_000 0xDEADBEEF 0b1010 1e10 -42',
  '١٢٣٤٥٦٧٨٩٠ (Arabic-Indic) ۱۲۳ (Persian) १२३४ (Devanagari) ١٢٣abc',
  '１２３４５ (fullwidth) ²³¹ (superscripts) ½ ¼ ¾ (fractions) Ⅻ ⅻ (Roman) ① ② ③ (circled)',
  'v1.2.3-rc.4+build.567, ISBN 978-3-16-148410-0, 4111 1111 1111 1111',
];

const SPECIAL_IN_TEXT = [
  '<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>',
  '<｜User｜>What is 2+2?<｜Assistant｜>4<｜end▁of▁sentence｜>',
  'abc<｜end▁of▁sentence｜>def',
  ' <｜User｜> spaced <｜Assistant｜> ',
  '<｜User｜><｜User｜><｜Assistant｜><｜Assistant｜>',
  '<｜User (not closed) <｜Assistant| (wrong bar) <|User|> <｜end▁of▁sentence｜',
  '<|EOT|> and <|EOT|><|EOT|>x<|EOT',
  '<｜place▁holder▁no▁0｜><｜place▁holder▁no▁12｜><｜place▁holder▁no▁799｜><｜place▁holder▁no▁800｜>',
  '<｜fim▁begin｜>def f():<｜fim▁hole｜>\n    return 1<｜fim▁end｜>',
  '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
  '<｜▁pad▁｜><｜▁pad▁｜>text',
  '<<｜User｜>>',
];

const EMOJI = [
  '😀😃😄😁 🚀🌍🔥 ❤️ 💯',
  '👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 skin tone, 🇺🇸🇯🇵🇩🇪 flags, 1️⃣ #️⃣ keycaps',
  'Math: 𝔸𝔹ℂ 𝕏𝕐ℤ 𝐀𝐁𝐂 𝑎𝑏𝑐; music 𝄞𝄢; Gothic 𐌰𐌱𐌲; cuneiform 𒀀𒀁; Linear B 𐀀',
  'emoji in words: hello😀world, 123🚀456, 中文😀中文',
  '☺ ☹ ★ ☆ ♠ ♥ ♦ ♣ ✓ ✗ → ← ↑ ↓ ⇒ ∞ ∑ ∏ √ ∫',
];

const SCRIPTS = [
  'Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.',
  'Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.',
  'مرحبا بالعالم! هذا نص عربي مع أرقام 123 وكلمات English.',
  'שלום עולם! זהו טקסט בעברית עם ניקוד: שָׁלוֹם.',
  '\u202Eevil override\u202C and \u200Fmark\u200E and \u2066isolate\u2069',
  'नमस्ते दुनिया! हिन्दी में लिखा गया पाठ। क्षत्रिय',
  'สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ',
  'Tiếng Việt có dấu: Người ta nói rằng ở đâu có ý chí, ở đó có con đường.',
  'ქართული ენა, Հայերեն լեզու, አማርኛ ቋንቋ, ᏣᎳᎩ, ᚠᚢᚦᚨᚱᚲ, ꯃꯩꯇꯩ',
  'Ünïcödé Àccénts: café, naïve, coöperate, façade, Straße, Ærø, Øresund, İstanbul, ǅ',
];

const COMBINING = [
  'e\u0301 vs \u00e9; n\u0303 vs \u00f1; A\u030a vs \u00c5',
  'Z\u0335\u0321\u0322a\u0336\u031b\u0317l\u0334\u0327g\u0337\u0328o\u0338\u0321 text',
  '\u0301 leading combining mark, then a\u0300\u0301\u0302\u0303\u0304 stacked',
  'क्\u200dष zero-width joiner, a\u200cb zwnj, a\u200bb zwsp, \ufeffBOM inside',
  '\u0300\u0301\u0302',
  'x\u20dd enclosing circle, 1\u20e3 keycap, a\u0489',
];

const WHITESPACE = [
  ' ', '  ', '\n', '\n\n', '\r\n', '\t', ' \n', '\n ', ' \n ', '\t\n\t',
  'a' + ' '.repeat(2) + 'b', 'a' + ' '.repeat(3) + 'b', 'a' + ' '.repeat(17) + 'b',
  ' '.repeat(100), ' '.repeat(1000), '\n'.repeat(50), '\t'.repeat(33), ' \t'.repeat(40),
  'word' + ' '.repeat(64) + '\n' + ' '.repeat(64) + 'word',
  '   \n\n   \n  x  \r\n\r\n  y',
  'a\u00a0b\u00a0\u00a0c nbsp; d\u3000e ideographic; f\u2003g em; h\u2009i thin; j\u202fk narrow',
  'x\u180ey mongolian vowel separator; x\u200by zwsp; x\u2028y line sep; x\u2029y para sep; x\u0085y NEL',
  '\u000b vertical tab \u000c form feed \u001c\u001d\u001e\u001f info seps',
  '\u3000\u3000indented with ideographic spaces',
  'end with spaces   ', '   ', 'end with newline\n', 'a\n\n\n\n\nb',
  '  \u00a0 \u00a0  ', '. \n', '!\n\n', ', \r\n',
];

const CONTROL = [
  'NUL:\u0000: SOH:\u0001: BEL:\u0007: BS:\b: ESC:\u001b[31mred\u001b[0m: DEL:\u007f:',
  'C1: \u0080\u0081\u0085\u008f\u009f end',
  '\u0000\u0000\u0000',
  'tab\tsep\tvalues\nline\u0000two',
];

const EDGE = [
  '\ufffd replacement char, \ufeff BOM, \ue000 private use, \uf8ff apple',
  cp(0xf0000) + cp(0x10fffd) + ' astral private use, ' + cp(0x10ffff) + ' max, ' + cp(0xfffe) + cp(0xffff) + ' nonchars',
  cp(0x0378) + cp(0x0379) + ' unassigned, ' + cp(0xe01ef) + ' variation selector 256',
  'Ｈｅｌｌｏ　Ｗｏｒｌｄ！ fullwidth latin',
  '\u2160\u2161 \u00b2 \u00bd \u2070 number forms',
  'ﬁ ﬂ ﬀ ligatures, ℃ ℉ № ™ ℡ letterlike',
  '\u0130 \u0131 \u1e9e \u03a3\u03c3\u03c2 case oddities',
  "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
  '.,;:!?-_()[]{}<>/\\|@#$%^&*+=~`"\'',
  '!!!?? ...... ---- ==== ____ **** #### ~~~~ ````',
  'a', 'A', '1', '.', '中', '😀', ' a', ' 1', ' .', ' 中',
];

function longCases() {
  const r = rng(12345);
  const letters = 'abcdefghijklmnopqrstuvwxyz';
  const pick = (s, n) => Array.from({ length: n }, () => s[Math.floor(r() * s.length)]).join('');
  const hanzi = Array.from({ length: 3000 }, () => cp(0x4e00 + Math.floor(r() * 0x51a5))).join('');
  return [
    ['long_word_a5000', 'a'.repeat(5000)],
    ['long_word_random20000', pick(letters, 20000)],
    ['long_word_mixedcase', pick(letters + letters.toUpperCase(), 8000)],
    ['long_word_repeat', 'supercalifragilisticexpialidocious'.repeat(300)],
    ['long_url', 'https://example.com/' + pick(letters + '0123456789/-_.?=&', 6000)],
    ['long_base64', pick('ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/', 12000) + '=='],
    ['long_hex', pick('0123456789abcdef', 10000)],
    ['long_digits', pick('0123456789', 10001)],
    ['long_hanzi', hanzi],
    ['long_kana', Array.from({ length: 4000 }, () => cp(0x3041 + Math.floor(r() * 0x56))).join('')],
    ['long_emoji', Array.from({ length: 2000 }, () => cp(0x1f600 + Math.floor(r() * 0x50))).join('')],
    ['long_punct', pick('!?.,;:-=+*/#@$%^&', 9000)],
    ['long_spaces_then_word', ' '.repeat(20000) + 'end'],
    ['long_newlines', '\n'.repeat(5000) + 'x' + '\r\n'.repeat(3000)],
    ['long_combining', 'a' + '\u0301'.repeat(3000)],
    ['long_cyrillic', pick('абвгдеёжзийклмнопрстуфхцчшщъыьэюя', 7000)],
  ];
}

// Pseudo-random strings over a mixed alphabet, to reach interactions the
// hand-written cases miss.
function fuzzCases() {
  const r = rng(777);
  const alphabet = [
    ...'abcdefXYZ0123456789 .,!?-\'"()\n\t', ' ', ' ', '  ', '\n\n', '\r\n',
    '中', '文', '日', 'の', 'カ', '한', 'é', 'e\u0301', 'ß', 'Ж', 'ع', 'א', '😀', '👍🏽', '𝔸', '\u00a0', '\u3000',
    '١', '１', '½', '\u200b', '\u0000', '\u001b', '<｜User｜>', '<｜end▁of▁sentence｜>', '<|EOT|>', '<｜', '｜>',
    "'s", "'ll", 'the', ' the', 'ing', 'tion', '://', '==', '->', '{}', '$', '%', '@',
  ];
  const out = [];
  for (let i = 0; i < 200; i++) {
    const n = 1 + Math.floor(r() * (i < 150 ? 40 : 400));
    let s = '';
    for (let k = 0; k < n; k++) s += alphabet[Math.floor(r() * alphabet.length)];
    out.push([`fuzz_${i}`, s]);
  }
  return out;
}

// Every code point of the BMP (but surrogates) and of chosen astral blocks, in
// contexts that exercise each Split regex class: after a letter, after a
// space, before a digit, before a newline. The text is a pure function of
// [lo, hi) (sweepText), so the vectors store the range and a hash of the ids
// instead of 2 MB of text; the C test rebuilds the same text.
function sweepText(lo, hi) {
  let s = '';
  for (let c = lo; c < hi; c++) {
    if (c >= 0xd800 && c <= 0xdfff) continue;
    const ch = cp(c);
    s += 'x' + ch + ' ' + ch + '1' + ch + '\n';
  }
  return s;
}

function sweepCases() {
  const out = [];
  const blocks = [[0x0000, 0xffff], [0x10000, 0x1ffff], [0x20000, 0x2000f], [0x2a6d0, 0x2a6ef],
    [0x30000, 0x3000f], [0xe0000, 0xe01ff], [0xf0000, 0xf000f], [0x10fff0, 0x10ffff]];
  const CHUNK = 512;
  for (const [lo, hi] of blocks)
    for (let a = lo; a <= hi; a += CHUNK) {
      const end = Math.min(a + CHUNK, hi + 1), text = sweepText(a, end);
      if (text) out.push({ name: `sweep_${a.toString(16).padStart(4, '0')}`, text, sweep: [a, end] });
    }
  return out;
}

function corpus({ sweep = true } = {}) {
  const cases = [];
  const add = (prefix, list) => list.forEach((text, i) => cases.push({ name: `${prefix}_${i}`, text }));
  add('prose', PROSE);
  add('cjk', CJK);
  add('code', CODE);
  add('numbers', NUMBERS);
  add('special', SPECIAL_IN_TEXT);
  add('emoji', EMOJI);
  add('scripts', SCRIPTS);
  add('combining', COMBINING);
  add('whitespace', WHITESPACE);
  add('control', CONTROL);
  add('edge', EDGE);
  cases.push({ name: 'empty', text: '' });
  cases.push({ name: 'all_prose_joined', text: PROSE.join('\n\n') + '\n' + CJK.join('') + '\n' + CODE.join('\n') });
  for (const [name, text] of longCases()) cases.push({ name, text });
  for (const [name, text] of fuzzCases()) cases.push({ name, text });
  if (sweep) cases.push(...sweepCases());
  return cases;
}

module.exports = { corpus, PROSE, CJK, CODE, NUMBERS, SCRIPTS, EMOJI };
