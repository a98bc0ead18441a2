// Package mockworker serves a simulated engine (package sim) in real time behind an
// OpenAI-compatible HTTP API: /v1/chat/completions and /v1/completions (stream true or
// false, SSE, stream_options.include_usage, usage with
// prompt_tokens_details.cached_tokens), Anthropic's /v1/messages and OpenAI's
// /v1/responses as vLLM serves them (the body converted to the chat vLLM renders, the
// answer and its named SSE events in the API's shape; responses are not stored, so a
// Responses body must say store false; converted.go), vLLM's render endpoints
// (/v1/chat/completions/render, /v1/completions/render, /v1/responses/render and
// /v1/messages/render, for kvroute's engine mode), vLLM's token-in/token-out
// /inference/v1/generate (token_ids and sampling_params in; GenerateResponse, or SSE
// chunks of token ids, out; generate.go), SGLang's native POST /generate (text or
// input_ids, sampling_params.max_new_tokens (default 128), rid, lora_path, cache_salt;
// {"text", "output_ids", "meta_info"} with prompt_tokens, completion_tokens,
// cached_tokens and finish_reason, or SSE chunks of the text and ids so far; one prompt
// a request: batches and n above 1 get a 400; sglang.go), SGLang's sessions
// (/open_session, /close_session, and session_params on /generate, whose prompt the
// worker rebuilds from the session's history so a later turn hits its cache;
// sglang_session.go), /health, and /metrics with vLLM's metric names.
//
// Prompts are rendered and tokenized with the prompt encoders it is given
// (Config.Tokenizers: the set kvroute is configured with), through the same parser, so
// the worker's token ids are kvroute's and cached_tokens reflect them (a generate
// request's prompt is its token_ids, not tokenized). The generated text
// is made of words that are one token each (package onetoken), so a conversation's next
// turn tokenizes to the previous prompt plus the generated tokens, and its prefix hits
// the cache as it would on vLLM. Cached tokens come from the engine, not from any
// router: as vLLM reports them, every prompt token it did not compute, its prefix
// cache's hits and what a KV connector loaded (its host tier, a prefill worker).
//
// For disaggregated prefill/decode every worker serves the prefill side of vLLM's NIXL
// connector (a request with kv_transfer_params.do_remote_decode answers where its KV
// is) and reads the KV of a request with kv_transfer_params.do_remote_prefill rather
// than computing it; with Config.PrefillSidecar it also plays llm-d's routing sidecar
// for a request naming a prefill worker in x-prefiller-host-port (chat, completions and
// generate, whose prefill leg has sampling_params capped, as llm-d's splits them).
//
// A request's cache_salt keeps its blocks apart from other salts', and the first
// block's BlockStored event carries it in its extra keys, as vLLM's.
//
// With Config.DataParallelSize N > 1 the worker is a vLLM server of N data-parallel
// ranks behind one address (internal load balancing; dataparallel.go): N engines, each
// of Config.Engine's size with a cache of its own. A request's X-data-parallel-rank
// header pins its rank on chat, completions, /inference/v1/generate and /v1/messages (a
// value that is not an integer is ignored, one out of range gets vLLM's 400); otherwise,
// and always on /v1/responses and SGLang's /generate, the rank with the fewest waiting
// plus running requests serves it (ties to the lowest), as vLLM's balancer picks. The
// answer's x-data-parallel-rank names the rank; /metrics has one series per rank
// labelled engine="<rank>"; rank r publishes its KV events on the endpoints' ports + r,
// each batch naming data_parallel_rank r. With one rank (the default) none of this
// shows.
//
// With a host tier (Config.Engine.HostBlocks, sim's CPU offloading) the worker publishes
// the host's stores and evictions with medium "CPU", as vLLM's offloading connector
// does, and the device's with "GPU".
package mockworker
