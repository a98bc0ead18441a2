package server

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// ReceiveLimit is the largest gRPC message the server accepts for a request body cap of
// maxBodyBytes. A BUFFERED body travels as one message: the limit sits above the cap
// (twice it, plus room for headers and framing) so that kvroute, not grpc-go, answers a
// body over the cap, with an OpenAI 413 rather than Envoy's 500 for a gRPC error.
func ReceiveLimit(maxBodyBytes int) int { return 2*maxBodyBytes + 1<<20 }

// Options are the gRPC server options kvroute's ext_proc listener needs, for a request
// body cap of maxBodyBytes.
func Options(maxBodyBytes int) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(ReceiveLimit(maxBodyBytes)),
		// Envoy pings idle HTTP/2 connections; a stricter policy answers GOAWAY
		// too_many_pings. No MaxConnectionAge: it would cut long generations.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
		// Stop (after the shutdown grace) waits for stream handlers to return, so every
		// cut stream has released its booking before the process exits.
		grpc.WaitForHandlers(true),
		// grpc-go's default gives a new connection 120 s to finish its TLS handshake and
		// HTTP/2 preface, and Stop waits for connections still handshaking: one TCP
		// connection that sends nothing (a port probe, a stalled client) held the
		// shutdown for two minutes past the grace.
		grpc.ConnectionTimeout(HandshakeTimeout),
	}
}

// HandshakeTimeout bounds a new connection's TLS handshake and HTTP/2 preface, and so
// how long one that sends nothing holds a shutdown after the grace. Envoy completes
// both in milliseconds.
const HandshakeTimeout = 5 * time.Second
