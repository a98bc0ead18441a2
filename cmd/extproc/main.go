// Command extproc is kvroute's ext_proc server: it routes OpenAI requests for Envoy.
//
//	extproc -config kvroute.yaml [-grpc-address ADDR] [-admin-address ADDR] [-log-level LEVEL]
//	extproc validate -config kvroute.yaml
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
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit code. It serves until SIGTERM,
// an interrupt or ctx's end.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	validateOnly := len(args) > 0 && args[0] == "validate"
	if validateOnly {
		args = args[1:]
	}
	fs := flag.NewFlagSet("extproc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "path to the YAML config (required)")
	grpcAddr := fs.String("grpc-address", "", "overrides grpc_address")
	adminAddr := fs.String("admin-address", "", "overrides admin_address")
	level := fs.String("log-level", "", "overrides log_level (debug, info, warn, error)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *path == "" {
		fmt.Fprintln(stderr, "extproc: -config is required")
		return 2
	}
	// load reads the file and applies the flags, at start and at each reload.
	load := func() (config.Config, error) {
		cfg, err := config.Load(*path)
		if err != nil {
			return config.Config{}, err
		}
		for flagValue, key := range map[*string]*string{grpcAddr: &cfg.GRPCAddress, adminAddr: &cfg.AdminAddress, level: &cfg.LogLevel} {
			if *flagValue != "" {
				*key = *flagValue
			}
		}
		return cfg, cfg.Validate()
	}
	cfg, err := load()
	if err != nil {
		fmt.Fprintf(stderr, "extproc: config %s: %v\n", *path, err)
		return 1
	}
	if validateOnly {
		workers, err := describeWorkers(cfg)
		if err != nil {
			fmt.Fprintf(stderr, "extproc: config %s: %v\n", *path, err)
			return 1
		}
		fmt.Fprintf(stdout, "%s: ok (%s, picker %s)\n", *path, workers, cfg.Policy.Picker)
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
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	// SIGHUP reloads the workers and the policy (the outcome is logged).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-hup:
				_, _ = a.reloader.Reload()
			case <-ctx.Done():
				return
			}
		}
	}()
	if err := a.process.Serve(ctx, grpcLn, adminLn); err != nil {
		log.Error("serve", "error", err)
		return 1
	}
	return 0
}
