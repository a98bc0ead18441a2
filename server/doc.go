// Package server is the gRPC side of kvroute's process: the listener options Envoy
// needs (message limits, keepalive), and the recovery that keeps one faulty stream from
// taking the process, and with it every request Envoy fails closed on, down.
package server
