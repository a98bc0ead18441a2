package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/internal/testcerts"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/server"
)

// TestTLSAndMTLSOnTheExtProcListener: with `tls` set, Envoy reaches kvroute over mTLS;
// a data plane without TLS, or without a client certificate, fails closed (and reaches no
// worker); a rotated certificate is served to the next connection; gRPC health is also
// served in plaintext on health_address for kubelet probes, and only health.
func TestTLSAndMTLSOnTheExtProcListener(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA := testcerts.NewCA(t, "server CA"), testcerts.NewCA(t, "client CA")
	certPEM, keyPEM := serverCA.Server(t, "kvroute")
	envoyCert := clientCA.Client(t, "envoy")
	d := deployEnvoy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
		c.TLS = server.TLSConfig{
			CertFile:     testcerts.Write(t, dir, "tls.crt", certPEM),
			KeyFile:      testcerts.Write(t, dir, "tls.key", keyPEM),
			ClientCAFile: testcerts.Write(t, dir, "ca.crt", clientCA.CertPEM),
		}
		c.HealthAddress = "127.0.0.1:0"
	}, func(c *envoytest.Config) {
		c.ProcessorTLS = &tls.Config{RootCAs: serverCA.Pool(), Certificates: []tls.Certificate{envoyCert}, MinVersion: tls.VersionTLS12}
	}, discardLogger())
	defer d.stop()

	code, body := d.chat(t, context.Background(), "over mTLS", false)
	require.Equal(t, http.StatusOK, code, body)

	// Data planes kvroute must refuse; each fails closed.
	for name, pt := range map[string]*tls.Config{
		"plaintext":                    nil,
		"TLS without a client cert":    {RootCAs: serverCA.Pool(), MinVersion: tls.VersionTLS12},
		"a client cert of another CA":  {RootCAs: serverCA.Pool(), Certificates: []tls.Certificate{serverCA.Client(t, "intruder")}, MinVersion: tls.VersionTLS12},
		"not trusting the server's CA": {RootCAs: clientCA.Pool(), Certificates: []tls.Certificate{envoyCert}, MinVersion: tls.VersionTLS12},
	} {
		plane := envoytest.NewServer(envoytest.Config{ProcessorAddress: d.grpcAddr, ProcessorTLS: pt, MessageTimeout: time.Minute,
			ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED}})
		resp, err := plane.Client().Post(plane.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"qwen","messages":[{"role":"user","content":"let me in"}]}`))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, name)
		require.NoError(t, plane.Close())
		assert.Empty(t, plane.Exchanges()[0].Upstream, "%s: reached no worker", name)
	}

	// Rotate the server certificate: the next connection is served the new one.
	rotatedCA := testcerts.NewCA(t, "rotated server CA")
	certPEM, keyPEM = rotatedCA.Server(t, "kvroute")
	testcerts.Write(t, dir, "tls.crt", certPEM)
	testcerts.Write(t, dir, "tls.key", keyPEM)
	plane := envoytest.NewServer(envoytest.Config{ProcessorAddress: d.grpcAddr, MessageTimeout: time.Minute, SendProtocolConfig: true,
		ProcessorTLS:   &tls.Config{RootCAs: rotatedCA.Pool(), Certificates: []tls.Certificate{envoyCert}, MinVersion: tls.VersionTLS12},
		ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED, ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED}})
	defer func() { assert.NoError(t, plane.Close()) }()
	resp, err := plane.Client().Post(plane.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"qwen","messages":[{"role":"user","content":"after the rotation"}]}`))
	require.NoError(t, err)
	// Read to its end: the data plane passes the response's headers on as soon as their
	// reply is applied (as Envoy does), and the booking is released at the response's
	// end; closing early cancels the stream, whose release comes after requireNoLoad.
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the rotated certificate, without a restart")

	// kubelet's plaintext gRPC probe.
	conn, err := grpc.NewClient(d.healthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	for _, svc := range server.HealthServices {
		h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		require.NoError(t, err, svc)
		assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.GetStatus(), svc)
	}
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(context.Background())
	if err == nil {
		_, err = stream.Recv()
	}
	assert.Equal(t, codes.Unimplemented, status.Code(err), "the plaintext port serves health alone, never ext_proc")
	d.requireNoLoad(t)
}

// TestStartupWarnsWhenTheAdminPortTakesRemoteChanges: kvroute logs a warning at start
// when PUT /policy and POST /reload are open to clients beyond loopback, and only then.
func TestStartupWarnsWhenTheAdminPortTakesRemoteChanges(t *testing.T) {
	tests := []struct {
		address string
		remote  bool
		warned  bool
	}{
		{"0.0.0.0:9090", true, true},
		{":9090", true, true},
		{"127.0.0.1:9090", true, false},
		{"0.0.0.0:9090", false, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s remote=%t", tt.address, tt.remote), func(t *testing.T) {
			cfg := config.Default()
			cfg.Router.Workers = []router.Worker{{Name: "w", Address: "127.0.0.1:1"}}
			cfg.Tokenizers = approxTokenizersConfig()
			cfg.AdminAddress, cfg.AdminRemoteChanges = tt.address, tt.remote
			logs := &lockedBuffer{}
			_, err := build(cfg, nil, slog.New(slog.NewJSONHandler(logs, nil)))
			require.NoError(t, err)
			warned := strings.Contains(logs.String(), `"level":"WARN","msg":"admin port: PUT /policy and POST /reload are accepted from any client`)
			assert.Equal(t, tt.warned, warned, logs.String())
		})
	}
}
