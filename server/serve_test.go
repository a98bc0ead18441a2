package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// serve runs a process with a gRPC health server and an empty admin server on
// loopback listeners; stop ends Serve and returns its error.
func serve(t *testing.T, readiness func() bool) (p *Process, grpcAddr, adminAddr string, stop func() error) {
	t.Helper()
	p = &Process{GRPC: grpc.NewServer(), Health: grpchealth.NewServer(), Admin: &http.Server{},
		Grace: time.Second, Log: slog.New(slog.DiscardHandler), Readiness: readiness}
	healthpb.RegisterHealthServer(p.GRPC, p.Health)
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, grpcLn, adminLn) }()
	return p, grpcLn.Addr().String(), adminLn.Addr().String(), func() error { cancel(); return <-done }
}

func TestReadinessWaitsForItsConditionLivenessDoesNot(t *testing.T) {
	var discovered atomic.Bool
	p, grpcAddr, _, stop := serve(t, discovered.Load)
	defer func() { require.NoError(t, stop()) }()

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	status := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		require.NoError(t, err)
		return resp.GetStatus()
	}
	serving, notServing := healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	// Serve has published once liveness is up.
	require.Eventually(t, func() bool { return status("liveness") == serving }, time.Minute, 5*time.Millisecond)
	for _, svc := range []string{"", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		assert.Equal(t, notServing, status(svc), "%q before discovery", svc)
	}
	assert.False(t, p.Ready())

	discovered.Store(true)
	p.Refresh()
	for _, svc := range HealthServices {
		assert.Equal(t, serving, status(svc), "%q once discovered", svc)
	}
	assert.True(t, p.Ready())

	discovered.Store(false) // e.g. the pool scaled to zero
	p.Refresh()
	assert.Equal(t, notServing, status("readiness"))
	assert.Equal(t, serving, status("liveness"), "liveness stays up")
}

// TestAnUnusedAdminConnectionDoesNotFailTheShutdown: a client that opened a connection
// to the admin port and sent nothing (an HTTP transport's spare dial) neither fails
// Serve's return nor holds it: the connection is closed after the admin grace.
func TestAnUnusedAdminConnectionDoesNotFailTheShutdown(t *testing.T) {
	p, _, adminAddr, stop := serve(t, nil)
	idle, err := net.Dial("tcp", adminAddr)
	require.NoError(t, err)
	defer idle.Close()
	require.Eventually(t, p.Ready, time.Minute, 5*time.Millisecond, "serving")
	require.NoError(t, stop(), "a clean shutdown")
	_ = idle.SetReadDeadline(time.Now().Add(time.Minute))
	_, err = idle.Read(make([]byte, 1))
	assert.Error(t, err, "the unused connection was closed")
}

// serveWithSilentClient serves p (Grace 10 ms) on loopback listeners with a TCP client
// connected to the ext_proc port that sends nothing: the server has accepted it (its
// HTTP/2 settings frame came) and waits for the client's preface, for up to
// HandshakeTimeout. stop ends Serve's context; done receives Serve's error.
func serveWithSilentClient(t *testing.T, p *Process) (silent net.Conn, adminAddr string, stop func(), done <-chan error) {
	t.Helper()
	p.Admin, p.Grace = &http.Server{}, 10*time.Millisecond
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, grpcLn, adminLn) }()
	require.Eventually(t, p.Ready, time.Minute, 5*time.Millisecond, "serving")
	silent, err = net.Dial("tcp", grpcLn.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { silent.Close() })
	// The server's settings frame (9 bytes of header first) says it accepted the
	// connection and waits for the client's preface: the case under test.
	_ = silent.SetReadDeadline(time.Now().Add(time.Minute))
	_, err = io.ReadFull(silent, make([]byte, 9))
	require.NoError(t, err)
	return silent, adminLn.Addr().String(), cancel, served
}

// TestAConnectionThatNeverHandshakesDoesNotHoldTheShutdown: a TCP connection to the
// ext_proc port that sends nothing (a port probe, a stalled client) is closed after
// HandshakeTimeout, so Serve returns after the grace plus at most that; with grpc-go's
// default it held the shutdown for two minutes.
func TestAConnectionThatNeverHandshakesDoesNotHoldTheShutdown(t *testing.T) {
	silent, _, stop, done := serveWithSilentClient(t, New(nil, 1<<20, slog.New(slog.DiscardHandler), nil))
	stop()
	// The bound is the test's safety net, far above HandshakeTimeout and far below the
	// 120 s the connection held the shutdown before.
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the shutdown waits for a connection that never handshakes")
	}
	_ = silent.SetReadDeadline(time.Now().Add(time.Minute))
	_, err := io.ReadAll(silent)
	var netErr net.Error
	assert.False(t, errors.As(err, &netErr) && netErr.Timeout(), "the silent connection was closed: %v", err)
}

// TestThePortsLeftCloseWhileTheGRPCStopWaitsForAHandshake: past the grace, the admin
// port's shutdown and the plaintext health server's Stop run beside the ext_proc
// server's Stop, which waits up to HandshakeTimeout for a connection that never
// handshakes; one after the other, a shutdown took the grace plus HandshakeTimeout, plus
// the admin grace, plus another HandshakeTimeout for a silent plaintext-health client.
func TestThePortsLeftCloseWhileTheGRPCStopWaitsForAHandshake(t *testing.T) {
	p := New(nil, 1<<20, slog.New(slog.DiscardHandler), nil)
	p.PlainHealth = grpc.NewServer(grpc.ConnectionTimeout(HandshakeTimeout))
	healthpb.RegisterHealthServer(p.PlainHealth, p.Health)
	var err error
	p.PlainHealthListener, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	silent, adminAddr, stop, done := serveWithSilentClient(t, p)
	stop()
	closed := func(addr string) func() bool {
		return func() bool {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return true
			}
			conn.Close()
			return false
		}
	}
	for _, port := range []struct{ name, addr string }{
		{"admin", adminAddr},
		{"plaintext health", p.PlainHealthListener.Addr().String()},
	} {
		require.Eventually(t, closed(port.addr), time.Minute, 5*time.Millisecond, "the %s port closes", port.name)
	}
	select {
	case err := <-done:
		t.Fatalf("the ports closed only as Serve returned (%v): they waited for the ext_proc server's Stop", err)
	default:
	}
	silent.Close() // ends the handshake, and with it the Stop
	require.NoError(t, <-done)
}
