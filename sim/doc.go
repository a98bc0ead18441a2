// Package sim is a simulated vLLM-like inference worker (WORKLOADS §1): a KV block pool
// with a prefix cache (least recently used, leaves before parents, evicted only when
// inactive), a running set capped at max_num_seqs, passes with a token budget of
// max_num_batched_tokens (running requests first, one decode token each or their next
// prefill chunk, then waiting requests first in, first out), preemption of the newest
// running request when blocks run out, Dynamo mocker's fitted pass-time model, and KV
// events at the end of each pass. For disaggregated prefill/decode, a request whose
// prompt's KV a prefill worker computed (Request.Transferred) loads it at admission
// and starts decoding at once; TransferTime models the transfer. With
// Config.HostBlocks the engine has a host (CPU) tier behind the device cache, as vLLM's
// native CPU offloading or LMCache: a least recently used set of blocks that every
// block the device caches is written through to, whose blocks admission loads after
// the device's prefix hits rather than computing them (HostLoadTime, charged to the
// pass), and whose stores and evictions are KV events of medium "CPU" (Event.Host).
//
// The engine is the ground truth of replays: a request's cached tokens come from the
// engine's own cache, never from the router's prediction. It knows no clock: the caller
// starts a pass, waits its duration (virtual time in replays, real time in
// cmd/mockworker) and ends it. An Engine is not safe for concurrent use.
package sim
