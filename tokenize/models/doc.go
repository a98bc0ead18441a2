// Package models gives each model its prompt encoder (step 4 of DESIGN §2): the
// `tokenizers:` section of the config, keyed by model name, loaded once at start.
//
// An entry names where the model's tokenizer.json, tokenizer_config.json and optional
// chat_template.jinja are: a path (a tokenizer.json file or the directory holding it), a
// Hugging Face hub cache directory searched in its own layout
// (models--ORG--NAME/snapshots/REV/, the revision refs/main names, else the newest
// snapshot: what vLLM pods mount), an embedded tokenizer (builtin: qwen3), or the
// approximate file-free pair (tokenize.Approx and tokenize.ChatML). An entry may instead
// or also name an engine render endpoint (package engine): chats are then rendered and
// tokenized by the engine, for formats that are not Jinja. A model with no entry uses the
// default entry (key "default"; the embedded Qwen3 tokenizer when absent), with a warning
// the first time each such model is seen. With [Deps.DeferDefault] the embedded default
// is loaded by the first request that needs it instead of by [Load].
//
// Loading fails, naming the model and the key, for missing files, a tokenizer component
// the exact encoder does not reproduce, or a chat template missing without an engine
// configured: kvroute never approximates a configured model silently. A tokenizer loaded
// for several models (the same file, snapshot or builtin) is loaded once and shared, with
// its segment memo.
//
// A [Set] is safe for concurrent use.
package models
