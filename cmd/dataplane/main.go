// Command dataplane puts kvroute's test data plane (envoy/envoytest: Envoy's side of
// ext_proc and an ORIGINAL_DST upstream, as examples/envoy.yaml configures Envoy) on a
// fixed port, so that kvroute can be tried with curl or an OpenAI client on a machine
// without Envoy:
//
//	dataplane -processor 127.0.0.1:9002 [-listen 127.0.0.1:8080]
//
// It is for trying and debugging, not for production traffic: Envoy is.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvroute/kvroute/envoy/envoytest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process: it serves until ctx ends and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dataplane", flag.ContinueOnError)
	fs.SetOutput(stderr)
	processor := fs.String("processor", "127.0.0.1:9002", "kvroute's ext_proc address (its grpc_address)")
	listen := fs.String("listen", "127.0.0.1:8080", "where clients send OpenAI requests")
	header := fs.String("destination-header", "x-gateway-destination-endpoint", "the header kvroute names the upstream in (filter.destination_header)")
	timeout := fs.Duration("message-timeout", 2*time.Second, "the ext_proc message timeout (examples/envoy.yaml's)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "dataplane: %v\n", err)
		return 1
	}
	plane := envoytest.NewUnstartedServerOn(ln, envoytest.Config{
		ProcessorAddress: *processor, SendProtocolConfig: true, DiscardExchanges: true,
		// examples/envoy.yaml: BUFFERED requests, STREAMED responses, 4 MiB buffer.
		ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED,
			ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED},
		MessageTimeout: *timeout, BufferLimit: 4 << 20, ReceivingNamespaces: []string{"envoy.lb"},
		DestinationHeader: *header,
	})
	plane.Start()
	defer plane.Close()
	fmt.Fprintf(stdout, "dataplane: OpenAI requests to %s/v1/chat/completions go through kvroute at %s\n", plane.URL, *processor)
	<-ctx.Done()
	return 0
}
