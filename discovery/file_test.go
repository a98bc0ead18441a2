package discovery

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/background/backgroundtest"
	"github.com/kvroute/kvroute/router"
)

func TestParseWorkers(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    []router.Worker
		wantErr string
	}{
		{"entries like the config's", "workers:\n  - {name: a, address: '10.0.0.1:8000', models: [m], capacity_blocks: 2048}\n",
			[]router.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"m"}, CapacityBlocks: 2048}}, ""},
		{"an empty fleet", "workers: []\n", []router.Worker{}, ""},
		{"no workers key", "{}\n", nil, "workers: missing"},
		{"empty file", "", nil, "empty file"},
		{"unknown key", "workers: []\nreplicas: 3\n", nil, "field replicas not found"},
		{"unknown worker key", "workers: [{name: a, address: '10.0.0.1:1', weight: 2}]\n", nil, "field weight not found"},
		{"duplicate key", "workers: []\nworkers: []\n", nil, "already defined"},
		{"two documents", "workers: []\n---\nworkers: []\n", nil, "more than one YAML document"},
		{"host name address", "workers: [{name: a, address: 'vllm:8000'}]\n", nil, "workers[0].address"},
		{"duplicate name", "workers: [{name: a, address: '10.0.0.1:1'}, {name: a, address: '10.0.0.2:1'}]\n", nil, "workers[1].name"},
		{"not YAML", "workers: [\n", nil, "yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseWorkers([]byte(tt.raw), nil)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestParseWorkersChecksTheConfigsAdapters: a file's entries are checked against the
// config's lora_adapters, as the config's own workers are.
func TestParseWorkersChecksTheConfigsAdapters(t *testing.T) {
	adapters := []router.LoRAAdapter{{Name: "sql", BaseModel: "qwen"}}
	got, err := ParseWorkers([]byte("workers: [{name: a, address: '10.0.0.1:1', models: [qwen], lora_adapters: [sql]}]\n"), adapters)
	require.NoError(t, err, "a worker's own lora_adapters name declared adapters")
	assert.Equal(t, []string{"sql"}, got[0].LoRAAdapters)
	_, err = ParseWorkers([]byte("workers: [{name: a, address: '10.0.0.1:1', models: [sql]}]\n"), adapters)
	assert.ErrorContains(t, err, `workers[0].models[0]: "sql" is a LoRA adapter`)
}

func FuzzParseWorkers(f *testing.F) {
	f.Add([]byte("workers:\n  - {name: a, address: '10.0.0.1:8000', models: [m], capacity_blocks: 2048}\n"))
	f.Add([]byte("workers: []\n"))
	f.Add([]byte("workers: [{name: a, address: '[::1]:1'}]\n---\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		workers, err := ParseWorkers(raw, nil)
		if err == nil {
			// Whatever parses is a set the router accepts.
			require.NoError(t, router.Config{BlockSize: 1, Workers: workers}.Validate())
		}
	})
}

// recordingSink sends what a source reports on a channel.
type recordingSink struct{ events chan any }

func (s recordingSink) Update(workers []router.Worker) { s.events <- workers }
func (s recordingSink) Reject(err error)               { s.events <- err }
func (s recordingSink) Missing(err error)              { s.events <- err }

// watchFile runs a file source on path and returns what it reports.
func watchFile(t *testing.T, path string) (*File, chan any) {
	t.Helper()
	return watchFileEvery(t, path, time.Hour)
}

// watchFileEvery is watchFile with the file also read every resync.
func watchFileEvery(t *testing.T, path string, resync time.Duration) (*File, chan any) {
	t.Helper()
	return watchFileTimed(t, path, 10*time.Millisecond, resync)
}

// watchFileTimed is watchFile with the given settle and resync times.
func watchFileTimed(t *testing.T, path string, settle, resync time.Duration) (*File, chan any) {
	t.Helper()
	f, err := NewFile(path, nil, nil)
	require.NoError(t, err)
	f.settle, f.resync = settle, resync
	sink := recordingSink{events: make(chan any, 64)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx, sink) }()
	t.Cleanup(func() {
		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
	})
	return f, sink.events
}

// next waits for the source's report that satisfies want, skipping earlier ones (an
// editor's save may be seen half-written first). The deadline only bounds a broken
// watcher; a healthy one answers within milliseconds.
func next(t *testing.T, events chan any, want func(any) bool) any {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case ev := <-events:
			if want(ev) {
				return ev
			}
		case <-deadline:
			t.Fatal("the file source did not report the change")
		}
	}
}

func workersNamed(names ...string) func(any) bool {
	return func(ev any) bool {
		ws, ok := ev.([]router.Worker)
		if !ok || len(ws) != len(names) {
			return false
		}
		for i, w := range ws {
			if w.Name != names[i] {
				return false
			}
		}
		return true
	}
}

func isError(ev any) bool { _, ok := ev.(error); return ok }

func workersYAML(names ...string) string {
	s := "workers:\n"
	for i, n := range names {
		s += fmt.Sprintf("  - {name: %s, address: '10.0.0.%d:8000'}\n", n, i+1)
	}
	return s
}

func write(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
}

func TestFileSourceFollowsChangesOnDisk(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "workers.yaml")
	write(t, path, workersYAML("a"))
	f, events := watchFile(t, path)
	assert.Equal(t, "a", f.Workers()[0].Name, "read at start")
	next(t, events, workersNamed("a"))

	// Written in place.
	write(t, path, workersYAML("a", "b"))
	next(t, events, workersNamed("a", "b"))

	// An editor's save: a new file renamed over the old one.
	tmp := filepath.Join(dir, ".workers.yaml.swp")
	write(t, tmp, workersYAML("c"))
	require.NoError(t, os.Rename(tmp, path))
	next(t, events, workersNamed("c"))

	// A bad file is rejected, naming the file and the key; a fixed one is read again.
	// Written in place, it may first be read truncated (an empty file is an error too),
	// if the writer stalls past the settle time between the truncate and the write.
	write(t, path, "workers: [{name: x, address: 'not-an-address'}]\n")
	err := next(t, events, func(ev any) bool {
		err, ok := ev.(error)
		return ok && strings.Contains(err.Error(), "workers[0].address")
	}).(error)
	assert.Contains(t, err.Error(), path)
	write(t, path, workersYAML("d"))
	next(t, events, workersNamed("d"))

	// Removed, then back.
	require.NoError(t, os.Remove(path))
	next(t, events, isError)
	write(t, path, workersYAML("e"))
	next(t, events, workersNamed("e"))
}

// A ConfigMap volume: the file is a symlink through `..data`, which the kubelet swaps
// atomically to a new timestamped directory and then deletes the old one.
func TestFileSourceFollowsAConfigMapSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		require.NoError(t, os.Mkdir(filepath.Join(dir, name), 0o755))
		write(t, filepath.Join(dir, name, "workers.yaml"), content)
	}
	version("..2026_12_02_10_00_00.1", workersYAML("a"))
	require.NoError(t, os.Symlink("..2026_12_02_10_00_00.1", filepath.Join(dir, "..data")))
	require.NoError(t, os.Symlink("..data/workers.yaml", filepath.Join(dir, "workers.yaml")))
	_, events := watchFile(t, filepath.Join(dir, "workers.yaml"))
	next(t, events, workersNamed("a"))

	for i, names := range [][]string{{"a", "b"}, {"c"}} {
		old := fmt.Sprintf("..2026_12_02_10_00_00.%d", i+1)
		nu := fmt.Sprintf("..2026_12_02_10_00_00.%d", i+2)
		version(nu, workersYAML(names...))
		require.NoError(t, os.Symlink(nu, filepath.Join(dir, "..data_tmp")))
		require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
		require.NoError(t, os.RemoveAll(filepath.Join(dir, old)))
		next(t, events, workersNamed(names...))
	}
}

// A symlink to a file in another directory: edits of the target are seen.
func TestFileSourceWatchesASymlinkTargetsDirectory(t *testing.T) {
	link, elsewhere := t.TempDir(), t.TempDir()
	target := filepath.Join(elsewhere, "real.yaml")
	write(t, target, workersYAML("a"))
	require.NoError(t, os.Symlink(target, filepath.Join(link, "workers.yaml")))
	_, events := watchFile(t, filepath.Join(link, "workers.yaml"))
	next(t, events, workersNamed("a"))
	write(t, target, workersYAML("b"))
	next(t, events, workersNamed("b"))
}

// Another file of the directory written without pause (a log, a busy neighbour) sends
// events that never leave the settle time quiet: a change of the workers file is read
// all the same.
func TestFileSourceReadsAChangeWhileTheDirectoryNeverSettles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "workers.yaml")
	write(t, path, workersYAML("a"))
	f, err := NewFile(path, nil, nil)
	require.NoError(t, err)
	f.settle, f.resync = 100*time.Millisecond, time.Hour // the settle bound alone reads it
	sink := recordingSink{events: make(chan any, 64)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- f.Run(ctx, sink) }()
	go func() {
		noise := filepath.Join(dir, "neighbour.log")
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				done <- nil
				return
			case <-tick.C:
				_ = os.WriteFile(noise, []byte(time.Now().String()), 0o600)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				assert.ErrorIs(t, err, context.Canceled)
			}
		}
	})
	next(t, sink.events, workersNamed("a"))
	write(t, path, workersYAML("a", "b"))
	next(t, sink.events, workersNamed("a", "b"))
}

// The file's directory removed, then made again after kvroute has seen it go (a
// deploy tool that replaces the directory): its watch went with it, and the new
// directory's file is read all the same.
func TestFileSourceFollowsADirectoryMadeAgain(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "config")
	require.NoError(t, os.Mkdir(dir, 0o755))
	path := filepath.Join(dir, "workers.yaml")
	write(t, path, workersYAML("a"))
	_, events := watchFileEvery(t, path, 20*time.Millisecond)
	next(t, events, workersNamed("a"))

	require.NoError(t, os.RemoveAll(dir))
	next(t, events, isError)
	require.NoError(t, os.Mkdir(dir, 0o755))
	write(t, path, workersYAML("b"))
	next(t, events, workersNamed("b"))
}

// A resync while a watched change is settling leaves it to the settle read: read at
// once, a file still being written in place (here, its first worker written, the rest
// to come) was applied half-written, taking the other workers out of the fleet until
// the settle read put them back.
func TestFileResyncLeavesASettlingChangeToTheSettleRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "workers.yaml")
	write(t, path, workersYAML("a", "b", "c"))
	_, events := watchFileTimed(t, path, 300*time.Millisecond, 20*time.Millisecond)
	next(t, events, workersNamed("a", "b", "c"))

	write(t, path, workersYAML("a")) // the writer's first part
	time.Sleep(150 * time.Millisecond)
	write(t, path, workersYAML("a", "b", "c", "d"))
	ev := next(t, events, func(any) bool { return true })
	assert.True(t, workersNamed("a", "b", "c", "d")(ev), "reported before the file settled: %v", ev)
}

// A resync that finds the file as it was last read reports nothing: no apply, and no
// rejection counted again for a bad file left in place.
func TestFileResyncReportsOnlyAChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "workers.yaml")
	write(t, path, workersYAML("a"))
	f, err := NewFile(path, nil, nil)
	require.NoError(t, err)
	sink := recordingSink{events: make(chan any, 8)}
	f.reload(sink, true)
	assert.Empty(t, sink.events, "as NewFile read it")
	write(t, path, "workers: [")
	f.reload(sink, true)
	require.Len(t, sink.events, 1)
	assert.True(t, isError(<-sink.events))
	f.reload(sink, true)
	assert.Empty(t, sink.events, "the same bad file")
	f.reload(sink, false)
	assert.Len(t, sink.events, 1, "a watched change is always reported")
}

func TestNewFileRefusesABadFileAtStart(t *testing.T) {
	dir := t.TempDir()
	_, err := NewFile(filepath.Join(dir, "missing.yaml"), nil, nil)
	assert.ErrorContains(t, err, "discovery.file.path")
	big := filepath.Join(dir, "big.yaml")
	write(t, big, "workers: []\n#"+string(make([]byte, MaxFileBytes)))
	_, err = NewFile(big, nil, nil)
	assert.ErrorContains(t, err, "larger than")
}

// panicFleet panics at its first Apply, in the middle of applying a set.
type panicFleet struct {
	fakeFleet
	fired bool
}

func (f *panicFleet) Apply(workers []router.Worker) (fleet.Diff, error) {
	if !f.fired {
		f.fired = true
		panic("injected fault")
	}
	return f.fakeFleet.Apply(workers)
}

// TestAFileReadThatPanicsIsRejected: a panic while a change of the workers file is
// read and applied is recovered and counted, and the change is rejected: the workers
// in force stay, the runner's lock is free, and the next resync reads the file and
// applies it, although it did not change since.
func TestAFileReadThatPanicsIsRejected(t *testing.T) {
	path := filepath.Join(t.TempDir(), "workers.yaml")
	write(t, path, workersYAML("a"))
	f, err := NewFile(path, nil, nil)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	f.CountPanics(background.NewMetrics(reg))
	fl := &panicFleet{fakeFleet: fakeFleet{applied: [][]router.Worker{}}}
	fl.fired = true // the preloaded set goes in
	r, err := NewRunner("file", f, RunnerDeps{Fleet: fl, Metrics: NewMetrics(reg)})
	require.NoError(t, err)
	fl.fired = false

	write(t, path, workersYAML("a", "b"))
	f.reload(r, false)
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopDiscovery))
	assert.Equal(t, 1.0, value(t, reg, "kvroute_discovery_stale", nil), "the change is rejected")
	assert.Equal(t, 1.0, value(t, reg, "kvroute_discovery_updates_total", map[string]string{"result": "rejected"}))
	assert.Equal(t, []string{"a"}, names(r.Workers()), "the workers in force stay")

	f.reload(r, true)
	assert.Equal(t, []string{"a", "b"}, names(r.Workers()), "the next resync applies the file")
	assert.Equal(t, 0.0, value(t, reg, "kvroute_discovery_stale", nil))
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopDiscovery), "one panic, counted once")
}

func names(workers []router.Worker) []string {
	out := make([]string, len(workers))
	for i, w := range workers {
		out[i] = w.Name
	}
	return out
}
