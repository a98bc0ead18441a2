// Package policyapi is kvroute's runtime policy API on the admin port: read the cost
// parameters in force, and change some of them without a restart. A change applies to
// the next decision and is not written back to the config file: a restart returns to
// the file's policy.
//
//	GET /policy                        → 200 {"overlap_credit": 1, …}
//	PUT /policy {"prefix_affinity_weight": 2}
//	                                   → 200 the whole new policy
//	                                   → 400 {"error": "policy.prefix_affinity_weight: …"}
package policyapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/scoring"
)

// maxBody bounds an update's body: a full policy is a few hundred bytes.
const maxBody = 64 << 10

// DefaultBodyTimeout is how long an update's body may take to arrive.
const DefaultBodyTimeout = 10 * time.Second

// Config is what the handler serves.
type Config struct {
	Policy *scoring.Policy
	// ReadOnly, when not empty, refuses updates with 409 and this reason (e.g. the
	// picker in use has no cost parameters).
	ReadOnly string
	Logger   *slog.Logger
	// Metrics receives kvroute_policy_updates_total; nil records nothing.
	Metrics *Metrics
	// BodyTimeout bounds the time an update's body takes to arrive, so a client that
	// sends it slowly cannot hold a connection (the admin server bounds only the
	// headers); 0 is DefaultBodyTimeout.
	BodyTimeout time.Duration
}

// Handler returns the /policy handler. Mount it on the admin port only: anyone who can
// reach it can change routing.
func Handler(cfg Config) (http.Handler, error) {
	if cfg.Policy == nil {
		return nil, errors.New("policyapi: a Policy is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	h := &handler{cfg: cfg}
	return h, nil
}

type handler struct {
	cfg Config
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		writeJSON(w, http.StatusOK, h.cfg.Policy.Params())
	case http.MethodPut, http.MethodPatch:
		h.update(w, r)
	default:
		w.Header().Set("Allow", "GET, HEAD, PUT, PATCH")
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed: GET reads the policy, PUT changes the keys it names", r.Method))
	}
}

func (h *handler) update(w http.ResponseWriter, r *http.Request) {
	if h.cfg.ReadOnly != "" {
		h.cfg.Metrics.updated("rejected")
		writeError(w, http.StatusConflict, h.cfg.ReadOnly)
		return
	}
	// Not every ResponseWriter can set a deadline (a handler test's recorder cannot);
	// the admin server's can.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(h.cfg.BodyTimeout))
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		h.cfg.Metrics.updated("rejected")
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", maxBody))
			return
		}
		writeError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	before, after, err := h.cfg.Policy.Update(raw)
	if err != nil {
		h.cfg.Metrics.updated("rejected")
		var fe *scoring.FieldError
		if errors.As(err, &fe) {
			err = fmt.Errorf("policy.%w", err)
		}
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	h.cfg.Metrics.updated("applied")
	h.cfg.Logger.Info("policy updated", "before", before, "after", after, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, after)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
