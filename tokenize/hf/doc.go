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
// A [Tokenizer] is safe for concurrent use.
package hf
