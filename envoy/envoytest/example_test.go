package envoytest_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/kvroute/kvroute/envoy/envoytest"
)

// pinner is a tiny ext_proc server that sends every request to one upstream.
type pinner struct {
	extprocv3.UnimplementedExternalProcessorServer
	upstream string
}

func (p pinner) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		reply := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		if req.GetRequestHeaders() != nil {
			reply = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{
					SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte(p.upstream)}}},
				}},
			}}}
		}
		if err := stream.Send(reply); err != nil {
			return err
		}
	}
}

func ExampleServer() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello from the chosen worker")
	}))
	defer upstream.Close()

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	processor := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(processor, pinner{upstream: strings.TrimPrefix(upstream.URL, "http://")})
	go func() { _ = processor.Serve(ln) }()
	defer processor.Stop()

	envoy := envoytest.NewServer(envoytest.Config{ProcessorAddress: ln.Addr().String()})
	defer envoy.Close()

	resp, _ := envoy.Client().Get(envoy.URL + "/v1/models")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	ex := envoy.Exchanges()[0]
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("messages sent:", len(ex.Sent), "route cache cleared:", ex.RouteCacheCleared)
	// Output:
	// 200 hello from the chosen worker
	// messages sent: 2 route cache cleared: true
}
