// Package session is an input of step 6 of a routing decision (DESIGN §2): it remembers,
// for each session named by a request header (x-session-id by default, the convention
// of llm-d and others), the worker that served the session's last request, so the cost
// can credit that worker (scoring.Params.SessionAffinityWeight) when prefix overlap
// cannot tell where the session was: an agent that compacts or rewrites its history
// sends a prompt no worker has cached.
//
// A [Store] is bounded (max_entries, least recently used first out) and forgets a
// session idle for its TTL. It keeps a 64-bit hash of each session id, never the id
// itself, so no request content stays in memory. It is safe for concurrent use.
//
// A Store of its own (NewResponses, the `responses` section) remembers which worker
// stored each Responses API response: vLLM keeps them in the engine's memory, so a
// request naming one must go back there (router.Request.PreviousResponseID).
package session
