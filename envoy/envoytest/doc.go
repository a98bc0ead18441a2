// Package envoytest provides a test data plane for ext_proc servers, as net/http/httptest
// does for handlers. A Server is an HTTP listener on loopback for use in end-to-end
// tests: for every request it plays Envoy's client side of the ext_proc protocol against
// the processor under test, applies the replies with Envoy's rules, picks the upstream
// as an ORIGINAL_DST cluster does from the destination header, proxies the request there
// and streams the response back through the processor.
//
// Each rule cites the Envoy source it follows (paths under
// source/extensions/filters/http/ext_proc/ and source/extensions/clusters/original_dst/
// in envoyproxy/envoy) and ../shared/ENVOY.md. What it does not model: HTTP/2 to the
// client, retries, route tables beyond per-path overrides, and trailers from upstream;
// mode_override (as with allow_mode_override false) and CONTINUE_AND_REPLACE; the
// header count and size limits of a mutation's result; STREAMED chunks pipelined ahead
// of their replies (envoytest sends the next chunk once the last one's reply is in);
// dynamic metadata a reply put in a namespace that is also forwarded coming back in
// later messages' metadata_context; and a router that picks its upstream before the
// request body was processed (envoytest forwards once the request phase is over).
//
// The data plane's own local replies (the router's 503 when no host or connection, its
// 504 on the route timeout, the 413 of a request past the buffer limit) go through the
// processor's response path, as in Envoy from 1.37 and before the CVE-2025-30157 fix
// (Config.SkipLocalReplies models the releases in between).
package envoytest
