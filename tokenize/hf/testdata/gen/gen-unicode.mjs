// Probes the Unicode data the tokenizers library really uses, by running it: the
// character classes of its regex engine (Oniguruma), Rust's char::is_numeric (Digits)
// and its Unicode normalization tables, for every code point. Go's tables are newer
// (Unicode 17 in Go 1.27); tokenize/hf corrects for the difference with tables generated
// from this file (go test ./tokenize/hf -run TestUnicodeTables -update). See README.md.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('tokenizers');
const referenceVersion = require('tokenizers/package.json').version;
const here = path.dirname(fileURLToPath(import.meta.url));
const out = path.resolve(here, '..', 'unicode-reference.json.gz');

// A byte-level model without merges: token i is byte i, so ids spell the UTF-8 bytes of
// whatever the normalizer and pre-tokenizer left.
const byteRunes = [];
for (let b = 0, n = 0; b < 256; b++) {
  byteRunes[b] = (b >= 33 && b <= 126) || (b >= 0xa1 && b <= 0xac) || b >= 0xae ? b : 256 + n++;
}
const vocab = Object.fromEntries(byteRunes.map((r, i) => [String.fromCodePoint(r), i]));
function probeTokenizer(normalizer, pre) {
  const steps = [...(pre ? [pre] : []), { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false }];
  return Tokenizer.fromString(JSON.stringify({
    version: '1.0', added_tokens: [], normalizer, pre_tokenizer: { type: 'Sequence', pretokenizers: steps },
    model: { type: 'BPE', vocab, merges: [] },
  }));
}
async function run(tok, text) {
  const enc = await tok.encode(text, null, { addSpecialTokens: false });
  return { text: Buffer.from(enc.getIds()).toString('utf8'), words: enc.getWordIds() };
}

const SEP = 0x1; // a starter that never composes: separates per-character probes
const all = [];
for (let c = 0; c <= 0x10ffff; c++) if ((c < 0xd800 || c > 0xdfff) && c !== SEP) all.push(c);
const chunks = (list, n) => Array.from({ length: Math.ceil(list.length / n) }, (_, i) => list.slice(i * n, (i + 1) * n));
function ranges(list) {
  const r = [];
  for (const c of list) {
    if (r.length && r[r.length - 1][1] === c - 1) r[r.length - 1][1] = c;
    else r.push([c, c]);
  }
  return r;
}

// members returns the code points a regex matches: Split(Removed) drops them.
async function members(regex) {
  const tok = probeTokenizer(null, { type: 'Split', pattern: { Regex: regex }, behavior: 'Removed', invert: false });
  const hit = [];
  for (const part of chunks(all, 65536)) {
    const kept = Array.from((await run(tok, String.fromCodePoint(...part))).text, (ch) => ch.codePointAt(0));
    let k = 0;
    for (const c of part) {
      if (k < kept.length && kept[k] === c) k++;
      else hit.push(c);
    }
    if (k !== kept.length) throw new Error(`${regex}: output is not a subsequence of the input`);
  }
  return ranges(hit);
}

// numeric returns the code points Digits isolates (char::is_numeric): between two 'a's,
// such a character is a word of its own.
async function numeric() {
  const tok = probeTokenizer(null, { type: 'Digits', individual_digits: true });
  const hit = [];
  for (const part of chunks(all, 65536)) {
    const text = 'a' + part.map((c) => String.fromCodePoint(c) + 'a').join('');
    const { words } = await run(tok, text);
    let byte = 1; // token k is byte k of the input
    for (const c of part) {
      if (words[byte] !== words[byte - 1]) hit.push(c);
      byte += Buffer.byteLength(String.fromCodePoint(c)) + 1;
    }
  }
  return ranges(hit);
}

// perChar returns, for each code point whose result differs from itself, what
// normalizer(prefix + c) gives, the probes separated by SEP.
async function perChar(form, prefix) {
  const tok = probeTokenizer({ type: form }, null);
  const changed = {};
  for (const part of chunks(all, 20000)) {
    const inputs = part.map((c) => prefix + String.fromCodePoint(c));
    const results = (await run(tok, inputs.join(String.fromCodePoint(SEP)))).text.split(String.fromCodePoint(SEP));
    if (results.length !== part.length) throw new Error(`${form}: ${results.length} results for ${part.length} probes`);
    part.forEach((c, i) => {
      if (results[i] !== inputs[i]) changed[c] = Array.from(results[i], (ch) => ch.codePointAt(0));
    });
  }
  return changed;
}

// composites: the primary composites of the current Unicode (JavaScript's normalize)
// and what the library's NFC makes of their decompositions.
async function composites() {
  const tok = probeTokenizer({ type: 'NFC' }, null);
  const list = all.filter((c) => {
    const s = String.fromCodePoint(c);
    const d = s.normalize('NFD');
    return d !== s && d.normalize('NFC') === s;
  });
  const res = {};
  const results = (await run(tok, list.map((c) => String.fromCodePoint(c).normalize('NFD')).join(String.fromCodePoint(SEP)))).text.split(String.fromCodePoint(SEP));
  list.forEach((c, i) => { res[c] = Array.from(results[i], (ch) => ch.codePointAt(0)); });
  return res;
}

const CATEGORIES = ['L', 'Lu', 'Ll', 'Lt', 'Lm', 'Lo', 'M', 'Mn', 'Mc', 'Me', 'N', 'Nd', 'Nl', 'No', 'P', 'Pc', 'Pd', 'Ps',
  'Pe', 'Pi', 'Pf', 'Po', 'S', 'Sm', 'Sc', 'Sk', 'So', 'Z', 'Zs', 'Zl', 'Zp', 'C', 'Cc', 'Cf', 'Co'];
const result = { reference: `tokenizers@${referenceVersion}`, unicode: process.versions.unicode, regex: {}, normalize: {} };
for (const cat of CATEGORIES) result.regex[`\\p{${cat}}`] = await members(`\\p{${cat}}`);
result.regex['\\s'] = await members('\\s');
result.regex['\\d'] = await members('\\d');
// The Rust regex crate's \w, which single_word uses (same Unicode version as Oniguruma's).
result.word = await members('[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]');
result.numeric = await numeric();
for (const form of ['NFC', 'NFD', 'NFKC', 'NFKD']) result.normalize[form] = await perChar(form, '');
result.normalize.NFD_after_0345 = await perChar('NFD', 'a\u0345'); // reordering: non-zero combining classes
result.composites = await composites();
fs.writeFileSync(out, zlib.gzipSync(JSON.stringify(result), { level: 9 }));
console.log(`${out}: written`);
