package replay

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Req is one request of a workload.
type Req struct {
	ID int
	// Session and Turn identify a conversation turn (1-based); Session < 0: none.
	Session, Turn int
	Prompt        []uint32
	Output        []uint32
	// LoRA names the LoRA adapter the request asks for ("" for the base model).
	LoRA string
}

// Arrival is a request and the virtual time it arrives.
type Arrival struct {
	At  time.Duration
	Req *Req
}

// Workload produces requests; it may react to completions (closed-loop sessions).
type Workload interface {
	// Start returns the arrivals known up front.
	Start() []Arrival
	// Completed is told a request finished at now and returns any follow-up arrivals.
	Completed(r *Req, now time.Duration) []Arrival
}

// SessionsConfig describes closed-loop chat sessions whose turns grow by the user's new
// tokens and the previous output: Workload A (WORKLOADS §2: a stable private prefix per
// session) and the shared-prefix workload (one system prompt shared by every session).
type SessionsConfig struct {
	Sessions int
	Turns    int
	// SharedPrefixTokens open every session's prompt with the same tokens (a shared
	// system prompt); PrefixTokens follow, drawn per session (a private prefix).
	SharedPrefixTokens int
	PrefixTokens       int
	UserTokens         int
	OutputTokens       int
	// Session starts are uniform in [0, StartSpread); each next turn arrives a think time
	// uniform in [ThinkMin, ThinkMax] after the previous one completes.
	StartSpread        time.Duration
	ThinkMin, ThinkMax time.Duration
	// CompactEvery > 0 makes sessions compact their history, as agents do when their
	// context fills: every CompactEvery turns, the turn's prompt starts from a fresh
	// summary of SummaryTokens instead of the history (the private prefix included),
	// so no worker holds any of it. 0: never (Workload A).
	CompactEvery  int
	SummaryTokens int
	// Adapters > 0 runs session i on LoRA adapter AdapterName(i mod Adapters), so each
	// adapter has its share of the sessions; 0: every session on the base model.
	Adapters int
}

// AdapterName is the name of the workloads' LoRA adapter i.
func AdapterName(i int) string { return fmt.Sprintf("lora-%d", i) }

// AdapterNames returns the names of n adapters.
func AdapterNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = AdapterName(i)
	}
	return names
}

// DefaultCompacting returns Workload A whose sessions compact their history every 4
// turns into a 1,000-token summary (turns 5 and 9 of 12 start from a summary).
func DefaultCompacting() SessionsConfig {
	c := DefaultSessions()
	c.CompactEvery, c.SummaryTokens = 4, 1000
	return c
}

// DefaultSessions returns WORKLOADS §2's Workload A.
func DefaultSessions() SessionsConfig {
	return SessionsConfig{Sessions: 16, Turns: 12, PrefixTokens: 3000, UserTokens: 96, OutputTokens: 32,
		StartSpread: 8 * time.Second, ThinkMin: 250 * time.Millisecond, ThinkMax: 1750 * time.Millisecond}
}

// DefaultSharedPrefix returns the shared-prefix workload (issue 11): 32 sessions × 6
// turns behind one 3,000-token system prompt, otherwise paced like Workload A. Every
// session's first turn can reuse a worker's cached system prompt, so a cost that only
// sees the cache piles sessions onto its holder.
func DefaultSharedPrefix() SessionsConfig {
	c := DefaultSessions()
	c.Sessions, c.Turns, c.SharedPrefixTokens, c.PrefixTokens = 32, 6, 3000, 0
	return c
}

// Validate reports the first invalid field, by the cmd/replay flag that sets it.
func (c SessionsConfig) Validate() error {
	switch {
	case c.Sessions <= 0:
		return fmt.Errorf("sessions: must be > 0, got %d", c.Sessions)
	case c.Turns <= 0:
		return fmt.Errorf("turns: must be > 0, got %d", c.Turns)
	case c.SharedPrefixTokens < 0:
		return fmt.Errorf("shared-prefix-tokens: must be ≥ 0, got %d", c.SharedPrefixTokens)
	case c.PrefixTokens < 0:
		return fmt.Errorf("prefix-tokens: must be ≥ 0, got %d", c.PrefixTokens)
	case c.UserTokens <= 0:
		return fmt.Errorf("user-tokens: must be > 0, got %d", c.UserTokens)
	case c.OutputTokens <= 0:
		return fmt.Errorf("output-tokens: must be > 0, got %d", c.OutputTokens)
	case c.StartSpread < 0:
		return fmt.Errorf("start-spread: must be ≥ 0, got %s", c.StartSpread)
	case c.Adapters < 0:
		return fmt.Errorf("lora-adapters: must be ≥ 0, got %d", c.Adapters)
	case c.ThinkMin < 0 || c.ThinkMax < c.ThinkMin:
		return fmt.Errorf("think-min, think-max: need 0 ≤ think-min ≤ think-max, got %s and %s", c.ThinkMin, c.ThinkMax)
	}
	return nil
}

// sessions generates Workload A. Each session draws from its own seeded stream (its
// prefix, start, turns' tokens and think times), so every policy replayed under a seed
// faces the same sessions with the same pauses whatever order their turns complete in:
// differences between policies are the policies', not the random draws' (common random
// numbers).
type sessions struct {
	cfg     SessionsConfig
	seed    uint64
	rngs    []*rand.Rand // per session
	history [][]uint32   // per session: the tokens of its conversation so far
	nextID  int
}

// sharedStream seeds the shared prefix's tokens: one stream per seed, apart from the
// sessions' own, so adding a shared prefix changes no session's draws.
const sharedStream = 0x5a4ed

// NewSessions returns the sessions workload of cfg for a seed; cfg must be valid.
func NewSessions(cfg SessionsConfig, seed uint64) Workload {
	return &sessions{cfg: cfg, seed: seed}
}

func tokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(rng.IntN(150_000))
	}
	return out
}

func (s *sessions) Start() []Arrival {
	var out []Arrival
	s.history = make([][]uint32, s.cfg.Sessions)
	s.rngs = make([]*rand.Rand, s.cfg.Sessions)
	shared := tokens(rand.New(rand.NewPCG(s.seed, sharedStream)), s.cfg.SharedPrefixTokens)
	for i := range s.cfg.Sessions {
		rng := rand.New(rand.NewPCG(s.seed, 0xa11ce+uint64(i)))
		s.rngs[i] = rng
		s.history[i] = append(append([]uint32(nil), shared...), tokens(rng, s.cfg.PrefixTokens)...)
		at := time.Duration(rng.Int64N(int64(s.cfg.StartSpread) + 1))
		out = append(out, Arrival{At: at, Req: s.turn(i, 1)})
	}
	return out
}

// turn appends the user's new tokens to the session and returns the turn's request.
// A compacting session first replaces its history with a summary.
func (s *sessions) turn(session, k int) *Req {
	rng := s.rngs[session]
	if s.cfg.CompactEvery > 0 && k > 1 && (k-1)%s.cfg.CompactEvery == 0 {
		s.history[session] = tokens(rng, s.cfg.SummaryTokens)
	}
	s.history[session] = append(s.history[session], tokens(rng, s.cfg.UserTokens)...)
	r := &Req{ID: s.nextID, Session: session, Turn: k,
		Prompt: append([]uint32(nil), s.history[session]...), Output: tokens(rng, s.cfg.OutputTokens)}
	if s.cfg.Adapters > 0 {
		r.LoRA = AdapterName(session % s.cfg.Adapters)
	}
	s.nextID++
	return r
}

func (s *sessions) Completed(r *Req, now time.Duration) []Arrival {
	s.history[r.Session] = append(s.history[r.Session], r.Output...)
	if r.Turn >= s.cfg.Turns {
		return nil
	}
	rng := s.rngs[r.Session]
	think := s.cfg.ThinkMin + time.Duration(rng.Int64N(int64(s.cfg.ThinkMax-s.cfg.ThinkMin)+1))
	return []Arrival{{At: now + think, Req: s.turn(r.Session, r.Turn+1)}}
}
