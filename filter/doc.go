// Package filter speaks Envoy's external-processing (ext_proc) protocol: steps 1–3 and
// 7–10 of DESIGN §2. Per HTTP request it reads the OpenAI request body in whatever body
// mode Envoy uses, turns it into a protocol-free router.Request, asks its [Router] for a
// decision, tells Envoy the destination (header, envoy.lb metadata, route-cache clear),
// then watches the response to mark the first token and to free the booking exactly
// once, however the stream ends. It passes the session header's value to the router,
// removes the explain request header before forwarding, and answers it, when asked and
// enabled, with the decision in a response header (package explain).
//
// No go-control-plane type leaves this package. A [Server] is safe for concurrent use:
// Envoy opens one stream per HTTP request and each stream is handled by one goroutine.
package filter
