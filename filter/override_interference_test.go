package filter_test

import "testing"

// TestPerRouteInterferenceOverride: a route's override of interference_weight reaches
// the cost through the route's gRPC metadata. w0 runs four short requests (40 active
// blocks), w1 one long one (200 blocks). A cold prompt goes to w0 on the plain route,
// where only blocks count; on the /calm route ι = 4 charges its ~40 missing blocks once
// per request running there, 4·4·R on w0 against 4·1·R on w1, and it goes to w1.
func TestPerRouteInterferenceOverride(t *testing.T) {
	p := planeWithPolicyRoute(t, "/calm/", `{"interference_weight": 4}`)
	var busy []func()
	for i := range 4 {
		busy = append(busy, p.book(t, "w0", i, 10))
	}
	busy = append(busy, p.book(t, "w1", 4, 200))

	requireColdPromptsGo(t, p, []pathAndWorker{{"/calm/v1/chat/completions", "w1"}, {"/v1/chat/completions", "w0"}})
	for _, release := range busy {
		release()
	}
	p.requireIdle(t)
}
