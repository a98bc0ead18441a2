// Package tokenize is step 4 of a routing decision (DESIGN §2): it renders an OpenAI
// chat into the prompt text an engine would see and turns prompt text into token ids.
//
// Two seams live here. A [Tokenizer] maps text to ids; a [ChatRenderer] maps chat
// messages to text. The built-in [Approx] tokenizer and [ChatML] renderer need no files
// and are deterministic, which is all the approximate index mode needs: equal prompt
// prefixes give equal leading token ids. Their ids are not any engine's, so they cannot
// match engine KV events; exact model tokenizers plug in behind the same interfaces.
//
// Every type in this package is safe for concurrent use.
package tokenize
