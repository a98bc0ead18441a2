package kvevents

import (
	"testing"
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
