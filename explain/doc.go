// Package explain shows why a decision went where it did, the step after the decision
// (DESIGN §2, §8): one schema, [Trace], for the debug decision trace, the response
// header a client asks for with the explain request header, and the admin port's
// GET /decisions.
//
// A Trace names the chosen worker and, for each candidate (best first), its inputs (ov,
// P, D, new, N, cache footprint, engine signals, session) and every weighted term of the
// cost with the total, in blocks (DESIGN §3). It holds no prompt and no session id; the
// model and adapter names a request gave are kept, cut at [MaxNameBytes].
//
// A [Recorder] answers the explain header when enabled and keeps a sample of recent
// decisions in a ring of bounded size. It is safe for concurrent use.
package explain
