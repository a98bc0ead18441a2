// Package kvevents feeds the index (step 5 of DESIGN §2) from the engines' own KV cache
// events, so that ov(w) counts what each engine really holds (DESIGN §4 event mode,
// ../shared/KV_EVENTS.md):
//
//   - the wire format: a [Decoder] for vLLM's and SGLang's msgpack batches
//     (BlockStored, BlockRemoved, AllBlocksCleared, in map or array form, mixed), an
//     [Encode] for the simulated workers, and the ZMQ frames of live and replayed
//     messages;
//   - a per-worker applier that recomputes kvroute's own block hashes from each event's
//     token ids (salted by the worker's model, the LoRA name and the cache salt, as
//     request hashing is), keeps engine hash → own hash for removals, checks sequence
//     numbers, and never lets a gap, an unknown parent, a publisher restart or an
//     AllBlocksCleared leave a stale entry;
//   - a [Manager] that follows the fleet: one ZMQ subscriber per worker (and per
//     data-parallel rank), reconnecting with back-off, a DEALER replay client, and a
//     watchdog that puts a worker whose stream is silent or broken back in approximate
//     mode until its events resume;
//   - a [Publisher] (PUB plus a ROUTER replay socket) that the simulated workers use to
//     publish the real wire format.
//
// Everything read from a socket is hostile: message and frame sizes are capped before
// any allocation, a bound endpoint's connections are capped (one long quiet gives way
// to a newcomer), a peer's handshake is checked before zmq4 reads it, every length is
// checked against the bytes left, and a bad frame is counted, never a panic. A Manager and a Publisher are safe for concurrent use; a
// Decoder is not (one per stream).
package kvevents
