package envoy

import (
	"os"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/scoring"
)

// envoyDefaultBufferLimit is per_connection_buffer_limit_bytes when unset (1 MiB).
const envoyDefaultBufferLimit = 1 << 20

// kvrouteExample is the part of examples/kvroute.yaml the Envoy configs must agree with.
type kvrouteExample struct {
	DestinationHeader string `yaml:"destination_header"`
	MaxBodyBytes      int    `yaml:"max_body_bytes"`
	RequestBodyMode   string `yaml:"request_body_mode"`
	ResponseBodyMode  string `yaml:"response_body_mode"`
}

func readExample(t *testing.T, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile("../examples/" + name)
	require.NoError(t, err)
	return raw
}

func kvrouteConfig(t *testing.T) kvrouteExample {
	t.Helper()
	var k kvrouteExample
	require.NoError(t, yaml.Unmarshal(readExample(t, "kvroute.yaml"), &k))
	return k
}

func TestShippedEnvoyConfigsValidate(t *testing.T) {
	k := kvrouteConfig(t)
	tests := []struct {
		file           string
		reqMode        extprocv3.ProcessingMode_BodySendMode
		respMode       extprocv3.ProcessingMode_BodySendMode
		matchesKvroute bool // kvroute.yaml names the same body modes
	}{
		{"envoy.yaml", extprocv3.ProcessingMode_BUFFERED, extprocv3.ProcessingMode_STREAMED, true},
		{"envoy-gie.yaml", extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED, false},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			b, err := ValidateBootstrap(readExample(t, tt.file))
			require.NoError(t, err)
			require.Len(t, b.ExtProc, 1)
			ep := b.ExtProc[0]
			assert.False(t, ep.GetFailureModeAllow(), "fails closed")
			assert.GreaterOrEqual(t, ep.GetMessageTimeout().AsDuration().Seconds(), 1.0, "message_timeout ≥ 1 s")
			assert.Equal(t, tt.reqMode, ep.GetProcessingMode().GetRequestBodyMode())
			assert.Equal(t, tt.respMode, ep.GetProcessingMode().GetResponseBodyMode())
			assert.Contains(t, ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(), "envoy.lb")
			if tt.matchesKvroute {
				assert.Equal(t, k.RequestBodyMode, tt.reqMode.String())
				assert.Equal(t, k.ResponseBodyMode, tt.respMode.String())
			}

			pool := b.Clusters["inference_pool"]
			require.NotNil(t, pool)
			header := pool.GetOriginalDstLbConfig().GetHttpHeaderName()
			assert.True(t, pool.GetOriginalDstLbConfig().GetUseHttpHeader())
			assert.Equal(t, k.DestinationHeader, header, "Envoy reads the header kvroute sets")
			assert.Equal(t, filter.DefaultConfig().DestinationHeader, header)
			assert.False(t, strings.HasPrefix(header, "x-envoy"), "ext_proc may not set x-envoy-* headers")

			if tt.reqMode == extprocv3.ProcessingMode_BUFFERED {
				// A listener without the key buffers Envoy's default, 1 MiB: less than
				// kvroute's default cap, so bodies in between would get Envoy's 413.
				limit := envoyDefaultBufferLimit
				if l := b.Proto.GetStaticResources().GetListeners()[0].GetPerConnectionBufferLimitBytes(); l != nil {
					limit = int(l.GetValue())
				}
				maxBody := k.MaxBodyBytes
				if maxBody == 0 {
					maxBody = filter.DefaultConfig().MaxBodyBytes
				}
				assert.GreaterOrEqual(t, limit, maxBody, "Envoy buffers what kvroute accepts")
			}
		})
	}
}

func TestEnvoyRouteOverrideIsAValidPolicy(t *testing.T) {
	b, err := ValidateBootstrap(readExample(t, "envoy.yaml"))
	require.NoError(t, err)
	require.Len(t, b.PerRoute, 1)
	md := b.PerRoute[0].GetOverrides().GetGrpcInitialMetadata()
	require.Len(t, md, 1)
	assert.Equal(t, filter.PolicyMetadataKey, md[0].GetKey())
	p, err := filter.ParseOverride(scoring.DefaultParams(), []byte(md[0].GetValue()))
	require.NoError(t, err)
	assert.Equal(t, 2.0, p.PrefixAffinityWeight, "the route uses its own prefix_affinity_weight")
}

func TestValidatorCatchesBrokenConfigs(t *testing.T) {
	base := string(readExample(t, "envoy-gie.yaml"))
	tests := []struct {
		name    string
		from    string
		to      string
		wantErr string
	}{
		{"duplicate key", "stat_prefix: openai_gie", "stat_prefix: openai_gie\n          stat_prefix: again", "already set"},
		{"unknown field", "stat_prefix: openai_gie", "stat_prefx: openai_gie", "stat_prefx"},
		{"ORIGINAL_DST without CLUSTER_PROVIDED", "lb_policy: CLUSTER_PROVIDED", "lb_policy: ROUND_ROBIN", "CLUSTER_PROVIDED"},
		{"route to a missing cluster", "route: {cluster: inference_pool, timeout: 0s}", "route: {cluster: nowhere, timeout: 0s}", "unknown cluster"},
		{"full duplex without trailers", "request_trailer_mode: SEND", "request_trailer_mode: SKIP", "trailer mode SEND"},
		{"full duplex failing open", "failure_mode_allow: false", "failure_mode_allow: true", "failure_mode_allow false"},
		{"ext_proc cluster without HTTP/2", "http2_protocol_options:\n            connection_keepalive: {interval: 30s, timeout: 5s}", "http_protocol_options: {}", "HTTP/2"},
		{"nested typed config fails PGV", "message_timeout: 1000s", "message_timeout: -1s", "MessageTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			broken := strings.Replace(base, tt.from, tt.to, 1)
			require.NotEqual(t, base, broken, "the edit applies")
			_, err := ValidateBootstrap([]byte(broken))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}
