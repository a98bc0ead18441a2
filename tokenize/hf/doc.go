// Package hf is the exact tokenizer of step 4 (DESIGN §2): it loads a Hugging Face
// tokenizer.json and turns prompt text into the token ids the Rust `tokenizers` library
// (and so vLLM, SGLang and Dynamo) produces for it.
//
// It reproduces the library's encode pipeline for BPE models: added tokens are cut out
// first (leftmost-longest, honouring lstrip, rstrip, single_word and normalized), each
// remaining segment is normalized (NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence),
// pre-tokenized (Split, ByteLevel, Metaspace, Digits, Sequence) and encoded by merge rank
// (ignore_merges, byte_fallback, fuse_unk, unk_token), and the TemplateProcessing
// post-processor adds special tokens when asked to. This covers byte-level vocabularies
// (Qwen, Llama 3, DeepSeek, gpt-oss) and SentencePiece-style ones (Mistral, Llama 2,
// Gemma). Any component or option outside that list makes [Parse] fail with an error
// naming its JSON path: the encoder never approximates.
//
// Two caches keep it fast without changing a single id. Prompt text between added
// tokens is encoded independently of its surroundings, so the encoding of each such
// piece is kept in a memo bounded in bytes (LRU): turn 12 of a conversation re-encodes
// only its new turn. Short words share a bounded word cache.
//
// [Tokenizer.AppendEncodePrefix] bounds the work of one text, which the library does
// not: it stops at a number of ids (the router's max_prompt_tokens) or before the long
// word that would take the long words encoded past [MaxLongWordBytes], and returns
// exactly the first ids of the whole text. A piece whose first pre-tokenizer is an
// isolating Split is pre-tokenized in windows of 1,024 pre-tokens, so no text of
// millions of words has them all in memory at once (window.go).
//
// A [Tokenizer] is safe for concurrent use.
package hf
