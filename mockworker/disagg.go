package mockworker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/sim"
)

// Disaggregated prefill/decode, as vLLM's NIXL connector and llm-d's routing sidecar
// (connector nixlv2) do it. A prefill worker is asked with kv_transfer_params
// {do_remote_decode: true} and answers its one token with kv_transfer_params saying
// where the KV is; the decode worker gets the original request with those
// kv_transfer_params (do_remote_prefill: true), reads the KV and decodes.

// kvTransferParams is what the worker reads of a request's kv_transfer_params.
type kvTransferParams struct {
	// DoRemoteDecode: this worker is the prefill worker; its answer tells the decode
	// worker where the KV is.
	DoRemoteDecode bool `json:"do_remote_decode"`
	// DoRemotePrefill: another worker computed the prompt's KV; this one reads it.
	DoRemotePrefill bool `json:"do_remote_prefill"`
	// RemoteEngineID names the prefill worker, kept raw: it is only reported.
	RemoteEngineID json.RawMessage `json:"remote_engine_id"`
}

// Limits on what is read of a prefill worker's answer.
const (
	maxPrefillAnswer = 1 << 20 // bytes
	maxEngineID      = 256     // bytes of remote_engine_id reported in x-prefilled-by
)

// prefillLegParams are the kv_transfer_params of the sidecar's request to the prefill
// worker, llm-d's.
var prefillLegParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// newPrefillClient is the sidecar's client: it does not follow redirects (a prefill
// worker that redirects answered wrongly, and the sidecar goes nowhere else).
func newPrefillClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Transport:     http.DefaultTransport.(*http.Transport).Clone(),
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// checkHostPort reports why v is not a prefill worker's host:port (a host name or IP
// and a port in 1–65535, nothing else), for the 400 answer.
func checkHostPort(v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want 1-65535", port)
	}
	// A host with '/', '@', spaces and the like would make another URL than it says.
	if u, err := url.Parse("http://" + v); host == "" || err != nil || u.Host != v {
		return errors.New("not a host:port")
	}
	return nil
}

// remotePrefill is the sidecar's prefill leg: it sends the request body to the prefill
// worker at hostPort, on r's path, with llm-d's changes (kv_transfer_params for a
// remote decode, stream false, no stream_options, and the output capped at one token:
// max_tokens 1 and, when the client set it, max_completion_tokens 1, as later sidecars
// do, since an engine prefers it to max_tokens; for vLLM's token-in generate, whose
// limits are in sampling_params, its max_tokens and min_tokens 1, as llm-d's
// tokenLimitMap has them). It returns the prefill worker's name for x-prefilled-by: its
// remote_engine_id, or hostPort when its answer has none (the sidecar goes on without
// kv_transfer_params, as llm-d does). On failure it returns the status to answer: the
// prefill worker's 4xx or 5xx, or 502 if it could not be reached or answered anything
// else. The answer is read as untrusted: 1 MiB at most, and a JSON object whose
// kv_transfer_params, if any, is an object.
func (s *Server) remotePrefill(r *http.Request, body []byte, hostPort string) (prefilledBy string, status int, err error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return "", http.StatusBadRequest, fmt.Errorf("invalid JSON: %v", err)
	}
	fields["kv_transfer_params"] = prefillLegParams
	fields["stream"] = json.RawMessage("false")
	delete(fields, "stream_options")
	if r.URL.Path == generatePath {
		// llm-d's sidecar replaces sampling_params that is not an object with one of the
		// two caps; the worker has refused such a body before this.
		var params map[string]json.RawMessage
		_ = json.Unmarshal(fields["sampling_params"], &params)
		if params == nil {
			params = map[string]json.RawMessage{}
		}
		params["max_tokens"], params["min_tokens"] = json.RawMessage("1"), json.RawMessage("1")
		capped, err := json.Marshal(params)
		if err != nil {
			return "", http.StatusBadRequest, err
		}
		fields["sampling_params"] = capped
	} else {
		fields["max_tokens"] = json.RawMessage("1")
		if _, ok := fields["max_completion_tokens"]; ok {
			fields["max_completion_tokens"] = json.RawMessage("1")
		}
	}
	leg, err := json.Marshal(fields)
	if err != nil {
		return "", http.StatusBadRequest, err
	}
	target := (&url.URL{Scheme: "http", Host: hostPort, Path: r.URL.Path}).String()
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, target, bytes.NewReader(leg))
	if err != nil {
		return "", http.StatusBadGateway, fmt.Errorf("prefill worker %s: %v", hostPort, err)
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-request-id", requestID(r))
	if auth := r.Header.Get("Authorization"); auth != "" {
		req.Header.Set("Authorization", auth) // a vLLM started with --api-key wants it
	}
	resp, err := s.prefillClient.Do(req)
	if err != nil {
		return "", http.StatusBadGateway, fmt.Errorf("prefill worker %s: %v", hostPort, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		status := resp.StatusCode
		if status < 400 || status > 599 {
			status = http.StatusBadGateway
		}
		return "", status, fmt.Errorf("prefill worker %s answered %d", hostPort, resp.StatusCode)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer+1))
	switch {
	case err != nil:
		return "", http.StatusBadGateway, fmt.Errorf("prefill worker %s: read the answer: %v", hostPort, err)
	case len(raw) > maxPrefillAnswer:
		return "", http.StatusBadGateway, fmt.Errorf("prefill worker %s: answer over %d bytes", hostPort, maxPrefillAnswer)
	}
	var answer map[string]json.RawMessage
	if err := json.Unmarshal(raw, &answer); err != nil || answer == nil {
		return "", http.StatusBadGateway, fmt.Errorf("prefill worker %s: the answer is not a JSON object", hostPort)
	}
	kv, ok := answer["kv_transfer_params"]
	if !ok || string(kv) == "null" {
		return hostPort, 0, nil
	}
	var params kvTransferParams
	if err := json.Unmarshal(kv, &params); err != nil {
		return "", http.StatusBadGateway, fmt.Errorf("prefill worker %s: kv_transfer_params is not an object of its fields", hostPort)
	}
	if id := engineID(params.RemoteEngineID); id != "" {
		return id, 0, nil
	}
	return hostPort, 0, nil
}

// requestID is the client's x-request-id, or a new one for the prefill leg.
func requestID(r *http.Request) string {
	if id := r.Header.Get("x-request-id"); id != "" {
		return id
	}
	return rand.Text()
}

// engineID returns raw's string if it is a short printable one (it goes out in a
// response header), else "".
func engineID(raw json.RawMessage) string {
	var id string
	if json.Unmarshal(raw, &id) != nil || id == "" || len(id) > maxEngineID {
		return ""
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return ""
		}
	}
	return id
}

// waitTransfer waits, scaled by Speed as the engine's passes are, the time the decode
// engine takes to read the prompt's KV from the prefill worker: sim.TransferTime of
// the tokens its own prefix cache (wk.rank's) lacks. It reports false if ctx ended
// first.
func (s *Server) waitTransfer(ctx context.Context, wk work) bool {
	s.mu.Lock()
	cached := wk.rank.engine.CachedPrefixTokens(wk.prompt, wk.salt())
	s.mu.Unlock()
	select {
	case <-s.after(time.Duration(float64(sim.TransferTime(len(wk.prompt)-cached)) / s.cfg.Speed)):
		return true
	case <-ctx.Done():
		return false
	}
}

// prefillParams are the kv_transfer_params of a prefill worker's answer, as vLLM's NIXL
// connector writes them: where the decode worker reads the KV. host is the request's
// Host; remote_block_ids, the indices of the prompt's blocks, are informational.
func (s *Server) prefillParams(host string, prompt int) map[string]any {
	port := 0
	if h, p, err := net.SplitHostPort(host); err == nil {
		host = h
		port, _ = strconv.Atoi(p)
	}
	blocks := make([]int, (prompt+s.cfg.Engine.BlockSize-1)/s.cfg.Engine.BlockSize)
	for i := range blocks {
		blocks[i] = i
	}
	return map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": s.cfg.Name,
		"remote_block_ids": blocks, "remote_host": host, "remote_port": port, "tp_size": 1,
	}
}
