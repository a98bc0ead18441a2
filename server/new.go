package server

import (
	"log/slog"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// New returns a Process serving ext on a gRPC server with the Options for a request
// body cap of maxBodyBytes, the panic Recovery (counted in m) and the gRPC health
// services. The caller sets Admin, and Background and Grace if any, before Serve.
func New(ext extprocv3.ExternalProcessorServer, maxBodyBytes int, log *slog.Logger, m *Metrics, opts ...grpc.ServerOption) *Process {
	opts = append(append(Options(maxBodyBytes), Recovery(log, m)...), opts...)
	p := &Process{GRPC: grpc.NewServer(opts...), Health: grpchealth.NewServer(), Log: log}
	extprocv3.RegisterExternalProcessorServer(p.GRPC, ext)
	healthpb.RegisterHealthServer(p.GRPC, p.Health)
	return p
}
