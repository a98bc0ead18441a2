// Package envoy holds kvroute's Envoy-facing assets: the shipped example configs are
// validated against go-control-plane's protos by this package's tests, and the
// subpackage envoytest is a test data plane that plays Envoy's side of ext_proc.
package envoy
