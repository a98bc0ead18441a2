// Package index is step 5 of a routing decision (DESIGN §2, §4): it cuts a prompt's token
// ids into blocks, computes their chained hashes, and knows which worker holds which
// block, so it can say how many leading blocks of a request each worker already has on
// device (the overlap ov(w) of the cost).
//
// An [Index] is fed either by the router itself (approximate mode: the chosen worker is
// recorded as holding the request's blocks, bounded per worker by an LRU capacity and a
// TTL) or by engine KV events (store, remove, clear). Its memory is bounded by the sum of
// the workers' capacities whatever the traffic. An [EventIndex] is event mode: an Index
// of what the engines reported plus one of the router's decisions not yet reported.
//
// All methods of [Index] and [EventIndex] are safe for concurrent use.
package index
