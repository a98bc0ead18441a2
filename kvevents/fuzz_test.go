package kvevents

import (
	"bytes"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/index"
)

// FuzzDecode feeds the decoder arbitrary payloads: it must return a batch or an error,
// never panic, and never hand back a slice longer than the payload could hold.
func FuzzDecode(f *testing.F) {
	for _, seed := range [][]byte{goldenArrayBatch, goldenMapBatch, goldenMixedBatch, {0x90}, {0x92, 0x00, 0x90}} {
		f.Add(seed)
	}
	batch := &Batch{TS: 1, Events: []Event{
		{Type: TypeBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, LoRAName: "l",
			ExtraKeys: []ExtraKeys{{Strings: []string{"l", "s"}}, {Strings: []string{"l"}}}},
		{Type: TypeBlockRemoved, BlockHashes: []uint64{2}},
		{Type: TypeAllBlocksCleared},
	}}
	for _, form := range []Form{FormMap, FormArray} {
		payload, err := Encode(batch, form)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(payload)
	}
	d := NewDecoder()
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := d.Decode(payload)
		if err != nil {
			return
		}
		for _, ev := range b.Events {
			if len(ev.BlockHashes)+len(ev.TokenIDs) > len(payload) {
				t.Fatalf("decoded %d hashes and %d tokens from %d bytes", len(ev.BlockHashes), len(ev.TokenIDs), len(payload))
			}
		}
		// Whatever decoded must encode again (known types) or be refused cleanly.
		_, _ = Encode(b, FormMap)
	})
}

// FuzzFrames feeds the frame parsers arbitrary frames.
func FuzzFrames(f *testing.F) {
	f.Add([]byte("kv"), []byte{0, 0, 0, 0, 0, 0, 0, 1}, []byte{0x90}, true)
	f.Add([]byte{}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte{}, false)
	f.Fuzz(func(t *testing.T, a, b, c []byte, four bool) {
		frames := [][]byte{a, b, c}
		if four {
			frames = append(frames, c)
		}
		_, _ = ParseMessage(frames)
		_, _, _ = ParseReplay(frames)
		_, _, _ = ParseReplayRequest(frames)
	})
}

// FuzzApply applies arbitrary payloads (the input split at 0xC1, a byte msgpack never
// uses) to one worker's applier over a real event index with small bounds, on two
// ranks, so that chunks, hash-only host stores, removals, clears, prunes and overflows
// mix. Nothing may panic, and after every payload the engine-hash maps must account
// for exactly the blocks they map.
func FuzzApply(f *testing.F) {
	chunkTokens := make([]uint32, 8)
	for i := range chunkTokens {
		chunkTokens[i] = uint32(i)
	}
	seeds := []*Batch{
		{Events: []Event{{Type: TypeBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: chunkTokens, BlockSize: 4}}},
		{Events: []Event{{Type: TypeBlockStored, BlockHashes: []uint64{7}, TokenIDs: chunkTokens, BlockSize: 8, Medium: "cpu"},
			{Type: TypeBlockStored, BlockHashes: []uint64{8}, Parent: 7, HasParent: true, TokenIDs: append(chunkTokens, 9), BlockSize: 8, Medium: "cpu"},
			{Type: TypeBlockStored, BlockHashes: []uint64{9}, ZeroParent: true, TokenIDs: chunkTokens, BlockSize: 8, Medium: "CPU"}}},
		{Events: []Event{{Type: TypeBlockStored, BlockHashes: []uint64{1, 2}, Medium: "CPU"}, {Type: TypeBlockRemoved, BlockHashes: []uint64{7, 1}, Medium: "cpu"}}},
		{Events: []Event{{Type: TypeAllBlocksCleared}}, Rank: 1, HasRank: true},
		{Events: []Event{{Type: TypeBlockStored, BlockHashes: []uint64{9}, BlockSize: 8, Medium: "CPU"},
			{Type: TypeBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: chunkTokens, BlockSize: 4},
			{Type: TypeBlockStored, BlockHashes: []uint64{2}, BlockSize: 8, Medium: "CPU"},
			{Type: TypeBlockRemoved, BlockHashes: []uint64{1, 2}}}},
	}
	var corpus []byte
	for i, b := range seeds {
		payload, err := Encode(b, Form(i%2))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(payload)
		corpus = append(append(corpus, payload...), 0xc1)
	}
	f.Add(corpus)
	f.Fuzz(func(t *testing.T, input []byte) {
		idx, err := index.NewEventIndex(index.Config{CapacityBlocks: 6, PendingTTL: time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := idx.SetWorker("w", 0); err != nil {
			t.Fatal(err)
		}
		a := NewApplier(WorkerSpec{Name: "w", Model: "m", BlockSize: 4, Ranks: 2, MaxEntries: 12, MaxOffloaded: 16}, DefaultConfig(), idx, nil, nil)
		for i, payload := range bytes.Split(input, []byte{0xc1}) {
			_ = a.Apply(i%2, payload)
			a.mu.Lock()
			var mapped [tierOffloaded + 1]int
			for _, s := range a.sources {
				for e := range s.own {
					mapped[s.use] += 1 + len(s.spans[e])
				}
				for e := range s.spans {
					if _, ok := s.own[e]; !ok {
						t.Fatalf("payload %d: a span without its mapping", i)
					}
				}
				for e := range s.parents {
					if _, ok := s.own[e]; !ok {
						t.Fatalf("payload %d: a parent kept for a block no longer mapped", i)
					}
				}
			}
			if mapped != a.entries {
				t.Fatalf("payload %d: the maps hold %v blocks, the counts say %v", i, mapped, a.entries)
			}
			a.mu.Unlock()
		}
	})
}

// FuzzCheckReady: a READY that checkReady lets through never makes zmq4 panic when it
// reads the properties and compares the peer's socket type with its own.
func FuzzCheckReady(f *testing.F) {
	for _, seed := range [][]byte{
		zmtpCommand("READY", zmtpProperty("Socket-Type", "PUB")),
		zmtpCommand("READY", append(zmtpProperty("Identity", "x"), zmtpProperty("socket-type", "ROUTER")...)),
		zmtpCommand("READY", nil),
		zmtpCommand("READY", []byte{3, 'a', 'b'}),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, cmd []byte) {
		if checkReady(cmd) != nil {
			return
		}
		md := zmq4.Metadata{}
		if err := md.UnmarshalZMTP(cmd[1+int(cmd[0]):]); err != nil {
			t.Fatalf("checkReady passed a READY zmq4 cannot read: %v", err)
		}
		for _, ours := range []zmq4.SocketType{zmq4.Sub, zmq4.Dealer} {
			zmq4.SocketType(md["Socket-Type"]).IsCompatible(ours)
		}
	})
}
