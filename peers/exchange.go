package peers

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/tlsfiles"
	"github.com/kvroute/kvroute/scoring"
)

// Reconnection back-off after a watch stream fails: from minBackoff, doubling, at most
// maxBackoff.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// PeerLedger is where the peers' summed counts go: scoring.Bookings.
type PeerLedger interface {
	// SetPeerLoad records the load other replicas booked on worker; a zero Load
	// forgets it.
	SetPeerLoad(worker string, l scoring.Load)
	// SetPeerAdapters records the LoRA adapters other replicas have resident on
	// worker, with their requests; an empty map forgets them.
	SetPeerAdapters(worker string, adapters map[string]int)
	// SetPeerHistory records the prefill history other replicas have on worker, in
	// tokens as of now, which the ledger decays from now on; 0 forgets it.
	SetPeerHistory(worker string, tokens float64)
}

// Resolver looks up the DNS name's addresses (net.Resolver).
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// Deps are what an [Exchange] uses. Ledger and Replica are required.
type Deps struct {
	Ledger PeerLedger
	// Replica is this process's id, as its [Handler] serves it.
	Replica string
	// Token is the shared secret sent to the peers (Config.Token); empty sends none.
	Token string
	// Client watches the peers; nil uses the exchange's own (see newClient), whose
	// connections are closed when Run returns, and which speaks Config.TLS. A Client
	// given here must speak it itself (the watches go to https:// when it is set).
	Client *http.Client
	// Resolver looks up Config.DNS; nil uses net.DefaultResolver.
	Resolver Resolver
	// Blocks, when set, stores the decisions' blocks the peers' reports carry
	// (peers.share_blocks) in this replica's index, and the watches ask for them;
	// nil asks for none.
	Blocks BlockStore
	// BlockSize is this replica's block size: a peer's records made with another (a
	// rollout changing block_size) are skipped, counted.
	BlockSize int
	// Sessions, when set with Blocks, remembers the sessions the peers' records name
	// (the session header's), as this replica's own decisions do.
	Sessions SessionStore
	// Responses, when set with Blocks, remembers the stored Responses API responses
	// the peers' records name (router.Deps.Responses), as this replica's own do.
	Responses SessionStore
	// Now is the clock for staleness and DNS refreshes; nil uses time.Now.
	Now     func() time.Time
	Metrics *Metrics
	// Panics counts the reports and DNS lookups whose handling panicked (loop
	// "peers"); nil counts nothing.
	Panics *background.Metrics
	Logger *slog.Logger
}

// Exchange watches every peer's report stream and keeps the ledger's peer load at the
// sum of the fresh ones.
type Exchange struct {
	cfg   Config
	deps  Deps
	guard background.Guard // each report's, each lookup's

	mu         sync.Mutex
	heard      map[string]heard              // by address: the last report a peer sent
	self       map[string]bool               // addresses that answered with this replica's id
	watching   map[string]context.CancelFunc // by address: its watch goroutine
	resolved   []string                      // the DNS name's addresses at the last lookup
	resolvedAt time.Time                     // when the last lookup started
	resolving  bool                          // a lookup is under way
	sums       *sums                         // per worker, the counted reports' sums
	applied    map[string]scoring.Load       // per worker, the peer load the ledger holds
	adapters   map[string]map[string]int     // per worker, the peer adapters the ledger holds
	histories  map[string]struct{}           // the workers the ledger holds a peer history of
	storedTo   map[string]uint64             // per replica, the number of the last record stored
	resume     map[string]resumePoint        // per address, where its records stream stood

	watchers  sync.WaitGroup  // the watch goroutines
	lookups   sync.WaitGroup  // the DNS lookup under way
	transport *http.Transport // the default client's, closed by Run; nil with Deps.Client
	scheme    string          // of the watch URLs: https with Config.TLS
}

// resumePoint is the last record got from a peer's address, so that a watch reopened
// there resumes after it.
type resumePoint struct {
	replica string
	after   uint64
}

// heard is a peer's last accepted report and when it came.
type heard struct {
	report Report
	at     time.Time
	live   bool // fresh at the last look (to log the changes only)
}

// New returns the exchange for cfg; call [Exchange.Run] to watch the peers.
func New(cfg Config, deps Deps) (*Exchange, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Ledger == nil || deps.Replica == "" {
		return nil, errors.New("peers: Ledger and Replica are required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	scheme := "http"
	var certs *tlsfiles.Reloader
	if cfg.TLS.Enabled() {
		scheme = "https"
		var err error
		if certs, err = tlsfiles.New("peers.tls", cfg.TLS.paths(), cfg.TLS.build, deps.Logger); err != nil {
			return nil, err
		}
	}
	var transport *http.Transport
	if deps.Client == nil {
		deps.Client, transport = newClient(certs)
	}
	if deps.Resolver == nil {
		deps.Resolver = net.DefaultResolver
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	return &Exchange{cfg: cfg, deps: deps, guard: background.NewGuard(background.LoopPeers, deps.Logger, deps.Panics), heard: map[string]heard{}, self: map[string]bool{},
		watching: map[string]context.CancelFunc{}, sums: newSums(), applied: map[string]scoring.Load{},
		adapters: map[string]map[string]int{}, histories: map[string]struct{}{}, storedTo: map[string]uint64{}, resume: map[string]resumePoint{},
		transport: transport, scheme: scheme}, nil
}

// tlsHandshakeTimeout bounds a peer's connection and TLS handshake.
const tlsHandshakeTimeout = 10 * time.Second

// maxHeaderBytes bounds a peer's response headers; a replica sends three short ones.
const maxHeaderBytes = 64 << 10

// newClient returns the client peers are watched with: a transport of its own (not
// http.DefaultTransport, whose idle connections would outlive Run and which reads
// 10 MiB of headers), one idle connection per peer, no proxy (peers are other
// replicas' admin ports on the same network; HTTP_PROXY is for egress), and no
// redirects (a report is at the address asked). With certs it speaks TLS, each new
// connection with the files as they are then.
func newClient(certs *tlsfiles.Reloader) (*http.Client, *http.Transport) {
	// net/http goes on dialling after a request gives up, so without a timeout each
	// reconnect to a peer whose host drops connection attempts would leave a dial
	// pending for the kernel's ~2 minutes; the TLS hook below bounds its own the same way.
	dialer := &net.Dialer{KeepAlive: 30 * time.Second, Timeout: tlsHandshakeTimeout}
	t := &http.Transport{
		DialContext:            dialer.DialContext,
		MaxIdleConns:           2 * MaxAddresses,
		MaxIdleConnsPerHost:    1,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: maxHeaderBytes,
	}
	if certs != nil {
		t.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			// The transport's TLSHandshakeTimeout does not apply to this hook, and net/http
			// goes on dialling in the background after a request gives up (at
			// peers.stale_after): this bounds such a dial to a peer that never finishes
			// the handshake. The deadline ends with the dial; the connection outlives it.
			ctx, cancel := context.WithTimeout(ctx, tlsHandshakeTimeout)
			defer cancel()
			config := certs.Current()
			if config.ServerName == "" {
				name, err := serverName(addr)
				if err != nil {
					return nil, err
				}
				config = config.Clone()
				config.ServerName = name
			}
			return (&tls.Dialer{NetDialer: dialer, Config: config}).DialContext(ctx, network, addr)
		}
	}
	return &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, t
}

// serverName is the name a peer's certificate is checked against when
// peers.tls.server_name is unset: the host of addr, an IPv6 literal without its
// brackets and zone (tls.Dialer would keep both, and no certificate names
// "[fe80::1%eth0]").
func serverName(addr string) (string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	host, _, _ = strings.Cut(host, "%")
	return host, nil
}

// Run watches the peers until ctx ends: every [Heartbeat] it refreshes the peer set
// and drops the peers silent past Config.StaleAfter. When it returns, every watch and
// lookup has ended, the connections to the peers are closed, and the peer load given
// to the ledger is withdrawn.
func (e *Exchange) Run(ctx context.Context) {
	tick := time.NewTicker(Heartbeat)
	defer tick.Stop()
	for {
		e.maintain(ctx)
		select {
		case <-ctx.Done():
			e.mu.Lock()
			for _, stop := range e.watching {
				stop()
			}
			e.mu.Unlock()
			e.watchers.Wait()
			e.lookups.Wait() // its context is ctx: it is ending
			if e.transport != nil {
				e.transport.CloseIdleConnections() // every watch has ended: all are idle
			}
			e.withdraw()
			return
		case <-tick.C:
		}
	}
}

// maintain starts a watch for each new peer address, stops those of addresses gone,
// and sums again (a peer may have gone stale).
func (e *Exchange) maintain(ctx context.Context) {
	addresses := e.addresses(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	for addr, stop := range e.watching {
		if !slices.Contains(addresses, addr) {
			stop()
			delete(e.watching, addr)
			e.forget(addr)
		}
	}
	if ctx.Err() == nil {
		for _, addr := range addresses {
			if _, ok := e.watching[addr]; !ok {
				watchCtx, stop := context.WithCancel(ctx)
				e.watching[addr] = stop
				e.watchers.Go(func() { e.watch(watchCtx, stop, addr) })
			}
		}
	}
	e.expire(e.deps.Now())
}

// addresses returns the peers to watch: the static list and the DNS name's addresses
// at the last lookup, without this replica's own. When a lookup is due (every
// Config.ResolveInterval) it starts one that it does not wait for: a slow DNS server
// must not hold the maintenance that drops silent peers. A failed lookup keeps the
// last answer.
func (e *Exchange) addresses(ctx context.Context) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cfg.DNS != "" && !e.resolving && ctx.Err() == nil &&
		(e.resolvedAt.IsZero() || e.deps.Now().Sub(e.resolvedAt) >= e.cfg.ResolveInterval) {
		// The interval counts from the lookup's start, taken here under the lock: a
		// lookup that ends late must not push the next one further out.
		e.resolving, e.resolvedAt = true, e.deps.Now()
		e.lookups.Go(func() { e.lookUp(ctx) })
	}
	var out []string
	for _, a := range slices.Concat(e.cfg.Addresses, e.resolved) {
		if !e.self[a] && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// lookUp resolves the DNS name and keeps the answer for the next maintenance. A lookup
// that panics (a bug the answer reached) is recovered, logged and counted
// (kvroute_background_panics_total{loop="peers"}), and failed.
func (e *Exchange) lookUp(ctx context.Context) {
	var resolved []string
	err := e.guard.Do(func() (err error) {
		resolved, err = e.resolve(ctx)
		return err
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	e.resolving = false
	if err != nil {
		e.deps.Logger.Warn("peers: DNS lookup failed; watching the addresses last found", "dns", e.cfg.DNS, "err", err)
		return
	}
	e.resolved = resolved
}

func (e *Exchange) resolve(ctx context.Context) ([]string, error) {
	host, port, _ := net.SplitHostPort(e.cfg.DNS)                  // validated
	ctx, cancel := context.WithTimeout(ctx, e.cfg.ResolveInterval) // the next lookup is due by then
	defer cancel()
	ips, err := e.deps.Resolver.LookupHost(ctx, host)
	if err != nil {
		return nil, err
	}
	slices.Sort(ips)
	if len(ips) > MaxAddresses {
		e.deps.Logger.Warn("peers: DNS answer has more addresses than are watched", "dns", e.cfg.DNS, "addresses", len(ips), "watched", MaxAddresses)
		ips = ips[:MaxAddresses]
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = net.JoinHostPort(ip, port)
	}
	return out, nil
}

// errSelf ends the watch of this replica's own address.
var errSelf = errors.New("this replica's own address")

// watch follows one peer's report stream until ctx ends (stop ends it), reconnecting
// with back-off when the stream fails; it ends for good at this replica's own address.
func (e *Exchange) watch(ctx context.Context, stop context.CancelFunc, addr string) {
	var wait time.Duration
	wasRefused := false // the last stream was refused for the token
	tlsFailed := false  // the last stream failed in the TLS handshake
	for {
		opened := time.Now() // real time, as the back-off's waits are
		got, err := e.stream(ctx, addr)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errSelf) {
			e.mu.Lock()
			if ctx.Err() == nil { // maintain has not stopped it: the entry is this watch's
				e.self[addr] = true
				delete(e.watching, addr)
				e.forget(addr) // what another replica said here before (a reused address)
			}
			e.mu.Unlock()
			stop()
			return
		}
		refusedUs := errors.Is(err, errUnauthorized)
		badTLS := !got && (isTLSFailure(err) || errors.Is(err, errPeerServesTLS))
		switch {
		case got && errors.Is(err, errStreamEnded):
			// The peer ended a stream that delivered (its MaxStreamAge, or shutting
			// down): routine, not a disconnect.
			e.deps.Logger.Debug("peers: watch ended by the peer", "peer", addr)
		case refusedUs:
			// A wrong token is a misconfiguration worth a warning, once per run.
			e.deps.Metrics.disconnected()
			if !wasRefused {
				e.deps.Logger.Warn("peers: the peer refuses this replica's token; its load is not counted", "peer", addr)
			}
		case badTLS:
			// A certificate that does not verify (either way) is a misconfiguration too:
			// warned of once per run of failures, not at each retry, nor silently.
			e.deps.Metrics.disconnected()
			if !tlsFailed {
				e.deps.Logger.Warn("peers: TLS with the peer fails (check peers.tls and the peer's admin_tls); its load is not counted", "peer", addr, "err", err)
			}
		default:
			e.deps.Metrics.disconnected()
			e.deps.Logger.Debug("peers: watch ended", "peer", addr, "err", err)
		}
		wasRefused, tlsFailed = refusedUs, badTLS
		wait = backoffAfter(wait, got && time.Since(opened) >= healthyStream, err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// isTLSFailure reports whether err is a TLS handshake's failure rather than the
// network's: a peer certificate that does not verify, an alert from the peer (it
// refused this replica's certificate, or has none), or a peer that does not speak TLS.
func isTLSFailure(err error) bool {
	var verify *tls.CertificateVerificationError
	var record tls.RecordHeaderError
	var op *net.OpError
	return errors.As(err, &verify) || errors.As(err, &record) || errors.Is(err, http.ErrSchemeMismatch) ||
		errors.As(err, &op) && op.Op == "remote error" // crypto/tls's received alert
}

// errPeerServesTLS ends a plain HTTP watch of a peer whose admin port serves TLS.
var errPeerServesTLS = errors.New("status 400: the peer's admin port serves TLS (admin_tls), and this replica watches in plain HTTP (no peers.tls)")

// errUnauthorized ends a stream the peer refused for want of this replica's token.
var errUnauthorized = errors.New("status 401: the peer wants another peers.token_file secret")

// errRefused wraps the end of a stream that sent a report this replica refuses.
var errRefused = errors.New("report refused")

// healthyStream is how long a stream must have delivered reports for its end to reset
// the back-off: a renewed stream lasted a minute, a peer that ends every stream after
// one report (cleanly or not) did not.
const healthyStream = time.Second

// backoffAfter is the wait before reopening a stream that ended with err, given the
// last wait (zero before the first): minBackoff after a healthy stream (one that
// delivered reports for healthyStream), else double the last, at most maxBackoff. A
// stream that ended on a refused report keeps doubling even if it was healthy: a peer
// that sends good reports and then one it refuses must not be reopened ten times a
// second.
func backoffAfter(last time.Duration, healthy bool, err error) time.Duration {
	if last == 0 || healthy && !errors.Is(err, errRefused) {
		return minBackoff
	}
	return min(2*last, maxBackoff)
}

// stream reads one watch stream of a peer, applying each report as it comes. A peer
// silent for StaleAfter (no report, not even a heartbeat) is cut off, as is one that
// sends a report this replica refuses. got says whether any report was accepted. Once
// watchCtx has ended (maintain stopped the watch, or Run is ending) nothing more is
// recorded, not even in the metrics.
func (e *Exchange) stream(watchCtx context.Context, addr string) (got bool, err error) {
	ctx, cancel := context.WithCancel(watchCtx)
	defer cancel()
	silence := time.AfterFunc(e.cfg.StaleAfter, cancel)
	defer silence.Stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.watchURL(addr), nil)
	if err != nil {
		return false, err
	}
	if e.deps.Token != "" {
		req.Header.Set("Authorization", "Bearer "+e.deps.Token)
	}
	resp, err := e.deps.Client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		return false, errUnauthorized
	case http.StatusBadRequest:
		// Go's TLS server answers a plain HTTP request with 400 and this text: in a
		// rollout of admin_tls, the replicas not yet given peers.tls are told why.
		if e.scheme == "http" {
			if head, _ := io.ReadAll(io.LimitReader(resp.Body, 128)); bytes.Contains(head, []byte("HTTP request to an HTTPS server")) {
				return false, errPeerServesTLS
			}
		}
		fallthrough
	default:
		return false, fmt.Errorf("status %d", resp.StatusCode)
	}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 0, 4096), MaxReportBytes+1)
	lines.Split(wholeLines)
	for lines.Scan() {
		silence.Reset(e.cfg.StaleAfter)
		accepted, err := e.take(watchCtx, addr, lines.Bytes())
		got = got || accepted
		if err != nil {
			return got, err
		}
	}
	if err := lines.Err(); err != nil {
		if errors.Is(err, errCutLine) {
			// The peer's side ended inside a report (its write timed out, or it died):
			// a disconnect, not a report the peer sent.
			return got, err
		}
		if errors.Is(err, bufio.ErrTooLong) {
			e.refused(watchCtx)
			return got, fmt.Errorf("%w: %w", errRefused, err)
		}
		return got, err
	}
	return got, errStreamEnded
}

// take handles one report line of addr's stream: it parses the report, takes its loads
// and stores its records, and says whether the report was accepted. A report this
// replica refuses ends the stream (errRefused), counted. So does one whose handling
// panics (a bug the report reached), recovered, logged and counted
// (kvroute_background_panics_total{loop="peers"}): refused as an unparseable report
// is, and the watch reopens the stream after its back-off. A panic after the report's
// loads were taken (storing its records) leaves them taken, and the records stored
// before it; the ledger is given what a panic in it missed at the next change of the
// sums.
func (e *Exchange) take(watchCtx context.Context, addr string, line []byte) (accepted bool, err error) {
	err = e.guard.Do(func() error {
		r, err := parseReport(line)
		if err != nil {
			return fmt.Errorf("%w: %w", errRefused, err)
		}
		if r.Replica == e.deps.Replica {
			return errSelf
		}
		records, err := e.accept(watchCtx, addr, r)
		if err != nil {
			return err
		}
		accepted = true
		e.store(records)
		return nil
	})
	if errors.Is(err, background.ErrPanicked) {
		err = fmt.Errorf("%w: %w", errRefused, err)
	}
	if errors.Is(err, errRefused) && !accepted {
		e.refused(watchCtx)
	}
	return accepted, err
}

// accept takes the loads of r, heard at addr, unless the watch was stopped (its
// error), and returns the records of r to store.
func (e *Exchange) accept(watchCtx context.Context, addr string, r Report) ([]Record, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	// maintain stops a watch under mu: a watch not stopped now is still the one
	// watching addr.
	if watchCtx.Err() != nil {
		return nil, watchCtx.Err()
	}
	records := e.newRecords(addr, r)
	r.Records = nil // stored by the caller; what is heard keeps the loads only
	e.hear(addr, r, e.deps.Now())
	e.deps.Metrics.reported(true)
	return records, nil
}

// watchURL is where this replica watches the peer at addr: with the records asked
// for when it stores them, from after the last one got there.
func (e *Exchange) watchURL(addr string) string {
	u := watchURL(e.scheme, addr)
	if e.deps.Blocks == nil {
		return u
	}
	u += "&records"
	e.mu.Lock()
	defer e.mu.Unlock()
	if at, ok := e.resume[addr]; ok {
		u += "&replica=" + url.QueryEscape(at.replica) + "&after=" + strconv.FormatUint(at.after, 10)
	}
	return u
}

// newRecords returns the records of r, heard at addr, that this replica has not
// stored yet (a replica heard at two addresses sends each record on both streams),
// and those only when made with this replica's block size; it notes where addr's
// stream stands. Called with mu held.
func (e *Exchange) newRecords(addr string, r Report) []Record {
	if len(r.Records) == 0 || e.deps.Blocks == nil {
		return nil
	}
	last := r.RecordsFrom + uint64(len(r.Records)) - 1
	e.resume[addr] = resumePoint{replica: r.Replica, after: last}
	stored := e.storedTo[r.Replica]
	e.storedTo[r.Replica] = max(stored, last)
	records := r.Records
	if stored >= r.RecordsFrom {
		skip := min(stored-r.RecordsFrom+1, uint64(len(records)))
		e.deps.Metrics.receivedRecords(recordDuplicate, int(skip))
		records = records[skip:]
	}
	if e.deps.BlockSize != 0 && r.BlockSize != e.deps.BlockSize {
		e.deps.Metrics.receivedRecords(recordOtherBlockSize, len(records))
		return nil
	}
	// Compared in milliseconds: a peer's age past a Duration's range (292 years) must
	// not wrap into a fresh one.
	if r.RecordsAgeMs > e.cfg.StaleAfter.Milliseconds() {
		// Sent late (a stream resumed after an outage): a decision since, here or at
		// another replica, may have moved these sessions; their blocks still hold.
		for i := range records {
			if !records[i].Response { // a stored response stays where it was stored
				records[i].Session = 0
			}
		}
	}
	return records
}

// store puts a peer's records in this replica's index, as its own decisions are: a
// worker this replica does not route to (a fleet being reloaded, another pool) is
// counted and skipped.
func (e *Exchange) store(records []Record) {
	if e.deps.Blocks == nil {
		return
	}
	for _, rec := range records {
		result := recordStored
		// Also for a record of a session alone (no hashes): the index checks the worker.
		moved, err := e.deps.Blocks.StoreRecord(rec.Worker, rec.Address, rec.hashes())
		switch {
		case err != nil:
			// The index refuses only a worker it does not know.
			result = recordUnknownWorker
		case moved:
			// Made for an engine at the worker's old address, cleared here since: its
			// blocks are not the new engine's, nor is its session.
			result = recordMovedWorker
		}
		remember := e.deps.Sessions
		if rec.Response {
			remember = e.deps.Responses
		}
		if rec.Session != 0 && remember != nil && result == recordStored {
			remember.RememberKey(rec.Session, rec.Worker)
		}
		e.deps.Metrics.receivedRecords(result, 1)
	}
}

// errCutLine ends a stream cut inside a line.
var errCutLine = errors.New("stream cut inside a report")

// wholeLines splits a watch stream into the lines its peer finished, each without its
// "\n" (or "\r\n"). Unlike bufio.ScanLines it does not hand on what follows the last
// newline when the stream ends: that is a report cut short, not one to parse.
func wholeLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, bytes.TrimSuffix(data[:i], []byte{'\r'}), nil
	}
	if atEOF && len(data) > 0 {
		return 0, nil, errCutLine
	}
	return 0, nil, nil
}

// errStreamEnded ends a stream the peer closed cleanly.
var errStreamEnded = errors.New("stream ended")

// refused counts a refused report, unless the watch was stopped.
func (e *Exchange) refused(watchCtx context.Context) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if watchCtx.Err() == nil {
		e.deps.Metrics.reported(false)
	}
}

// hear records a report heard from addr at now, makes it its replica's counted
// report (the latest heard, at whichever address), and gives the ledger what changed.
// Called with mu held.
func (e *Exchange) hear(addr string, r Report, now time.Time) {
	before, had := e.heard[addr]
	if !before.live {
		e.deps.Logger.Info("peers: peer reporting", "peer", addr, "replica", r.Replica)
	}
	e.heard[addr] = heard{report: r, at: now, live: true}
	touched := e.sums.count(countedReport{addr: addr, at: now, report: r})
	if had && before.report.Replica != r.Replica {
		// A new replica at this address (a restart): the old one's report heard here
		// is gone; it counts with what its other addresses last sent, if fresh.
		touched = append(touched, e.recount(before.report.Replica, now)...)
		e.pruneStoredTo()
	}
	e.give(touched)
}

// forget drops what was heard from addr, an address no longer watched. Called with mu
// held.
func (e *Exchange) forget(addr string) {
	h, ok := e.heard[addr]
	if !ok {
		return
	}
	delete(e.heard, addr)
	delete(e.resume, addr)
	e.pruneStoredTo()
	if c, ok := e.sums.counted[h.report.Replica]; ok && c.addr == addr {
		e.give(e.recount(h.report.Replica, e.deps.Now()))
	}
}

// pruneStoredTo forgets where the records of replicas no longer heard at any address
// stood (replicas restart with a new id). Called with mu held.
func (e *Exchange) pruneStoredTo() {
	heardNow := make(map[string]bool, len(e.heard))
	for _, h := range e.heard {
		heardNow[h.report.Replica] = true
	}
	for replica := range e.storedTo {
		if !heardNow[replica] {
			delete(e.storedTo, replica)
		}
	}
}

// expire stops counting the replicas heard from no longer than StaleAfter ago, and
// logs the peers that went silent or came back. Called with mu held.
func (e *Exchange) expire(now time.Time) {
	for addr, h := range e.heard {
		if fresh := e.fresh(h.at, now); fresh != h.live {
			if !fresh {
				e.deps.Logger.Warn("peers: peer silent; its load is no longer counted", "peer", addr, "replica", h.report.Replica, "silent_for", now.Sub(h.at))
			}
			h.live = fresh
			e.heard[addr] = h
		}
	}
	var touched []string
	for replica, c := range e.sums.counted {
		if !e.fresh(c.at, now) {
			touched = append(touched, e.recount(replica, now)...) // the latest was counted: none is fresh
		}
	}
	e.give(touched)
}

func (e *Exchange) fresh(at, now time.Time) bool { return now.Sub(at) <= e.cfg.StaleAfter }

// recount counts a replica with its latest fresh report heard at any address, or not
// at all, and returns the workers whose sums may have changed. Called with mu held.
func (e *Exchange) recount(replica string, now time.Time) []string {
	var latest countedReport
	for addr, h := range e.heard {
		if h.report.Replica == replica && e.fresh(h.at, now) &&
			(latest.addr == "" || h.at.After(latest.at) || h.at.Equal(latest.at) && addr < latest.addr) {
			latest = countedReport{addr: addr, at: h.at, report: h.report}
		}
	}
	if latest.addr == "" {
		return e.sums.uncount(replica)
	}
	return e.sums.count(latest)
}

// give tells the ledger the sums of the touched workers that changed. Called with mu
// held.
func (e *Exchange) give(touched []string) {
	var now time.Time // read once, for the first prefill history that changed
	for _, worker := range touched {
		if e.sums.takeHistoryChanged(worker) {
			if now.IsZero() {
				now = e.deps.Now()
			}
			_, held := e.histories[worker]
			if h := e.sums.history(worker, now); h > 0 || held {
				e.deps.Ledger.SetPeerHistory(worker, h)
				if h > 0 {
					e.histories[worker] = struct{}{}
				} else {
					delete(e.histories, worker)
				}
			}
		}
		l := e.sums.load(worker)
		if l == (scoring.Load{}) {
			if _, ok := e.applied[worker]; ok {
				e.deps.Ledger.SetPeerLoad(worker, l)
				delete(e.applied, worker)
			}
		} else if e.applied[worker] != l {
			e.deps.Ledger.SetPeerLoad(worker, l)
			e.applied[worker] = l
		}
		if a := e.sums.adapters(worker); !maps.Equal(a, e.adapters[worker]) {
			e.deps.Ledger.SetPeerAdapters(worker, a)
			if a == nil {
				delete(e.adapters, worker)
			} else {
				e.adapters[worker] = a
			}
		}
	}
	e.deps.Metrics.setLive(len(e.sums.counted))
}

// withdraw forgets every peer load given to the ledger.
func (e *Exchange) withdraw() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for worker := range e.applied {
		e.deps.Ledger.SetPeerLoad(worker, scoring.Load{})
	}
	for worker := range e.adapters {
		e.deps.Ledger.SetPeerAdapters(worker, nil)
	}
	for worker := range e.histories {
		e.deps.Ledger.SetPeerHistory(worker, 0)
	}
	clear(e.applied)
	clear(e.adapters)
	clear(e.histories)
	clear(e.heard)
	e.sums = newSums()
	e.deps.Metrics.setLive(0)
}

// PeerStatus is one watched peer's state.
type PeerStatus struct {
	Address    string    `json:"address"`
	Replica    string    `json:"replica"`
	LastReport time.Time `json:"last_report"`
	// Live says whether its last report came within stale_after: its load counts.
	Live bool `json:"live"`
	// RecordsAfter is the number of the last of its records this replica got at
	// this address (peers.share_blocks; 0: none yet): where a reopened stream resumes.
	RecordsAfter uint64 `json:"records_after,omitempty"`
}

// Peers returns the peers heard from, by address.
func (e *Exchange) Peers() []PeerStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.deps.Now()
	out := make([]PeerStatus, 0, len(e.heard))
	for addr, h := range e.heard {
		st := PeerStatus{Address: addr, Replica: h.report.Replica, LastReport: h.at, Live: e.fresh(h.at, now)}
		if at, ok := e.resume[addr]; ok && at.replica == h.report.Replica {
			st.RecordsAfter = at.after
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b PeerStatus) int { return strings.Compare(a.Address, b.Address) })
	return out
}

// StatusHandler serves GET /peers on the admin port: this replica's id and the
// peers it hears from ([PeerStatus]), for an operator asking why a replica's costs
// miss another's load or placements. A nil Exchange (no peers configured) lists none.
func StatusHandler(replica string, cfg Config, e *Exchange) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		peers := []PeerStatus{}
		if e != nil {
			peers = e.Peers()
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(struct {
			Replica     string       `json:"replica"`
			ShareBlocks bool         `json:"share_blocks"`
			Peers       []PeerStatus `json:"peers"`
		}{replica, cfg.ShareBlocks, peers})
	})
}
