package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// HealthServices are the gRPC health services answered on the ext_proc port: Envoy's
// cluster health check uses the ext_proc service name (or ""); GIE's manifests probe
// liveness and readiness.
var HealthServices = []string{"", "envoy.service.ext_proc.v3.ExternalProcessor", "liveness", "readiness"}

// Process is kvroute's listeners and background loops, served until its context ends
// and then drained.
type Process struct {
	// GRPC serves ext_proc; Health is registered on it.
	GRPC   *grpc.Server
	Health *grpchealth.Server
	// PlainHealth, when set, serves Health alone on PlainHealthListener without TLS:
	// kubelet's gRPC probes speak no TLS, so with TLS on the ext_proc port they need a
	// port of their own. It reports what the ext_proc port's health does, draining
	// included, and stops with the admin port once the drain ends.
	PlainHealth         *grpc.Server
	PlainHealthListener net.Listener
	// Admin serves the admin port; over TLS when its TLSConfig is set (admin_tls).
	Admin *http.Server
	// Background loops (health probes, metric scrapes) run from Serve's start until the
	// drain ends; each must return when its context is done.
	Background []func(ctx context.Context)
	// OnDrain are called as the drain starts, before the streams' grace: flow control
	// answers the requests it holds (flowcontrol.Queue.Close).
	OnDrain []func()
	// Grace is how long streams in flight may finish on shutdown before they are cut.
	Grace time.Duration
	Log   *slog.Logger
	// Readiness, when set, is a further condition of readiness (worker discovery has
	// synced and its InferencePool exists: discovery.Runner.Ready); call Refresh when
	// its answer may have changed.
	Readiness func() bool

	ready     atomic.Bool // serving, not draining
	publishMu sync.Mutex
}

// Ready reports whether the process is serving, not draining, and Readiness holds.
func (p *Process) Ready() bool {
	return p.ready.Load() && (p.Readiness == nil || p.Readiness())
}

// Refresh publishes readiness again on the gRPC health services, after Readiness's
// answer may have changed.
func (p *Process) Refresh() { p.publish() }

// Serve runs the gRPC and admin servers until ctx is done (or one fails), then drains:
// readiness turns NOT_SERVING, streams in flight get Grace to finish, the rest are cut.
// It returns once every stream handler has returned, so every booking is released.
func (p *Process) Serve(ctx context.Context, grpcLn, adminLn net.Listener) error {
	p.publish() // grpc-go's health server starts with "" SERVING: not before Serve says so
	errs := make(chan error, 3)
	go func() { errs <- p.GRPC.Serve(grpcLn) }()
	if p.PlainHealth != nil {
		go func() { errs <- p.PlainHealth.Serve(p.PlainHealthListener) }()
	}
	go func() {
		serve := p.Admin.Serve
		if p.Admin.TLSConfig != nil {
			serve = func(ln net.Listener) error { return p.Admin.ServeTLS(ln, "", "") }
		}
		if err := serve(adminLn); !errors.Is(err, http.ErrServerClosed) {
			errs <- err
		}
	}()
	loopCtx, stopLoops := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	for _, loop := range p.Background {
		loops.Go(func() { loop(loopCtx) })
	}
	defer func() { stopLoops(); loops.Wait() }()
	p.setServing(true)
	attrs := []any{"grpc", grpcLn.Addr().String(), "admin", adminLn.Addr().String()}
	if p.PlainHealth != nil {
		attrs = append(attrs, "plaintext_health", p.PlainHealthListener.Addr().String())
	}
	p.Log.Info("kvroute serving", attrs...)

	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	p.setServing(false)
	p.Log.Info("kvroute draining", "grace", p.Grace.String())
	for _, f := range p.OnDrain {
		f()
	}
	drained := make(chan struct{})
	go func() { p.GRPC.GracefulStop(); close(drained) }()
	cut := false
	select {
	case <-drained:
	case <-time.After(p.Grace):
		p.Log.Warn("shutdown grace expired: cutting streams still in flight")
		cut = true
	}
	// What is left stops side by side: a gRPC server's Stop waits for connections still
	// handshaking (up to HandshakeTimeout), and the admin port has adminGrace, so the
	// shutdown ends at most HandshakeTimeout after the grace, not the sum of them.
	var stopping sync.WaitGroup
	var adminErr error
	stopping.Go(func() { adminErr = p.shutdownAdmin() })
	if p.PlainHealth != nil {
		stopping.Go(p.PlainHealth.Stop)
	}
	if cut {
		p.GRPC.Stop()
	}
	stopping.Wait()
	return errors.Join(err, adminErr)
}

// adminGrace is how long requests on the admin port may finish on shutdown. They are
// short (scrapes, reads); the peers' watch streams end when shutdown starts.
const adminGrace = time.Second

// shutdownAdmin stops the admin server: requests in flight get adminGrace, then every
// connection still open is closed. An HTTP client may hold a connection it dialed
// and never used (Go's transport keeps a dial it raced and lost, in its idle pool);
// net/http counts such a connection as busy for its first 5 s, and it must neither
// stall the shutdown nor fail it.
func (p *Process) shutdownAdmin() error {
	ctx, cancel := context.WithTimeout(context.Background(), adminGrace)
	defer cancel()
	err := p.Admin.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		p.Log.Info("admin: closing the connections still open after the grace", "grace", adminGrace.String())
		err = p.Admin.Close()
	}
	return err
}

func (p *Process) setServing(on bool) {
	p.ready.Store(on)
	p.publish()
}

// publish sets every health service from the current readiness; liveness is SERVING
// whenever the process runs. Serialised, so that a stale answer never overwrites a
// newer one.
func (p *Process) publish() {
	p.publishMu.Lock()
	defer p.publishMu.Unlock()
	status := healthpb.HealthCheckResponse_NOT_SERVING
	if p.Ready() {
		status = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range HealthServices {
		if svc == "liveness" {
			p.Health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
			continue
		}
		p.Health.SetServingStatus(svc, status)
	}
}
