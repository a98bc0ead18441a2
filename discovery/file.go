package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/zeebo/xxh3"
	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/router"
)

// File is a workers file watched for changes: a YAML document `workers: [...]` with
// the config's worker entries. Each change is read whole and validated; a file that
// does not parse or validate is rejected (the workers in force stay).
//
// It watches the file's directory, not the file, so that it sees every way a file is
// replaced: written in place, written elsewhere and renamed over it (editors, `mv`), and
// a Kubernetes ConfigMap volume's atomic swap of its `..data` symlink. When the path is
// a symlink, the target's directory is watched too. It also reads the file every
// resync, and watches again what it could not: a change no watch saw (a directory
// removed and made again, a node out of inotify watches) is applied all the same.
type File struct {
	path string
	// adapters are the config's lora_adapters, which the entries are checked against.
	adapters []router.LoRAAdapter
	log      *slog.Logger
	guard    background.Guard // each read's
	settle   time.Duration
	resync   time.Duration
	preload  []router.Worker
	// last is what the last read found (a hash of the file, or its error): a resync
	// that finds the same reports nothing.
	last string
}

var _ Preloaded = (*File)(nil)

// MaxFileBytes bounds a workers file: a fleet of thousands of workers fits in well
// under a megabyte.
const MaxFileBytes = 4 << 20

// DefaultSettle is how long the file must be quiet after a change before it is read: an
// editor's save is several events (truncate, write, chmod, rename).
const DefaultSettle = 100 * time.Millisecond

// maxSettles bounds the wait for quiet, in settle times: the directory is watched, and
// another file there written without pause (a log) would otherwise put off every read.
// Long enough that a writer still streaming the file itself is rarely read half-way.
const maxSettles = 50

// DefaultResync is how often the file is read whatever its watch says.
const DefaultResync = 30 * time.Second

// NewFile reads the workers file at path and returns its source; its entries are
// checked against adapters, the config's lora_adapters, as the config's own workers
// are. A file that cannot be read or does not validate is an error here: kvroute does
// not start on one.
func NewFile(path string, adapters []router.LoRAAdapter, log *slog.Logger) (*File, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &File{path: path, adapters: adapters, log: log, guard: background.NewGuard(background.LoopDiscovery, log, nil),
		settle: DefaultSettle, resync: DefaultResync}
	workers, sum, err := f.read()
	if err != nil {
		return nil, err
	}
	f.preload, f.last = workers, sum
	return f, nil
}

// CountPanics counts the reads that panicked in m (loop "discovery"). Call it before
// Run.
func (f *File) CountPanics(m *background.Metrics) {
	f.guard = background.NewGuard(background.LoopDiscovery, f.log, m)
}

// Workers returns the workers the file held when NewFile read it.
func (f *File) Workers() []router.Worker { return slices.Clone(f.preload) }

// ReadWorkersFile reads and validates a workers file against adapters, the config's
// lora_adapters; errors name the file and the key.
func ReadWorkersFile(path string, adapters []router.LoRAAdapter) ([]router.Worker, error) {
	workers, _, err := (&File{path: path, adapters: adapters}).read()
	return workers, err
}

// read reads and validates the file; sum tells what it found (the content's hash, or
// the error), so that a resync can skip a file it has read before.
func (f *File) read() (workers []router.Worker, sum string, err error) {
	file, err := os.Open(f.path)
	if err != nil {
		err = fmt.Errorf("discovery.file.path: %w", err)
		return nil, err.Error(), err
	}
	defer file.Close()
	raw, err := io.ReadAll(io.LimitReader(file, MaxFileBytes+1))
	if err != nil {
		err = fmt.Errorf("discovery.file.path: %s: %w", f.path, err)
		return nil, err.Error(), err
	}
	if len(raw) > MaxFileBytes {
		err = fmt.Errorf("discovery.file.path: %s: larger than %d bytes", f.path, MaxFileBytes)
		return nil, err.Error(), err
	}
	sum = "xxh3:" + strconv.FormatUint(xxh3.Hash(raw), 16)
	if workers, err = ParseWorkers(raw, f.adapters); err != nil {
		return nil, sum, fmt.Errorf("discovery.file.path: %s: %w", f.path, err)
	}
	return workers, sum, nil
}

// ParseWorkers decodes a workers file strictly (unknown and duplicate keys, and a second
// document, are errors) and validates its entries as the config's `workers`, against
// adapters, the config's lora_adapters (a worker's own lora_adapters name them; its
// models must not). An empty list is valid: a fleet scaled to zero.
func ParseWorkers(raw []byte, adapters []router.LoRAAdapter) ([]router.Worker, error) {
	var doc struct {
		Workers *[]router.Worker `yaml:"workers"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty file: want `workers:` and a list")
		}
		return nil, err
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one YAML document")
	}
	if doc.Workers == nil {
		return nil, errors.New("workers: missing (an empty fleet is `workers: []`)")
	}
	workers := *doc.Workers
	if err := (router.Config{BlockSize: 1, Workers: workers, LoRAAdapters: adapters}).Validate(); err != nil {
		return nil, err
	}
	return workers, nil
}

// Run watches the file until ctx is done, reporting each valid version of it. A watch
// that cannot be set up is logged, and the file is then read every resync.
func (f *File) Run(ctx context.Context, sink Sink) error {
	var events <-chan fsnotify.Event
	var errs <-chan error
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		f.log.Warn("workers file: cannot watch for changes; reading it every resync", "path", f.path, "resync", f.resync.String(), "error", err)
	} else {
		defer watcher.Close()
		events, errs = watcher.Events, watcher.Errors
	}
	watched := map[string]bool{}
	unwatched := map[string]bool{} // warned of, until a watch succeeds
	watchDirs := func() {
		if watcher == nil {
			return
		}
		dirs := []string{filepath.Dir(f.path)}
		if target, err := filepath.EvalSymlinks(f.path); err == nil {
			dirs = append(dirs, filepath.Dir(target))
		}
		for _, dir := range dirs {
			if watched[dir] {
				continue
			}
			if err := watcher.Add(dir); err != nil {
				if !unwatched[dir] {
					f.log.Warn("workers file: cannot watch directory; reading the file every resync", "dir", dir, "resync", f.resync.String(), "error", err)
					unwatched[dir] = true
				}
				continue
			}
			watched[dir] = true
			delete(unwatched, dir)
		}
	}
	watchDirs()
	// The file may have changed between NewFile and the watch: read it once more.
	f.reload(sink, false)

	resync := time.NewTicker(f.resync)
	defer resync.Stop()
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	// since is when the first event not yet read arrived (zero: none): a read waits for
	// settle quiet, but no longer than maxSettles settle times after it.
	var since time.Time
	wait := func() {
		now := time.Now()
		if since.IsZero() {
			since = now
		}
		settle.Reset(max(min(f.settle, since.Add(maxSettles*f.settle).Sub(now)), 0))
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-events:
			if !ok {
				return errors.New("discovery: file watcher closed")
			}
			if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
				// A removed directory drops its watch; a swapped symlink points elsewhere.
				for dir := range watched {
					if _, err := os.Stat(dir); err != nil {
						delete(watched, dir)
					}
				}
			}
			wait()
		case err, ok := <-errs:
			if !ok {
				return errors.New("discovery: file watcher closed")
			}
			// An overflowed event queue may have hidden a change: read again.
			f.log.Warn("workers file: watch error; reading the file again", "path", f.path, "error", err)
			wait()
		case <-settle.C:
			since = time.Time{}
			watchDirs()
			f.reload(sink, false)
		case <-resync.C:
			if watcher != nil { // the watches in force: a removed directory lost its own
				watched = map[string]bool{}
				for _, dir := range watcher.WatchList() {
					watched[dir] = true
				}
			}
			watchDirs()
			if !since.IsZero() {
				// A watched change is settling: the settle read reports it, and read
				// now, a file still being written in place would be applied half-written.
				continue
			}
			f.reload(sink, true)
		}
	}
}

// reload reads the file and reports it. An unchanged file is harmless: the runner
// skips a set equal to the one in force (and a file back to a valid state clears the
// rejection). A resync reports only what differs from the last read. A read or report
// that panics (a bug the file reached) is recovered, logged and counted
// (kvroute_background_panics_total{loop="discovery"}), and rejected: the workers in
// force stay, and the next resync reads the file again.
func (f *File) reload(sink Sink, resync bool) {
	err := f.guard.Do(func() error {
		f.report(sink, resync)
		return nil
	})
	if err != nil {
		f.last = ""
		sink.Reject(fmt.Errorf("discovery.file.path: %s: %w", f.path, err))
	}
}

// report reads the file and reports it, unguarded.
func (f *File) report(sink Sink, resync bool) {
	workers, sum, err := f.read()
	if resync && sum == f.last {
		return
	}
	f.last = sum
	if err != nil {
		sink.Reject(err)
		return
	}
	sink.Update(workers)
}
