package mockworker

// Data parallelism behind one address, as vLLM's internal load balancer serves it
// (--data-parallel-size N, one API server): N engines (ranks), each with its own KV
// cache, scheduler and KV events publisher, behind the worker's one HTTP server.
// Which rank a request goes to:
//
//   - chat, completions, /inference/v1/generate and /v1/messages: the rank the request's
//     X-data-parallel-rank header names (vLLM's _get_data_parallel_rank, any case); a
//     value that is not an integer is ignored (the balancer picks), one outside [0, N)
//     gets vLLM's 400 ("data_parallel_rank R is out of range [0, N).");
//   - without the header, and on /v1/responses (vLLM does not read it there) and
//     SGLang's /generate (SGLang pins that one by a body field, not the header): the
//     balancer (balanceLocked).
//
// With N > 1 the answer says which rank served it in x-data-parallel-rank, /metrics has
// one series per rank labelled engine="<rank>", and rank r publishes its KV events on
// the configured endpoint's port + r (its replays on the replay endpoint's port + r),
// each batch naming data_parallel_rank r. With N = 1 none of this shows: the request
// header is ignored, no answer header, no engine label beyond vllm:cache_config_info's
// "0", no rank in the batches.

import (
	"fmt"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/sim"
)

// rankHeader is the request header pinning a request to a data-parallel rank, as vLLM
// reads it (header names are case-insensitive), and the answer's header naming the
// rank that served it (the mock's own, for tests), set only with more than one rank.
const rankHeader = "x-data-parallel-rank"

// rank is one data-parallel engine. Its fields are guarded by Server.mu, but for the
// channels and the publisher.
type rank struct {
	id     int
	engine *sim.Engine
	// queries counts prompt tokens looked up in the prefix cache, hits those of them
	// served from cache.
	queries, hits float64
	// remotePrefills counts the requests served as a disaggregated request's prefill.
	remotePrefills float64

	wake      chan struct{}
	done      chan struct{}       // closed when the rank's loop ends
	publisher *kvevents.Publisher // nil without Config.Events
}

// newRanks builds cfg.DataParallelSize engines and, with cfg.Events, their publishers:
// rank r's on the endpoints' ports + r (a port 0 picks rank 0's; the others are its
// port + r).
func newRanks(cfg Config) ([]*rank, error) {
	var ranks []*rank
	for r := range cfg.DataParallelSize {
		e, err := sim.New(cfg.Engine)
		if err != nil {
			closeRanks(ranks)
			return nil, err
		}
		rk := &rank{id: r, engine: e, wake: make(chan struct{}, 1), done: make(chan struct{})}
		ranks = append(ranks, rk)
		if cfg.Events == nil {
			continue
		}
		pc := *cfg.Events
		if r > 0 {
			first := ranks[0].publisher
			if pc.Endpoint, err = rankEndpoint(first.Addr(), r); err == nil && pc.ReplayEndpoint != "" {
				pc.ReplayEndpoint, err = rankEndpoint(first.ReplayAddr(), r)
			}
			if err != nil {
				closeRanks(ranks)
				return nil, fmt.Errorf("kv events of rank %d: %w", r, err)
			}
		}
		if rk.publisher, err = kvevents.NewPublisher(pc); err != nil {
			closeRanks(ranks)
			return nil, err
		}
	}
	return ranks, nil
}

// closeRanks closes the ranks' publishers.
func closeRanks(ranks []*rank) {
	for _, rk := range ranks {
		if rk.publisher != nil {
			rk.publisher.Close()
		}
	}
}

// rankEndpoint is rank r's endpoint of rank 0's ep (as bound, its port picked): the
// same host, port + r. An ipc endpoint serves one rank, as in kvroute's config.
func rankEndpoint(ep string, r int) (string, error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok || scheme != "tcp" {
		return "", fmt.Errorf("%q: ranks after the first need a tcp endpoint (port + rank)", ep)
	}
	host, portText, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("%q: %v", ep, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port <= 0 || port+r > 65535 {
		return "", fmt.Errorf("%q: port + %d is not a port", ep, r)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port+r)), nil
}

// RankEvents returns rank r's KV events publisher (nil without Config.Events, or for a
// rank the server does not run).
func (s *Server) RankEvents(r int) *kvevents.Publisher {
	if r < 0 || r >= len(s.ranks) {
		return nil
	}
	return s.ranks[r].publisher
}

// balanceLocked picks the rank of a request no header pins, as vLLM's DPLBAsyncMPClient
// does: the fewest waiting plus running requests, ties to the lowest rank. vLLM reads
// those counts as the coordinator last published them (about every 100 ms, with a
// local increment for each request it sends meanwhile), and newer releases weigh the
// waiting 4× (score = 4·waiting + running); the mock reads its engines' counts live,
// as they are when the request is queued, unweighted. The caller holds s.mu.
func (s *Server) balanceLocked() *rank {
	best, load := s.ranks[0], -1
	for _, rk := range s.ranks {
		if l := rk.engine.Waiting() + rk.engine.Running(); load < 0 || l < load {
			best, load = rk, l
		}
	}
	return best
}

// balance is balanceLocked for a caller not holding s.mu.
func (s *Server) balance() *rank {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.balanceLocked()
}

// pinnedRank reads a request's rankHeader, as vLLM's endpoints that honour it do: the
// rank it names, or nil when it is absent or not an integer (the balancer picks). A
// rank outside [0, N) makes it return the error vLLM answers with a 400. With one rank
// the header is ignored, as the worker did before it had ranks (vLLM would refuse any
// rank but 0 there too).
func (s *Server) pinnedRank(r *http.Request) (*rank, error) {
	if len(s.ranks) == 1 {
		return nil, nil
	}
	n, ok := pythonInt(r.Header.Get(rankHeader))
	if !ok {
		return nil, nil
	}
	if n.Sign() < 0 || n.Cmp(big.NewInt(int64(len(s.ranks)))) >= 0 {
		return nil, fmt.Errorf("data_parallel_rank %s is out of range [0, %d).", n, len(s.ranks))
	}
	return s.ranks[n.Int64()], nil
}

// pythonInt parses v as Python's int(v) parses a decimal string: surrounding
// whitespace, an optional sign, digits with single underscores between them. It does
// not take the non-ASCII digits and spaces Python also takes.
func pythonInt(v string) (*big.Int, bool) {
	v = strings.Trim(v, " \t\n\r\v\f")
	digits := strings.TrimLeft(v, "+-")
	if len(v)-len(digits) > 1 || digits == "" || digits[0] == '_' || digits[len(digits)-1] == '_' || strings.Contains(digits, "__") {
		return nil, false
	}
	clean := strings.ReplaceAll(digits, "_", "")
	for i := 0; i < len(clean); i++ {
		if clean[i] < '0' || clean[i] > '9' {
			return nil, false
		}
	}
	n, ok := new(big.Int).SetString(clean, 10)
	if ok && strings.HasPrefix(v, "-") {
		n.Neg(n)
	}
	return n, ok
}

// setServedRank names the rank that serves a request in its answer's headers, with
// more than one rank.
func (s *Server) setServedRank(w http.ResponseWriter, rk *rank) {
	if len(s.ranks) > 1 {
		w.Header().Set(rankHeader, strconv.Itoa(rk.id))
	}
}
