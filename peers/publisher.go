package peers

import (
	"fmt"
	"sync"
	"time"
)

// publisher encodes the ledger's report once per version for every watcher and GET,
// and while anyone watches, looks at the ledger every interval for a new version.
type publisher struct {
	replica  string
	ledger   Ledger
	records  *Records // nil: reports carry none
	interval time.Duration

	mu       sync.Mutex
	last     *encoded      // the newest encoded report; nil before the first
	watchers int           // streams joined
	stop     chan struct{} // ends the polling goroutine; nil while no one watches
}

// encoded is one version of the report: the ledger's version, encoded, and the number
// of the newest record sealed with it. next is closed when a newer one replaces it.
// at is when its prefill histories were taken, on this process's monotonic clock;
// history says whether it carries any.
type encoded struct {
	version uint64
	records uint64
	plain   []byte
	at      time.Time
	history bool
	next    chan struct{}
}

// line is e's report as sent now: with its age (age_ms) when it carries prefill
// histories and was encoded 1 ms ago or more (a heartbeat, a new stream, a plain GET),
// so that the watcher dates them from when they were read. A report sent as soon as it
// was encoded is the same bytes for every watcher.
func (e *encoded) line() []byte {
	if !e.history {
		return e.plain
	}
	ms := time.Since(e.at).Milliseconds()
	if ms < 1 {
		return e.plain
	}
	out := make([]byte, 0, len(e.plain)+40)
	out = append(out, e.plain[:len(e.plain)-2]...) // without "}\n"
	out = fmt.Appendf(out, `,"age_ms":%d}`, ms)
	return append(out, '\n')
}

// current returns the report of the ledger's version now, encoding it if it is new or
// records were made since the last (and waking the watchers).
func (p *publisher) current() *encoded {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The version is read before the loads: a change after this read may be in the
	// encoded loads already, and is encoded again under its own version. Read under
	// mu, so versions are encoded in order, and the records taken go out in order.
	version := p.ledger.Version()
	records := p.records.seal()
	if p.last != nil && p.last.version == version && p.last.records == records {
		return p.last
	}
	var e *encoded
	if p.last != nil && p.last.version == version {
		// Only records were sealed: the same version, the same loads and histories.
		e = &encoded{plain: p.last.plain, at: p.last.at, history: p.last.history}
	} else {
		loads, adapters := p.ledger.LoadsWithAdapters()
		histories := p.ledger.PrefillHistories()
		e = &encoded{at: time.Now()}
		e.plain, e.history = reportOf(p.replica, loads, adapters, histories)
	}
	e.version, e.records, e.next = version, records, make(chan struct{})
	if p.last != nil {
		close(p.last.next)
	}
	p.last = e
	return e
}

// latest returns the newest encoded report, without looking at the ledger.
func (p *publisher) latest() *encoded {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// join counts a watcher, starts the polling with the first, and returns the report
// to send it first.
func (p *publisher) join() *encoded {
	e := p.current()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.watchers++; p.watchers == 1 {
		p.stop = make(chan struct{})
		go p.poll(p.stop)
	}
	return e
}

// leave uncounts a watcher; the last one stops the polling.
func (p *publisher) leave() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.watchers--; p.watchers == 0 {
		close(p.stop)
		p.stop = nil
	}
}

func (p *publisher) poll(stop <-chan struct{}) {
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			p.current()
		}
	}
}
