package router

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKVEventsResolveFillsTemplatesAndOffsetsRanks(t *testing.T) {
	tests := []struct {
		name    string
		events  KVEvents
		address string
		want    Streams
	}{
		{"template", KVEvents{Endpoint: "tcp://{ip}:5557", ReplayEndpoint: "tcp://{ip}:5558", Topic: "kv@{ip}@qwen"}, "10.0.0.7:8000",
			Streams{Endpoints: []string{"tcp://10.0.0.7:5557"}, Replay: []string{"tcp://10.0.0.7:5558"}, Topic: "kv@10.0.0.7@qwen"}},
		{"ipv6", KVEvents{Endpoint: "tcp://{ip}:5557"}, "[fd00::1]:8000", Streams{Endpoints: []string{"tcp://[fd00::1]:5557"}}},
		{"ranks", KVEvents{Endpoint: "tcp://{ip}:5557", ReplayEndpoint: "tcp://{ip}:6000", DataParallelSize: 3}, "10.0.0.7:8000",
			Streams{Endpoints: []string{"tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558", "tcp://10.0.0.7:5559"},
				Replay: []string{"tcp://10.0.0.7:6000", "tcp://10.0.0.7:6001", "tcp://10.0.0.7:6002"}}},
		{"bind", KVEvents{Endpoint: "tcp://*:7000", Bind: true}, "10.0.0.7:8000", Streams{Endpoints: []string{"tcp://*:7000"}, Bind: true}},
		{"ipc", KVEvents{Endpoint: "ipc:///tmp/kv.sock"}, "10.0.0.7:8000", Streams{Endpoints: []string{"ipc:///tmp/kv.sock"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.events.Resolve(tt.address)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestKVEventsValidation(t *testing.T) {
	tests := []struct {
		name    string
		worker  Worker
		wantErr string
	}{
		{"model from models", Worker{Models: []string{"qwen"}, KVEvents: &KVEvents{Endpoint: "tcp://{ip}:5557"}}, ""},
		{"model from topic", Worker{KVEvents: &KVEvents{Endpoint: "tcp://{ip}:5557", Topic: "kv@{ip}@qwen"}}, ""},
		{"no model", Worker{KVEvents: &KVEvents{Endpoint: "tcp://{ip}:5557"}}, "workers[0].kv_events: an event-mode worker serves exactly one model"},
		{"two models", Worker{Models: []string{"a", "b"}, KVEvents: &KVEvents{Endpoint: "tcp://{ip}:5557"}}, "exactly one model"},
		{"topic disagrees", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "tcp://{ip}:5557", Topic: "kv@1.2.3.4@b"}}, "workers[0].kv_events.topic"},
		{"empty endpoint", Worker{Models: []string{"a"}, KVEvents: &KVEvents{}}, "workers[0].kv_events.endpoint: must not be empty"},
		{"bad scheme", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "udp://{ip}:1"}}, "workers[0].kv_events.endpoint"},
		{"unknown template", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "tcp://{host}:1"}}, "workers[0].kv_events.endpoint"},
		{"connect to star", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "tcp://*:1"}}, "workers[0].kv_events.endpoint"},
		{"port past the last rank", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "tcp://{ip}:65535", DataParallelSize: 2}}, "port must be"},
		{"ipc ranks", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "ipc:///x", DataParallelSize: 2}}, "ipc endpoint serves one rank"},
		{"bad replay", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "tcp://{ip}:1", ReplayEndpoint: "tcp://{ip}"}}, "workers[0].kv_events.replay_endpoint"},
		{"negative ranks", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "tcp://{ip}:1", DataParallelSize: -1}}, "data_parallel_size"},
		{"an offloaded block size of whole blocks", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "tcp://{ip}:1", OffloadBlockSize: 64}}, ""},
		{"an offloaded block size of part blocks", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "tcp://{ip}:1", OffloadBlockSize: 24}},
			"workers[0].kv_events.offload_block_size: must be a multiple of block_size (16), got 24"},
		{"a negative offloaded block size", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "tcp://{ip}:1", OffloadBlockSize: -16}},
			"workers[0].kv_events.offload_block_size: must be from 0"},
		{"an absurd offloaded block size", Worker{Models: []string{"a"}, KVEvents: &KVEvents{Endpoint: "tcp://{ip}:1", OffloadBlockSize: 1 << 30}},
			"workers[0].kv_events.offload_block_size: must be from 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.worker.Name, tt.worker.Address = "w", "10.0.0.1:8000"
			err := Config{BlockSize: 16, Workers: []Worker{tt.worker}}.Validate()
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestAnEventWorkerServesOnlyItsTopicsModel(t *testing.T) {
	w := Worker{KVEvents: &KVEvents{Endpoint: "tcp://{ip}:5557", Topic: "kv@{ip}@qwen"}}
	assert.True(t, w.serves("qwen"))
	assert.False(t, w.serves("llama"))
	assert.Equal(t, "qwen", w.EventModel())
}
