package enginemetrics

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseMaxLoRAs(t *testing.T) {
	tests := []struct {
		name, page string
		want       int
		wantErr    string
	}{
		{"LoRA off: no series", "vllm:num_requests_waiting 0\n", 0, ""},
		{"vLLM's gauge", `# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""} 1.789828498802105e+09
`, 2, ""},
		{"the latest of several series", `vllm:lora_requests_info{max_lora="4",running_lora_adapters="a"} 1.70e+09
vllm:lora_requests_info{max_lora="8",running_lora_adapters="a,b"} 1.80e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters=""} 1.75e+09
`, 8, ""},
		{"a written float", `vllm:lora_requests_info{max_lora="3.0"} 1`, 3, ""},
		{"zero", `vllm:lora_requests_info{max_lora="0"} 1`, 0, "want a whole number in [1, 4096]"},
		{"absurd", `vllm:lora_requests_info{max_lora="1e9"} 1`, 0, "want a whole number in [1, 4096]"},
		{"a fraction", `vllm:lora_requests_info{max_lora="1.5"} 1`, 0, "want a whole number"},
		{"not a number", `vllm:lora_requests_info{max_lora="many"} 1`, 0, "want a whole number"},
		{"no label", `vllm:lora_requests_info{running_lora_adapters="a"} 1`, 0, "no label max_lora"},
		{"a broken line", "vllm:lora_requests_info{max_lora=\"2\" 1\n", 0, "vllm:lora_requests_info"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMaxLoRAs([]byte(tt.page))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				assert.Zero(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func FuzzParseMaxLoRAs(f *testing.F) {
	f.Add("vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql\"} 1.7e+09\n")
	f.Add("vllm:lora_requests_info{max_lora=\"4\"} NaN\nvllm:lora_requests_info{max_lora=\"9999\"} +Inf\n")
	f.Add("# TYPE vllm:lora_requests_info counter\nvllm:lora_requests_info{max_lora=\"-0\"} 1\n")
	f.Fuzz(func(t *testing.T, page string) {
		n, err := ParseMaxLoRAs([]byte(page))
		if err != nil && n != 0 {
			t.Fatalf("error %v with %d", err, n)
		}
		if n < 0 || n > MaxScrapedLoRAs {
			t.Fatalf("max_lora %d outside [0, %d] from %q", n, MaxScrapedLoRAs, page)
		}
	})
}
