package filter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/session"
	"github.com/kvroute/kvroute/tokenize"
)

// TestRandomMessageOrdersLeaveNoBookingAndNeverPanic plays random sequences of ext_proc messages in any order
// with odd metadata; every sequence must end with no booking left and no panic.
func TestRandomMessageOrdersLeaveNoBookingAndNeverPanic(t *testing.T) {
	workers := []router.Worker{{Name: "w0", Address: "10.0.0.1:8000"}, {Name: "w1", Address: "10.0.0.2:8000"}, {Name: "w2", Address: "[fd00::1]:8000"}}
	idx, _ := index.New(index.Config{CapacityBlocks: 64}, nil)
	bookings := scoring.NewBookings()
	picker, _ := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 2)))
	store, _ := session.New(session.DefaultConfig(), nil)
	r, err := router.New(router.Config{BlockSize: 4, Workers: workers}, router.Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx, Bookings: bookings, Picker: picker, RecordBlocks: true, Sessions: store,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		_ = idx.SetWorker(w.Name, 0)
	}
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 1 << 12
	cfg.FallbackEndpoints = 2
	srv, err := New(cfg, Deps{Router: r, SessionHeaders: []string{"x-session-id"}})
	if err != nil {
		t.Fatal(err)
	}
	modes := []extprocfilterv3.ProcessingMode_BodySendMode{0, 1, 2, 3, 4, 5}
	rng := rand.New(rand.NewPCG(7, 8))
	values := []*structpb.Value{
		structpb.NewStringValue("10.0.0.2:8000"), structpb.NewStringValue("[FD00::1]:8000"), structpb.NewStringValue("10.0.0.1:8000"),
		structpb.NewStringValue(""), structpb.NewNumberValue(3), structpb.NewNullValue(), structpb.NewBoolValue(true),
		structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("10.0.0.2:8000"), structpb.NewNumberValue(1)}}),
		structpb.NewStringValue("10.0.0.2:8000,10.0.0.1:8000"), structpb.NewStringValue("garbage"), structpb.NewStringValue("10.0.0.2"),
		structpb.NewStructValue(&structpb.Struct{}),
	}
	md := func() *corev3.Metadata {
		if rng.IntN(3) == 0 {
			return nil
		}
		fm := map[string]*structpb.Struct{}
		if rng.IntN(2) == 0 {
			fm["envoy.lb"] = &structpb.Struct{Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint-served": values[rng.IntN(len(values))]}}
		}
		if rng.IntN(2) == 0 {
			fm["envoy.lb.subset_hint"] = &structpb.Struct{Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint-subset": values[rng.IntN(len(values))]}}
		}
		if rng.IntN(4) == 0 {
			fm["kvroute"] = &structpb.Struct{Fields: map[string]*structpb.Value{"policy": values[rng.IntN(len(values))]}}
		}
		return &corev3.Metadata{FilterMetadata: fm}
	}
	bodies := [][]byte{
		[]byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hello there general kenobi"}]}`),
		[]byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8,9]}`), []byte(`{"model":`), nil, []byte("data: {\"usage\":{\"prompt_tokens\":5}}\n\n"),
	}
	paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/models", "*"}
	routed := 0
	defer func() { t.Logf("routed %d", routed) }()
	for i := range 20000 {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("sequence %d panicked: %v", i, p)
				}
			}()
			ctx := context.Background()
			st := srv.newStream(ctx)
			n := 1 + rng.IntN(8)
			var log []string
			for range n {
				req := &extprocv3.ProcessingRequest{MetadataContext: md()}
				if rng.IntN(4) == 0 {
					req.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modes[rng.IntN(6)], ResponseBodyMode: modes[rng.IntN(6)]}
				}
				eos := rng.IntN(2) == 0
				switch rng.IntN(7) {
				case 0, 1:
					req.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: eos, Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
						{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(paths[rng.IntN(len(paths))])}, {Key: "x-session-id", RawValue: []byte("s")}}}}}
				case 2:
					req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: bodies[rng.IntN(len(bodies))], EndOfStream: eos}}
				case 3:
					req.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}
				case 4:
					req.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{EndOfStream: eos, Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
						{Key: ":status", RawValue: []byte([]string{"200", "503", "x", ""}[rng.IntN(4)])}}}}}
				case 5:
					req.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: bodies[rng.IntN(len(bodies))], EndOfStream: eos}}
				case 6:
					req.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}
				}
				log = append(log, fmt.Sprintf("%T eos=%v", req.GetRequest(), eos))
				_, err := st.handle(ctx, req)
				if err != nil || st.phase == phaseDone {
					break
				}
			}
			if st.decision != nil {
				routed++
			}
			st.release(outcomeCancelled)
			for _, w := range workers {
				if l := bookings.Load(w.Name); l != (scoring.Load{}) {
					t.Fatalf("sequence %d %v: %s still booked: %+v", i, log, w.Name, l)
				}
			}
		}()
	}
}
