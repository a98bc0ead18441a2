package envoy

import (
	"errors"
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	// Extensions the shipped configs use must be linked so their Any types resolve:
	// go-control-plane has no "all extensions" package.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
)

// Bootstrap is a parsed, validated Envoy bootstrap with the typed configs kvroute
// cares about unpacked.
type Bootstrap struct {
	Proto    *bootstrapv3.Bootstrap
	ExtProc  []*extprocv3.ExternalProcessor
	PerRoute []*extprocv3.ExtProcPerRoute
	Clusters map[string]*clusterv3.Cluster
}

// ValidateBootstrap checks an Envoy bootstrap YAML the way Envoy would at load, without
// Envoy (ENVOY.md §7): strict YAML (duplicate keys are errors), protojson into the
// Bootstrap proto, ValidateAll on it and on every nested Any, then the load-time rules
// the proto validation lacks.
func ValidateBootstrap(raw []byte) (*Bootstrap, error) {
	js, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	b := &Bootstrap{Proto: &bootstrapv3.Bootstrap{}, Clusters: map[string]*clusterv3.Cluster{}}
	if err := protojson.Unmarshal(js, b.Proto); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	if err := b.Proto.ValidateAll(); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	var routes []*routev3.RouteConfiguration
	err = eachAny(b.Proto.ProtoReflect(), func(m proto.Message) error {
		if v, ok := m.(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				return fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err)
			}
		}
		switch c := m.(type) {
		case *extprocv3.ExternalProcessor:
			b.ExtProc = append(b.ExtProc, c)
		case *extprocv3.ExtProcPerRoute:
			b.PerRoute = append(b.PerRoute, c)
		case *hcmv3.HttpConnectionManager:
			if rc := c.GetRouteConfig(); rc != nil {
				routes = append(routes, rc)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, c := range b.Proto.GetStaticResources().GetClusters() {
		b.Clusters[c.GetName()] = c
	}
	return b, b.loadRules(routes)
}

// loadRules are the checks Envoy makes at load that PGV does not express.
func (b *Bootstrap) loadRules(routes []*routev3.RouteConfiguration) error {
	var errs []error
	for _, c := range b.Clusters {
		if c.GetType() == clusterv3.Cluster_ORIGINAL_DST {
			if c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
				errs = append(errs, fmt.Errorf("cluster %s: ORIGINAL_DST needs lb_policy CLUSTER_PROVIDED", c.GetName()))
			}
			if c.GetLoadAssignment() != nil {
				errs = append(errs, fmt.Errorf("cluster %s: ORIGINAL_DST takes no load_assignment", c.GetName()))
			}
		}
	}
	for _, rc := range routes {
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if name := r.GetRoute().GetCluster(); name != "" && b.Clusters[name] == nil {
					errs = append(errs, fmt.Errorf("route %q: unknown cluster %q", r.GetMatch().GetPrefix(), name))
				}
			}
		}
	}
	for i, ep := range b.ExtProc {
		if (ep.GetGrpcService() == nil) == (ep.GetHttpService() == nil) {
			errs = append(errs, fmt.Errorf("ext_proc[%d]: exactly one of grpc_service and http_service", i))
		}
		if name := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName(); name != "" {
			if c := b.Clusters[name]; c == nil {
				errs = append(errs, fmt.Errorf("ext_proc[%d]: unknown cluster %q", i, name))
			} else if !http2(c) {
				errs = append(errs, fmt.Errorf("ext_proc[%d]: cluster %q must speak HTTP/2 for gRPC", i, name))
			}
		}
		pm := ep.GetProcessingMode()
		full := extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED
		if pm.GetRequestBodyMode() == full && pm.GetRequestTrailerMode() != extprocv3.ProcessingMode_SEND ||
			pm.GetResponseBodyMode() == full && pm.GetResponseTrailerMode() != extprocv3.ProcessingMode_SEND {
			errs = append(errs, fmt.Errorf("ext_proc[%d]: FULL_DUPLEX_STREAMED needs the matching trailer mode SEND", i))
		}
		if (pm.GetRequestBodyMode() == full || pm.GetResponseBodyMode() == full) && ep.GetFailureModeAllow() {
			errs = append(errs, fmt.Errorf("ext_proc[%d]: FULL_DUPLEX_STREAMED needs failure_mode_allow false", i))
		}
	}
	return errors.Join(errs...)
}

func http2(c *clusterv3.Cluster) bool {
	opts, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok {
		return false
	}
	var p upstreamhttpv3.HttpProtocolOptions
	if err := opts.UnmarshalTo(&p); err != nil {
		return false
	}
	return p.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
}

// eachAny calls fn for every message packed in an Any anywhere under m (unpacking
// nested ones too). An Any whose type is not linked in is an error.
func eachAny(m protoreflect.Message, fn func(proto.Message) error) error {
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("typed_config %s: %w", a.GetTypeUrl(), err)
		}
		if err := fn(inner); err != nil {
			return err
		}
		return eachAny(inner.ProtoReflect(), fn)
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len() && err == nil; i++ {
				err = eachAny(v.List().Get(i).Message(), fn)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				err = eachAny(mv.Message(), fn)
				return err == nil
			})
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			err = eachAny(v.Message(), fn)
		}
		return err == nil
	})
	return err
}
