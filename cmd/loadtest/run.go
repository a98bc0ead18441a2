package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/flowcontrol"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize/models"
	"go.yaml.in/yaml/v3"
)

// run starts the workers, kvroute and the data plane, drives the load for o.duration,
// drains it, and stops everything it started. Sample lines go to progress.
func run(ctx context.Context, o options, progress io.Writer) (*report, error) {
	dir, err := os.MkdirTemp("", "kvroute-loadtest")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var base []byte
	if o.kvrouteConfig != "" {
		if base, err = os.ReadFile(o.kvrouteConfig); err != nil {
			return nil, fmt.Errorf("-kvroute-config: %w", err)
		}
	}
	if o.pprofDir != "" {
		if err := os.MkdirAll(o.pprofDir, 0o755); err != nil {
			return nil, err
		}
	}

	// The workers listen first: kvroute's config names their addresses, and their block
	// size is kvroute's.
	listeners := make([]net.Listener, o.workers)
	workerCfg := make([]map[string]any, o.workers)
	for i := range listeners {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		listeners[i] = ln
		workerCfg[i] = map[string]any{"name": fmt.Sprint("w", i), "address": ln.Addr().String()}
	}
	raw, cfg, err := kvrouteConfig(base, workerCfg, o.load.api.defaultModel(o.load.model), o.pprofDir != "")
	if err != nil {
		return nil, err
	}
	// kvroute is told each worker's real cache size, as a deployment would be.
	engine := engineConfig(o, cfg.Router.BlockSize)
	for _, w := range workerCfg {
		w["capacity_blocks"] = engine.NumGPUBlocks
	}
	if raw, cfg, err = kvrouteConfig(base, workerCfg, o.load.api.defaultModel(o.load.model), o.pprofDir != ""); err != nil {
		return nil, err
	}
	// The workers tokenize as kvroute is configured to (one set, shared: loaded once).
	tokenizers, err := models.Load(cfg.Tokenizers, models.Deps{MaxPromptTokens: cfg.Filter.MaxPromptTokens})
	if err != nil {
		return nil, err
	}
	if o.hostileStreams > 0 && o.hostileBytes > cfg.Filter.MaxBodyBytes {
		return nil, fmt.Errorf("-hostile-bytes: %d is over kvroute's max_body_bytes (%d): it would get a 413 unread", o.hostileBytes, cfg.Filter.MaxBodyBytes)
	}
	for i, ln := range listeners {
		stop, err := serveWorker(ln, mockworker.Config{Name: fmt.Sprint("w", i), Engine: engine, Speed: o.speed,
			DefaultMaxTokens: o.load.outputTokens, TokensPerEvent: o.perEvent, Seed: uint64(i + 1), Tokenizers: tokenizers},
			o.hostileStreams > 0)
		if err != nil {
			return nil, err
		}
		defer stop()
	}

	// Each replica is a process of its own behind a data plane of its own; replica 0 is
	// the one sampled and reported.
	raws, err := replicaConfigs(raw, o.replicas, o.peers, dir)
	if err != nil {
		return nil, err
	}
	replicas := make([]*kvroute, len(raws))
	for r, raw := range raws {
		replicaDir := filepath.Join(dir, fmt.Sprint("replica", r))
		if err := os.Mkdir(replicaDir, 0o700); err != nil {
			return nil, err
		}
		if replicas[r], err = startKvroute(o.bin, replicaDir, raw, cfg); err != nil {
			return nil, err
		}
		defer replicas[r].proc.Stop()
	}
	k := replicas[0]

	// Tenants are named in the header kvroute reads them from; with none configured
	// (one flow), in the default one, which it then ignores.
	o.load.fairnessHeader = cmp.Or(cfg.FlowControl.FairnessHeader, flowcontrol.DefaultFairnessHeader)
	g := newGenerator(o.load, o.streams)
	for _, replica := range replicas {
		plane := envoytest.NewServer(envoytest.Config{
			ProcessorAddress: replica.grpcAddr, SendProtocolConfig: true, DiscardExchanges: true,
			// examples/envoy.yaml: BUFFERED requests, STREAMED responses, 4 MiB connection
			// buffer, failing closed, its 2 s message timeout unless told otherwise.
			ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED,
				ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED},
			MessageTimeout: o.msgTimeout, BufferLimit: dataPlaneBuffer, ReceivingNamespaces: []string{"envoy.lb"},
			DestinationHeader: cfg.Filter.DestinationHeader,
			OnRoundTrip: func(rt envoytest.RoundTrip) {
				if h := g.cur.Load().roundTrips[rt.Message]; h != nil {
					h.observe(rt.Took)
				}
			},
		})
		defer plane.Close()
		g.urls = append(g.urls, plane.URL)
	}

	var hostile *hostileClient
	if o.hostileStreams > 0 {
		hostile = newHostileClient(o.hostileKinds, o.load.model, o.hostileBytes, o.hostileStreams, o.load.requestTimeout)
		hostile.urls = g.urls
	}

	first, err := k.scrape(ctx)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "loadtest: %d streams of %s bodies (POST %s) for %s (warm-up %s) through envoytest → kvroute (pid %d) → %d mockworkers ×%g; prompts %d→%d tokens, %d output tokens\n",
		o.streams, o.load.api, o.load.api.path(), o.duration, o.warmup, k.proc.Pid(), o.workers, o.speed, o.load.prefixTokens, o.load.maxPromptTokens, o.load.outputTokens)
	if hostile != nil {
		pace := "back to back"
		if o.hostileEvery > 0 {
			pace = fmt.Sprintf("each at most one every %s", o.hostileEvery)
		}
		fmt.Fprintf(progress, "loadtest: from the warm-up's end, %d hostile streams of each of %v send %d-byte bodies, %s\n",
			o.hostileStreams, o.hostileKinds, o.hostileBytes, pace)
	}
	if o.load.samplesMix != nil {
		fmt.Fprintf(progress, "loadtest: streams by samples a request %s: %d sequences at once, %d batch slots (max_num_seqs %d × %d workers)\n",
			groupList(o.load.samplesMix), mixSequences(o.load.samplesMix), engine.MaxNumSeqs*o.workers, engine.MaxNumSeqs, o.workers)
	}
	if o.load.tenants != nil {
		fmt.Fprintf(progress, "loadtest: tenants %s, named in %s; a 429 is retried after its retry-after\n", groupList(o.load.tenants), o.load.fairnessHeader)
	}
	if fc := cfg.FlowControl; fc.Enabled {
		fmt.Fprintf(progress, "loadtest: flow control on (max_wait %s, max_queued %d, fairness header %q)\n", fc.MaxWait, fc.MaxQueued, fc.FairnessHeader)
		if o.msgTimeout <= fc.MaxWait {
			fmt.Fprintf(progress, "loadtest: warning: the data plane's message timeout (%s) is not longer than max_wait: a request held past it gets the data plane's 504\n", o.msgTimeout)
		}
	}
	if o.replicas > 1 {
		fmt.Fprintf(progress, "loadtest: %d kvroute replicas, each behind its own data plane (streams spread over them); peers exchange: %t; replica 0 is sampled\n",
			o.replicas, o.peers)
	}

	loadCtx, stopLoad := context.WithTimeout(ctx, o.duration)
	defer stopLoad()
	reqCtx, cancelRequests := context.WithCancel(context.Background())
	defer cancelRequests()
	var streams sync.WaitGroup
	ramp := min(o.warmup/2, 5*time.Second)
	for i := range o.streams {
		streams.Go(func() {
			sleep(loadCtx, ramp*time.Duration(i)/time.Duration(o.streams))
			g.stream(loadCtx, reqCtx, i)
		})
	}

	// /proc is read until the drain has ended: the peak may come from requests in flight.
	procCtx, stopProc := context.WithCancel(context.Background())
	defer stopProc()
	ps := &procSampler{pid: k.proc.Pid(), every: o.procEvery}
	procDone := make(chan struct{})
	go func() { defer close(procDone); ps.loop(procCtx) }()

	capacity := float64(o.workers * engine.NumGPUBlocks)
	s := &sampler{k: k, g: g, out: progress, every: o.sample, indexCapacity: capacity, prev: first, prevCPU: selfCPU(),
		flowControl: cfg.FlowControl.Enabled}
	samplerDone := make(chan struct{})
	go func() { defer close(samplerDone); s.loop(loadCtx) }()

	var warm snapshot
	var warmM *measured
	var hostileStart time.Time
	profiled := make(chan error, 1)
	sleep(loadCtx, o.warmup)
	if loadCtx.Err() == nil {
		g.reset()
		warmM = g.cur.Load()
		if warm, err = k.scrape(ctx); err != nil {
			return nil, err
		}
		s.markWarm()
		ps.markWarm()
		if hostile != nil {
			hostileStart = time.Now()
			for _, kind := range o.hostileKinds {
				for i := range o.hostileStreams {
					streams.Go(func() { hostile.stream(loadCtx, reqCtx, kind, i, o.hostileEvery) })
				}
			}
		}
		if o.pprofDir != "" {
			secs := max(1, min(30, int((o.duration-o.warmup)/time.Second)-2))
			go func() {
				profiled <- k.profile(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), filepath.Join(o.pprofDir, "cpu.pprof"))
			}()
		}
	}
	<-loadCtx.Done()
	end, endCPU := time.Now(), selfCPU()
	ps.end()
	endSnap, endErr := k.scrape(context.Background())
	<-samplerDone
	if ctx.Err() != nil {
		return nil, errors.New("interrupted")
	}

	// Drain: no new requests; those in flight finish, or are cut after o.drain.
	drained := make(chan struct{})
	go func() { streams.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(o.drain):
		cancelRequests()
		<-drained
	}
	if o.pprofDir != "" && warmM != nil {
		if err := <-profiled; err != nil {
			return nil, err
		}
		for _, p := range []string{"allocs", "heap"} {
			if err := k.profile(context.Background(), "/debug/pprof/"+p, filepath.Join(o.pprofDir, p+".pprof")); err != nil {
				return nil, err
			}
		}
	}
	last, lastErr := k.waitIdle(10 * time.Second)
	stopProc()
	<-procDone
	var others []replicaEnd
	for r, replica := range replicas[1:] {
		snap, err := replica.waitIdle(10 * time.Second)
		others = append(others, replicaEnd{replica: r + 1, exited: replica.proc.Exited(), tail: replica.proc.Tail(),
			bookingsLeft: snap.bookingsLeft(), peerReports: snap.peerReports, scrapeErr: err})
	}

	rep := &report{opts: o, measureStart: warm.at, measureEnd: end, samples: s.samples(), loadCPU: endCPU - s.warmCPU, indexCapacity: capacity,
		Replicas: o.replicas, Peers: o.peers, others: others, peerReports: last.peerReports, flowControl: cfg.FlowControl.Enabled}
	rep.Proc = ps.report()
	if hostile != nil && !hostileStart.IsZero() {
		rep.Hostile = hostile.report(o.hostileStreams, end.Sub(hostileStart).Seconds())
	}
	rep.kvrouteExited = k.proc.Exited()
	rep.kvrouteTail = k.proc.Tail()
	if endErr != nil || lastErr != nil || warmM == nil {
		rep.scrapeErr = errors.Join(endErr, lastErr)
		if warmM == nil {
			rep.scrapeErr = errors.Join(rep.scrapeErr, errors.New("the run ended during the warm-up"))
		}
	} else {
		rep.fill(g, warmM, first, warm, endSnap, last)
	}
	g.errMu.Lock()
	rep.errors, rep.errorExamples = g.errs, g.examples
	g.errMu.Unlock()
	return rep, nil
}

// engineConfig sizes the simulated engines so they stay out of the way: every stream
// can run at once and its prompt fits in the cache, with room for paused sessions.
func engineConfig(o options, blockSize int) sim.Config {
	seqs := o.maxNumSeqs
	if seqs == 0 {
		// Each stream's request runs -samples sequences (its class's, with -samples-mix).
		all := o.streams * o.load.samples
		if o.load.samplesMix != nil {
			all = mixSequences(o.load.samplesMix)
		}
		seqs = (all+o.workers-1)/o.workers + 8
	}
	perSeq := (o.load.maxPromptTokens+o.load.outputTokens)/blockSize + 2
	return sim.Config{BlockSize: blockSize, MaxNumSeqs: seqs, NumGPUBlocks: max(16384, 2*seqs*perSeq), MaxBatchedTokens: 8192}
}

// dataPlaneBuffer is the data plane's per-connection buffer (examples/envoy.yaml's 4
// MiB): a larger BUFFERED body gets Envoy's 413 without reaching kvroute.
const dataPlaneBuffer = 4 << 20

// serveWorker serves a mock worker on ln until stop; with refuse, it refuses hostile
// requests (refuseHostile).
func serveWorker(ln net.Listener, cfg mockworker.Config, refuse bool) (stop func(), err error) {
	w, err := mockworker.New(cfg)
	if err != nil {
		return nil, err
	}
	h := w.Handler()
	if refuse {
		h = refuseHostile(cfg.Name, h)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close(); w.Close() }, nil
}

// waitIdle polls kvroute until every booking gauge reads 0 (a stream releases its
// booking when it ends, just after the client has its answer) or timeout passes, and
// returns the last scrape.
func (k *kvroute) waitIdle(timeout time.Duration) (snapshot, error) {
	deadline := time.Now().Add(timeout)
	for {
		s, err := k.scrape(context.Background())
		if err != nil || s.bookingsLeft() == 0 || time.Now().After(deadline) {
			return s, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// selfCPU is this process's CPU time so far (user + system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// replicaConfigs returns one config per replica: raw itself for one; for several, each
// on an admin port of its own reserved here (as a deployment names them), and with
// peers all of them in peers.addresses (each recognises and skips its own) and one
// shared secret in peers.token_file, written in dir.
func replicaConfigs(raw []byte, replicas int, peers bool, dir string) ([][]byte, error) {
	if replicas <= 1 {
		return [][]byte{raw}, nil
	}
	tokenFile := filepath.Join(dir, "peers-token")
	if peers {
		if err := os.WriteFile(tokenFile, []byte(rand.Text()+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	admins := make([]string, replicas)
	for r := range admins {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		admins[r] = ln.Addr().String()
		ln.Close()
	}
	out := make([][]byte, replicas)
	for r := range out {
		doc := map[string]any{}
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			return nil, err
		}
		doc["admin_address"] = admins[r]
		if peers {
			doc["peers"] = map[string]any{"addresses": admins, "token_file": tokenFile}
		}
		var err error
		if out[r], err = yaml.Marshal(doc); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// replicaEnd is how a replica other than the sampled one ended the run.
type replicaEnd struct {
	replica      int
	exited       bool
	tail         []string
	bookingsLeft float64
	peerReports  map[string]float64 // kvroute_peers_reports_total by result
	scrapeErr    error
}
