package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// SGLang's session endpoints (-api sglang-session), sent through the data plane as the
// turns are: kvroute routes an open by load and learns the id its answer gives, and
// sends the session's turns and its close to the engine that opened it.

// openSession opens s's session (POST /open_session) and keeps the id the engine
// answers (a JSON string).
func (g *generator) openSession(ctx context.Context, url string, s *session) error {
	// capacity_of_str_len is required by SGLang and not enforced by it (nor by the
	// mock): the session's longest prompt, at 8 characters a token.
	body := []byte(`{"capacity_of_str_len":` + strconv.Itoa(8*(g.w.maxPromptTokens+g.w.outputTokens)) + `}`)
	answer, err := g.sessionControl(ctx, url, "/open_session", body)
	if err != nil {
		return err
	}
	var id string
	if err := json.Unmarshal(answer, &id); err != nil || id == "" {
		return fmt.Errorf("/open_session answered %.300q, not a session id", answer)
	}
	s.id = id
	g.cur.Load().opened.Add(1)
	return nil
}

// closeSession closes s's session (POST /close_session).
func (g *generator) closeSession(ctx context.Context, url string, s *session) error {
	body, _ := json.Marshal(map[string]string{"session_id": s.id})
	if _, err := g.sessionControl(ctx, url, "/close_session", body); err != nil {
		return err
	}
	g.cur.Load().closed.Add(1)
	return nil
}

// sessionControl sends one session request and returns its 200's body.
func (g *generator) sessionControl(ctx context.Context, url, path string, body []byte) ([]byte, error) {
	g.sessionControls.Add(1)
	ctx, cancel := context.WithTimeout(ctx, g.w.requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", path, resp.Status, answer)
	}
	return answer, nil
}
