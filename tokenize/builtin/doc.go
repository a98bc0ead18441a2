// Package builtin holds the tokenizer files kvroute embeds, so it can tokenize exactly
// without any file on disk: today Qwen3's tokenizer.json and tokenizer_config.json
// (Apache-2.0, see qwen3/LICENSE and qwen3/README.md), gzipped.
//
// It only stores bytes: tokenize/hf builds the encoder from tokenizer.json, and a chat
// renderer reads tokenizer_config.json for the chat template and special tokens.
package builtin
