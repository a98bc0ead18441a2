package replay

import (
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

// SessionsConfig is Workload A (WORKLOADS §2): sessions with a stable private prefix
// whose turns grow by the user's new tokens and the previous output.
type SessionsConfig struct {
	Sessions     int
	Turns        int
	PrefixTokens int
	UserTokens   int
	OutputTokens int
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

// NewSessions returns Workload A for a seed.
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
	for i := range s.cfg.Sessions {
		rng := rand.New(rand.NewPCG(s.seed, 0xa11ce+uint64(i)))
		s.rngs[i] = rng
		s.history[i] = tokens(rng, s.cfg.PrefixTokens)
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
