// Package engine is the engine render mode of step 4 of a routing decision (DESIGN §2):
// for a model whose chat format kvroute cannot render itself (gpt-oss's Harmony,
// Mistral's own tokenizer mode), it asks a vLLM render endpoint for the prompt's token
// ids: POST /v1/chat/completions/render, /v1/completions/render, /v1/responses/render
// or /v1/messages/render (as the body's API, tokenize.Prompt.BodyAPI, says) on the
// engine or on a GPU-less `vllm launch render` server, with the client's request body
// as is.
//
// A [Client] implements [tokenize.PromptEncoder]. It bounds what a render may cost the
// decision: a timeout per request, a bound on renders in flight (past it, a request is
// not queued but fails at once) and a bound on the reply's size. Every failure wraps
// [tokenize.ErrEngine], for which the router routes the request by load alone: a render
// server being down never fails a request. A server started with --api-key gets its key
// from a file or an environment variable the config names (never the config itself),
// read at start and again at each reload ([Client.SetAPIKey]).
//
// The engine's reply is outside input: [ParseChatRender], [ParseCompletionsRender],
// [ParseResponsesRender] and [ParseMessagesRender] read only its token_ids, check each
// id is below 2^31 and their number is bounded, and reject anything else with an error
// (they are fuzzed).
//
// A Client is safe for concurrent use.
package engine
