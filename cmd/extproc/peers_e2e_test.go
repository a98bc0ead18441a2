package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/internal/testcerts"
	"github.com/kvroute/kvroute/peers"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/server"
)

// TestReplicasCountEachOthersBookings: two kvroute replicas in front of the same
// workers, each with its own data plane, list each other as peers. A request routed by
// replica A and still waiting for its first token shows in B's decisions as the load of
// its worker (P and W), so B sends new prompts elsewhere; when it ends, B sees the
// worker idle again. Without the exchange B sees no load on it at all. Both share a
// peers.token_file: the report is not served without it. Over mutual TLS (admin_tls
// with a client CA, peers.tls with a client certificate) the same holds, and the admin
// port serves no one in plain HTTP or without a client certificate.
func TestReplicasCountEachOthersBookings(t *testing.T) {
	for _, tt := range []struct {
		name      string
		mutualTLS bool
	}{
		{"plain HTTP", false},
		{"mutual TLS", true},
	} {
		t.Run(tt.name, func(t *testing.T) { replicasCountEachOthersBookings(t, tt.mutualTLS) })
	}
}

func replicasCountEachOthersBookings(t *testing.T, mutualTLS bool) {
	const buffered, streamed = extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED
	const secret = "e2e-peers-secret-0123456789"
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(secret+"\n"), 0o600))
	var adminTLS server.TLSConfig
	var peersTLS peers.TLSConfig
	var adminClient *http.Client // Prometheus, say: trusts the admin CA, holds a client certificate
	if mutualTLS {
		adminCA, clientCA := testcerts.NewCA(t, "admin CA"), testcerts.NewCA(t, "client CA")
		serverCert, serverKey := adminCA.Server(t, "kvroute-peers")
		replicaCert, replicaKey := clientCA.ClientPEM(t, "kvroute")
		adminTLS = server.TLSConfig{
			CertFile:     testcerts.Write(t, dir, "admin.crt", serverCert),
			KeyFile:      testcerts.Write(t, dir, "admin.key", serverKey),
			ClientCAFile: testcerts.Write(t, dir, "client-ca.crt", clientCA.CertPEM),
		}
		peersTLS = peers.TLSConfig{
			CAFile:   testcerts.Write(t, dir, "admin-ca.crt", adminCA.CertPEM),
			CertFile: testcerts.Write(t, dir, "replica.crt", replicaCert),
			KeyFile:  testcerts.Write(t, dir, "replica.key", replicaKey),
		}
		adminClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: adminCA.Pool(), Certificates: []tls.Certificate{clientCA.Client(t, "prometheus")}, MinVersion: tls.VersionTLS12}}}
		t.Cleanup(adminClient.CloseIdleConnections)
	}
	adminB, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	withPeers := func(peer string) func(*config.Config) {
		return func(c *config.Config) {
			c.Explain = explain.Config{Enabled: true, Header: "x-why", SampleRate: 1, Buffer: 2}
			// 2 s before a silent peer is dropped: a loaded CI machine may answer late.
			c.Peers.Addresses, c.Peers.StaleAfter, c.Peers.TokenFile = []string{peer}, 2*time.Second, tokenFile
			c.AdminTLS, c.Peers.TLS = adminTLS, peersTLS
		}
	}
	a := deploy(t, buffered, streamed, withPeers(adminB.Addr().String()))
	defer a.stop()
	a.admin = adminClient
	cfgB := a.next
	adminA := a.adminURL[strings.Index(a.adminURL, "://")+3:]
	withPeers(adminA)(&cfgB)
	b := &deployment{workers: a.workers, byAddress: a.byAddress, next: cfgB, log: discardLogger(), admin: adminClient}
	grpcB, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b.serve(t, grpcB, adminB)
	defer b.stop()
	b.startEnvoy(t, buffered, streamed, nil)
	if mutualTLS {
		resp, err := http.Get("http://" + adminA + "/metrics")
		if err == nil {
			resp.Body.Close()
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "no plain HTTP on a TLS admin port")
		}
		noClientCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: adminClient.Transport.(*http.Transport).TLSClientConfig.RootCAs, MinVersion: tls.VersionTLS12}}}
		defer noClientCert.CloseIdleConnections()
		if resp, err := noClientCert.Get(a.adminURL + "/metrics"); err == nil {
			resp.Body.Close()
			t.Fatalf("a client without a certificate of the client CA was served: %s", resp.Status)
		}
	}

	// A's request hangs before its first token: its worker has prefill load on A.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hung := make(chan error, 1)
	go func() {
		_, err := a.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("HANG_BEFORE_FIRST_TOKEN " + strings.Repeat("a long prompt ", 40))}})
		hung <- err
	}()
	resp, err := a.adminClient().Get(a.adminURL + peers.Path)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "no report without the secret")
	var busy peers.WorkerLoad
	require.Eventually(t, func() bool {
		report := readPeerLoad(t, a.adminClient(), a.adminURL, secret)
		if len(report.Workers) == 1 {
			busy = report.Workers[0]
		}
		return busy.PendingRequests == 1
	}, 10*time.Second, 10*time.Millisecond, "A serves its booking at /peers/load")
	require.Positive(t, busy.PrefillTokens)

	askB := func(text string) explain.Trace {
		t.Helper()
		var resp *http.Response
		_, err := b.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}},
			option.WithHeader("x-why", "1"), option.WithResponseInto(&resp))
		require.NoError(t, err)
		var tr explain.Trace
		require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &tr))
		return tr
	}
	candidate := func(tr explain.Trace, worker string) explain.Candidate {
		for _, c := range tr.Candidates {
			if c.Worker == worker {
				return c
			}
		}
		t.Fatalf("no candidate %s in %+v", worker, tr)
		return explain.Candidate{}
	}
	var seen explain.Candidate
	var tr explain.Trace
	for i := 0; i < 200 && seen.PendingRequests == 0; i++ { // changes go out within 10 ms: a few requests
		tr = askB(strings.Repeat("a prompt of its own ", 10+i))
		seen = candidate(tr, busy.Worker)
	}
	assert.Equal(t, 1, seen.PendingRequests, "B counts A's request waiting on the worker")
	assert.Equal(t, int(busy.PrefillTokens), seen.PrefillTokens, "B counts A's prefill tokens there")
	assert.Equal(t, 1, seen.ActiveRequests)
	assert.NotEqual(t, busy.Worker, tr.Worker, "B sends its prompt to an idle worker")
	assert.Equal(t, 1.0, b.gaugeSum(t, "kvroute_peers_live"))

	cancel()
	require.Error(t, <-hung)
	require.Eventually(t, func() bool {
		c := candidate(askB("after A's request ended"), busy.Worker)
		return c.PendingRequests == 0 && c.ActiveRequests == 0 && c.PrefillTokens == 0
	}, 10*time.Second, 20*time.Millisecond, "A's release reaches B")
	a.requireNoLoad(t)
	b.requireNoLoad(t)
}

func readPeerLoad(t *testing.T, client *http.Client, adminURL, token string) peers.Report {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, adminURL+peers.Path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	r, err := peers.ParseReport(resp.Body)
	require.NoError(t, err)
	return r
}

// TestStartupWarnsWhenPeersCannotReachTheAdminPort: peers read a replica's load on its
// admin port, so with peers elsewhere and the admin port on loopback (its default)
// kvroute warns at start; peers on loopback too (replicas on one host) need no warning.
func TestStartupWarnsWhenPeersCannotReachTheAdminPort(t *testing.T) {
	tests := []struct {
		name   string
		admin  string
		peers  []string
		dns    string
		warned bool
	}{
		{"peers by DNS, admin on loopback", "127.0.0.1:9090", nil, "kvroute-peers:9090", true},
		{"a peer elsewhere, admin on loopback", "[::1]:9090", []string{"127.0.0.1:9091", "10.0.0.2:9090"}, "", true},
		{"peers by DNS, admin on every address", "0.0.0.0:9090", nil, "kvroute-peers:9090", false},
		{"peers on loopback too", "127.0.0.1:9090", []string{"127.0.0.1:9091"}, "", false},
		{"no peers", "127.0.0.1:9090", nil, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Router.Workers = []router.Worker{{Name: "w", Address: "127.0.0.1:1"}}
			cfg.Tokenizers = approxTokenizersConfig()
			cfg.AdminAddress = tt.admin
			cfg.Peers.Addresses, cfg.Peers.DNS = tt.peers, tt.dns
			logs := &lockedBuffer{}
			_, err := build(cfg, nil, slog.New(slog.NewJSONHandler(logs, nil)))
			require.NoError(t, err)
			warned := strings.Contains(logs.String(), `"level":"WARN","msg":"peers: admin_address listens on loopback only`)
			assert.Equal(t, tt.warned, warned, logs.String())
		})
	}
}

// TestReplicasFindThePromptsEachOtherPlaced: two kvroute replicas without KV events
// (each index knows only the decisions it hears of) list each other as peers. A
// conversation's first turn goes through replica A; its next turn, sent by Envoy to
// replica B, goes to the worker A chose, which B knows holds its prefix: A's report
// carried the decision's blocks (peers.share_blocks) and B stored them; and B knows
// the session's worker (x-session-id) for a compacted prompt that shares no block.
// With share_blocks off, B has never heard of the prompt or the session.
func TestReplicasFindThePromptsEachOtherPlaced(t *testing.T) {
	const buffered, streamed = extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED
	for _, share := range []bool{true, false} {
		t.Run(fmt.Sprint("share_blocks=", share), func(t *testing.T) {
			a, b := deployPeers(t, buffered, streamed, func(c *config.Config) {
				c.Explain = explain.Config{Enabled: true, Header: "x-why", SampleRate: 1, Buffer: 2}
				c.Peers.ShareBlocks = share
			})
			defer a.stop()
			defer b.stop()

			ask := func(d *deployment, session string, history []openai.ChatCompletionMessageParamUnion) explain.Trace {
				t.Helper()
				var resp *http.Response
				_, err := d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen", Messages: history},
					option.WithHeader("x-why", "1"), option.WithHeader("x-session-id", session), option.WithResponseInto(&resp))
				require.NoError(t, err)
				var tr explain.Trace
				require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &tr))
				return tr
			}
			history := []openai.ChatCompletionMessageParamUnion{
				openai.SystemMessage("You review SQL. " + strings.Repeat("Every query is checked for injection, indexes and plans. ", 12)),
				openai.UserMessage("Is this query safe?"),
			}
			first := ask(a, "conv-7", history)
			other := ask(a, "conv-9", []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Another conversation, " + strings.Repeat("about indexes ", 30))})
			if share {
				require.Eventually(t, func() bool { return b.counter(t, "kvroute_peers_records_received_total", `{result="stored"}`) == "2" },
					10*time.Second, 10*time.Millisecond, "A's decisions reach B")
			}
			sessionWorker := func(tr explain.Trace) string {
				for _, c := range tr.Candidates {
					if c.SessionWorker {
						return c.Worker
					}
				}
				return ""
			}
			history = append(history, openai.AssistantMessage("It is."), openai.UserMessage("And this one?"))
			next := ask(b, "conv-7", history)
			// The other conversation compacted: a summary shares no block with its first
			// turn; only the session (x-session-id) links them.
			compacted := ask(b, "conv-9", []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Summary: indexes were discussed. Next?")})
			if !share {
				assert.Zero(t, next.PredictedCachedTokens, "B knows only its own decisions")
				assert.Empty(t, sessionWorker(compacted), "nor the sessions A routed")
				assert.Equal(t, "0", b.counter(t, "kvroute_peers_records_received_total", `{result="stored"}`))
				return
			}
			assert.Equal(t, other.Worker, sessionWorker(compacted), "B knows which worker served the session last")
			// B's admin port says whom it hears, and where A's records stand.
			var status struct {
				Peers []peers.PeerStatus `json:"peers"`
			}
			resp, err := http.Get(b.adminURL + "/peers")
			require.NoError(t, err)
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&status))
			resp.Body.Close()
			require.Len(t, status.Peers, 1)
			assert.True(t, status.Peers[0].Live)
			assert.GreaterOrEqual(t, status.Peers[0].RecordsAfter, uint64(2), "A's two decisions")
			assert.Equal(t, first.Worker, next.Worker, "the next turn goes to the worker holding the conversation")
			assert.Positive(t, next.PredictedCachedTokens, "B knows what A placed there")
			assert.Equal(t, first.Blocks, next.PredictedCachedTokens/a.next.Router.BlockSize, "B holds all of the first turn's blocks there")
		})
	}
}

// deployPeers deploys two kvroute replicas, each behind its own data plane, in front of
// the same three workers, each listing the other as its peer (stale after 2 s), edit
// applied to both configs; it returns once they watch each other. Stop both.
func deployPeers(t *testing.T, reqMode, respMode extprocfilterv3.ProcessingMode_BodySendMode, edit func(*config.Config)) (a, b *deployment) {
	t.Helper()
	adminB, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	withPeer := func(peer string) func(*config.Config) {
		return func(c *config.Config) {
			c.Peers.Addresses, c.Peers.StaleAfter = []string{peer}, 2*time.Second
			if edit != nil {
				edit(c)
			}
		}
	}
	a = deploy(t, reqMode, respMode, withPeer(adminB.Addr().String()))
	cfgB := a.next
	withPeer(strings.TrimPrefix(a.adminURL, "http://"))(&cfgB)
	b = &deployment{workers: a.workers, byAddress: a.byAddress, next: cfgB, log: discardLogger()}
	grpcB, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b.serve(t, grpcB, adminB)
	b.startEnvoy(t, reqMode, respMode, nil)
	require.Eventually(t, func() bool {
		return b.gaugeSum(t, "kvroute_peers_live") == 1 && a.gaugeSum(t, "kvroute_peers_live") == 1
	}, 10*time.Second, 10*time.Millisecond, "the replicas watch each other")
	return a, b
}
