package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/session"
	"github.com/kvroute/kvroute/tokenize"
)

// TestARequestNamingAStoredResponseGoesToTheWorkerThatStoredIt: vLLM keeps Responses
// API responses in each engine's memory, so a request naming one (previous_response_id,
// or GET/cancel of its id) is sent to the worker that stored it, busy or out for a
// back-off; one whose response kvroute never saw, or whose worker cannot take it, is
// routed by load as any other.
func TestARequestNamingAStoredResponseGoesToTheWorkerThatStoredIt(t *testing.T) {
	tests := []struct {
		name       string
		id         string   // the id the second request names
		subset     []string // its GIE subset hint
		out        bool     // the storing worker is out for a health back-off
		change     func(f fixture, storing string) error
		wantStored bool
		wantRouted string
	}{
		{name: "known: to its worker though the other is idle", id: "resp_1", wantStored: true, wantRouted: StoredResponseWorker},
		{name: "known, its worker out for a back-off: still there", id: "resp_1", out: true, wantStored: true, wantRouted: StoredResponseWorker},
		{name: "unknown: by load", id: "resp_other", wantRouted: StoredResponseUnknown},
		{name: "its worker outside the subset hint: by load", id: "resp_1", subset: []string{"127.0.0.1:8001", "127.0.0.1:8002"}, wantRouted: StoredResponseNotCandidate},
		{name: "its worker's address changed (another engine): forgotten", id: "resp_1", wantRouted: StoredResponseUnknown,
			change: func(f fixture, storing string) error {
				ws := f.router.Workers()
				for i := range ws {
					if ws[i].Name == storing {
						ws[i].Address = "127.0.0.1:9999"
					}
				}
				return f.router.SetWorkers(ws)
			}},
		{name: "its worker left the fleet: forgotten", id: "resp_1", wantRouted: StoredResponseUnknown,
			change: func(f fixture, storing string) error {
				var kept []Worker
				for _, w := range f.router.Workers() {
					if w.Name != storing {
						kept = append(kept, w)
					}
				}
				return f.router.SetWorkers(kept)
			}},
	}
	// An SGLang session lives in its engine's memory as a stored response does: the same
	// cases, opened by an /open_session answer and named by a turn.
	for _, sglang := range []bool{false, true} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/sglang_session=%v", tt.name, sglang), func(t *testing.T) {
				testStoredRouting(t, tt.subset, tt.out, tt.change, tt.id, sglang, tt.wantStored, tt.wantRouted)
			})
		}
	}
}

// testStoredRouting plays one case of
// TestARequestNamingAStoredResponseGoesToTheWorkerThatStoredIt, as a response or as an
// SGLang session.
func testStoredRouting(t *testing.T, subset []string, out bool, change func(fixture, string) error, id string, sglang, wantStored bool, wantRouted string) {
	f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
	// c is the only worker outside the subset hint of the subset case.
	require.NoError(t, f.router.SetWorkers(append(twoWorkers(), Worker{Name: "c", Address: "127.0.0.1:8003"})))
	store, err := session.New(session.Config{TTL: time.Hour, MaxEntries: 10}, nil)
	require.NoError(t, err)
	f.router.deps.Responses = store
	ctx := context.Background()

	// The first request stores resp_1 and is still running: its worker is the
	// busiest.
	first, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	defer first.Release()
	assert.Empty(t, first.StoredResponse, "a request naming no response")
	key := store.KeyOf("resp_1")
	if sglang {
		key = store.SGLangSessionKeyOf("resp_1")
	}
	switch {
	case subset != nil:
		// Store it on c instead, the worker the subset leaves out.
		store.RememberKey(key, "c")
	case sglang:
		first.RememberSGLangSession("resp_1")
	default:
		first.RememberResponse("resp_1")
	}
	storing, _ := store.LookupKey(key)
	if out {
		f.router.deps.Health = outSet{storing: true}
	}
	if change != nil {
		require.NoError(t, change(f, storing))
	}

	req := &Request{Model: "m", Tokens: []uint32{}, PreviousResponseID: id, Subset: subset}
	if sglang {
		req.PreviousResponseID, req.SGLangSession = "", id
	}
	next, err := f.router.Route(ctx, req)
	require.NoError(t, err)
	defer next.Release()
	routed, other := next.StoredResponse, next.SGLangSession
	if sglang {
		routed, other = other, routed
	}
	assert.Equal(t, wantRouted, routed)
	assert.Empty(t, other, "the request names one kind of stored thing")
	assert.Equal(t, wantStored, next.Worker == storing, "stored on %s, routed to %s", storing, next.Worker)
	if wantStored {
		assert.Empty(t, next.FallbackAddresses, "no other worker can answer it")
	}
}

// TestAResponseIDCannotNameAnSGLangSession: a client chooses its previous_response_id
// and its session ids, so in the shared store a response id must not find the SGLang
// session of the same id, nor a session id the response: their keys are two families.
func TestAResponseIDCannotNameAnSGLangSession(t *testing.T) {
	for _, tt := range []struct {
		name       string
		remember   func(d *Decision)
		request    Request
		routed     func(d *Decision) string
		wantRouted string
	}{
		{"a response id that is a session's", func(d *Decision) { d.RememberSGLangSession("x") },
			Request{Model: "m", Tokens: []uint32{}, PreviousResponseID: "x"},
			func(d *Decision) string { return d.StoredResponse }, StoredResponseUnknown},
		{"a session id that is a response's", func(d *Decision) { d.RememberResponse("x") },
			Request{Model: "m", Tokens: []uint32{}, SGLangSession: "x"},
			func(d *Decision) string { return d.SGLangSession }, StoredResponseUnknown},
		{"the session itself", func(d *Decision) { d.RememberSGLangSession("x") },
			Request{Model: "m", Tokens: []uint32{}, SGLangSession: "x"},
			func(d *Decision) string { return d.SGLangSession }, StoredResponseWorker},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
			store, err := session.NewResponses(session.DefaultResponsesConfig(), nil)
			require.NoError(t, err)
			f.router.deps.Responses = store
			ctx := context.Background()
			first, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(0, 40)})
			require.NoError(t, err)
			defer first.Release()
			tt.remember(first)
			next, err := f.router.Route(ctx, &tt.request)
			require.NoError(t, err)
			defer next.Release()
			assert.Equal(t, tt.wantRouted, tt.routed(next))
			assert.Equal(t, tt.wantRouted == StoredResponseWorker, next.Worker == first.Worker)
		})
	}
}

// responseSink keeps what the router tells the other replicas of stored responses.
type responseSink []string

func (s *responseSink) RecordedResponse(worker, address string, key uint64) {
	*s = append(*s, fmt.Sprint(worker, " ", address, " ", key))
}

// TestAResponseIsStoredWhereItWasServed: the response is remembered on the worker that
// served the request, and the other replicas are told so, by its key: the chosen
// worker, or the fallback the data plane sent the request to, whose engine stored it.
func TestAResponseIsStoredWhereItWasServed(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		t.Run(fmt.Sprint("fallback=", fallback), func(t *testing.T) {
			f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
			store, err := session.NewResponses(session.DefaultResponsesConfig(), nil)
			require.NoError(t, err)
			var sink responseSink
			f.router.deps.Responses, f.router.deps.ResponseRecords = store, &sink
			d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: []uint32{}})
			require.NoError(t, err)
			defer d.Release()
			worker, address := d.Worker, d.Address
			if fallback {
				address = d.FallbackAddresses[0]
				var moved bool
				worker, moved, err = d.Served(address)
				require.NoError(t, err)
				require.True(t, moved)
			}
			d.RememberResponse("resp_1")
			stored, ok := store.Lookup("resp_1")
			require.True(t, ok)
			assert.Equal(t, worker, stored)
			assert.Equal(t, responseSink{fmt.Sprint(worker, " ", address, " ", session.ResponseKey("resp_1"))}, sink)
		})
	}
}

// TestWithoutAResponseStoreTheIdChangesNothing: a router built without
// Deps.Responses routes by load and reports no outcome; RememberResponse is a no-op.
func TestWithoutAResponseStoreTheIdChangesNothing(t *testing.T) {
	f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: []uint32{}, PreviousResponseID: "resp_1"})
	require.NoError(t, err)
	defer d.Release()
	d.RememberResponse("resp_2")
	assert.Empty(t, d.StoredResponse)
}

// refusingEncoder refuses every prompt as a template does a chat it cannot render.
type refusingEncoder struct{}

func (refusingEncoder) EncodePrompt(context.Context, tokenize.Prompt) (tokenize.Encoding, error) {
	return tokenize.Encoding{}, fmt.Errorf("%w: the template raised", tokenize.ErrRefused)
}

// TestARebuiltChatIsRoutedOnItsBlocksButNotJudged: a chat kvroute rebuilt from a
// Responses API body is routed on its blocks like any chat, but its ids are not the
// engine's for sure: no worker is left out for its context, and a chat the template
// refuses goes by load rather than back to the client as a 400 (the engine judges).
func TestARebuiltChatIsRoutedOnItsBlocksButNotJudged(t *testing.T) {
	past := encodingOf{IDs: tokens(0, 40)} // exact ids, past the worker's 16
	tests := []struct {
		name         string
		enc          tokenize.PromptEncoder
		rebuilt      bool
		wantErr      error
		wantExceeded bool
		wantFallback bool
	}{
		{name: "a chat past every context", enc: past, wantExceeded: true},
		{name: "rebuilt, past every context: routed on its blocks", enc: past, rebuilt: true},
		{name: "a chat the template refuses: the client's error", enc: refusingEncoder{}, wantErr: ErrBadRequest},
		{name: "rebuilt, the template refuses: by load", enc: refusingEncoder{}, rebuilt: true, wantFallback: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newContextFixture(t, []Worker{{Name: "a", Address: "127.0.0.1:8001", MaxModelLen: 16}}, nil, tt.enc)
			d, err := f.router.Route(context.Background(), &Request{Model: "m", Chat: tokenize.TextChat("user", "hi"), Rebuilt: tt.rebuilt})
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			defer d.Release()
			assert.Equal(t, tt.wantExceeded, d.ContextExceeded)
			assert.Equal(t, tt.wantFallback, d.PromptFallback != "")
			if !tt.wantExceeded && !tt.wantFallback {
				assert.Equal(t, 10, d.Blocks)
			}
		})
	}
}
