// Command extproc is kvroute's ext_proc server: it routes OpenAI requests for Envoy.
//
//	extproc -config kvroute.yaml [-grpc-address ADDR] [-admin-address ADDR] [-log-level LEVEL]
//	extproc validate -config kvroute.yaml
//	extproc tokenize [-config FILE] [-model NAME] [-tokenizer PATH] [-completions|-responses|-messages] < body.json
//
// SIGHUP (or POST /reload on the admin port) reloads the workers and the policy from the
// file; SIGTERM drains and stops.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/discovery"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "tokenize" {
		os.Exit(runTokenize(context.Background(), os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// usage heads -h's answer: the subcommands, which the flags alone do not show.
const usage = `usage:
  extproc -config kvroute.yaml [flags]     serve (SIGHUP or POST /reload reloads; SIGTERM drains)
  extproc validate -config kvroute.yaml    check a config, its tokenizers and workers, and exit
  extproc tokenize [-config FILE] [-model NAME] [-tokenizer PATH] [-completions|-responses|-messages] < body.json
                                           print the tokens kvroute routes a request body on
flags:
`

// run is main without the process: it returns the exit code. It serves until SIGTERM,
// an interrupt or ctx's end.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	validateOnly := len(args) > 0 && args[0] == "validate"
	if validateOnly {
		args = args[1:]
	}
	fs := flag.NewFlagSet("extproc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	path := fs.String("config", "", "path to the YAML config (required)")
	var flags config.Overrides
	fs.StringVar(&flags.GRPCAddress, "grpc-address", "", "overrides grpc_address")
	fs.StringVar(&flags.AdminAddress, "admin-address", "", "overrides admin_address")
	fs.StringVar(&flags.LogLevel, "log-level", "", "overrides log_level (debug, info, warn, error)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		// Flags end at the first argument that is not one: "extproc -config F validate"
		// would otherwise serve, and "extproc valdate -config F" ask for -config.
		fmt.Fprintf(stderr, "extproc: unexpected arguments %q (a subcommand comes first: extproc validate -config FILE)\n", fs.Args())
		return 2
	}
	if *path == "" {
		fmt.Fprintln(stderr, "extproc: -config is required")
		return 2
	}
	var hup chan os.Signal
	if !validateOnly {
		// SIGHUP is a reload from the moment the server starts, not once it serves: a
		// config reloader (a sidecar watching the ConfigMap) signals at every change of
		// the file, a pod starting included, and Go's default for SIGHUP ends the
		// process. One received while starting is applied once the server serves.
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	// load reads the file and applies the flags, at start and at each reload.
	load := func() (config.Config, error) { return config.LoadWith(*path, flags) }
	cfg, err := load()
	if err != nil {
		fmt.Fprintf(stderr, "extproc: config %s: %v\n", *path, err)
		return 1
	}
	if validateOnly {
		// The tokenizers are loaded as at start: a missing file or an unsupported
		// component fails here, naming the model and key.
		if _, err := loadTokenizers(cfg, slog.New(slog.DiscardHandler), nil, false); err != nil {
			fmt.Fprintf(stderr, "extproc: config %s: %v\n", *path, err)
			return 1
		}
		// The peers' secret is read as at start: a missing or short file fails here.
		if _, err := cfg.Peers.Token(); err != nil {
			fmt.Fprintf(stderr, "extproc: config %s: %v\n", *path, err)
			return 1
		}
		workers, err := describeWorkers(cfg)
		if err != nil {
			fmt.Fprintf(stderr, "extproc: config %s: %v\n", *path, err)
			return 1
		}
		fmt.Fprintf(stdout, "%s: ok (%s, picker %s, %s)\n", *path, workers, cfg.Policy.Picker, cfg.Peers)
		return 0
	}

	lvl, _ := config.ParseLevel(cfg.LogLevel)
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	if cfg.Discovery.Source == discovery.SourceKubernetes {
		klog.SetSlogLogger(log) // client-go's own logs (retries, throttling) as kvroute's JSON
	}
	a, err := build(cfg, load, log)
	if err != nil {
		fmt.Fprintf(stderr, "extproc: %v\n", err)
		return 1
	}
	grpcLn, err := net.Listen("tcp", cfg.GRPCAddress)
	if err != nil {
		fmt.Fprintf(stderr, "extproc: grpc_address: %v\n", err)
		return 1
	}
	adminLn, err := net.Listen("tcp", cfg.AdminAddress)
	if err != nil {
		fmt.Fprintf(stderr, "extproc: admin_address: %v\n", err)
		return 1
	}
	if a.process.PlainHealth != nil {
		if a.process.PlainHealthListener, err = net.Listen("tcp", cfg.HealthAddress); err != nil {
			fmt.Fprintf(stderr, "extproc: health_address: %v\n", err)
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	go a.reloader.ReloadOn(ctx, hup)
	if err := a.process.Serve(ctx, grpcLn, adminLn); err != nil {
		log.Error("serve", "error", err)
		return 1
	}
	return 0
}
