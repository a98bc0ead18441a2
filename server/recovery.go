package server

import (
	"context"
	"log/slog"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Recovery returns the server options that turn a panic in a handler into a gRPC
// Internal error for that call alone: it is logged with its stack and counted in
// kvroute_server_panics_total. grpc-go does not recover handler panics, so without this
// one bad stream ends the process. Handlers' deferred calls (the filter's booking
// release) still run while the panic unwinds, before the recovery here.
func Recovery(log *slog.Logger, m *Metrics) []grpc.ServerOption {
	recovered := func(method string, err *error) {
		if r := recover(); r != nil {
			m.panicked(method)
			log.Error("handler panicked: the call fails, the process keeps serving", "method", method, "panic", r, "stack", string(debug.Stack()))
			*err = status.Error(codes.Internal, "kvroute: internal error")
		}
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
			defer recovered(info.FullMethod, &err)
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
			defer recovered(info.FullMethod, &err)
			return handler(srv, ss)
		}),
	}
}
