// Command vllmsim serves a simulated vLLM replica (package
// rolter.dev/tests/vllmsim): vLLM's OpenAI-compatible API and the Anthropic
// Messages API with a simulated prefix cache, latency and failures.
//
// Usage:
//
//	vllmsim --listen 127.0.0.1:8000 --model llama-3.1-8b --ttft 50ms --itl 10ms
//
// With --kv-events it also publishes its prefix cache's KV events as vLLM
// does (ZMQ PUB, msgpack KVEventBatch, optional replay ROUTER):
//
//	vllmsim --kv-events 'tcp://*:5557' --kv-topic kv@pod-a@llama --kv-replay 'tcp://*:5558' --kv-format map
//
// Run vllmsim --help for every flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"rolter.dev/tests/vllmsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "vllmsim:", err)
		os.Exit(1)
	}
}

// config is what the flags configure.
type config struct {
	listen   string
	logLevel slog.Level
	opts     vllmsim.Options
	// kv configures the KV event publisher; kv.Endpoint is empty when
	// --kv-events is not given.
	kv vllmsim.KVPublisherOptions
}

// modelList is a flag.Value collecting --model, which may be repeated and
// may hold comma-separated names.
type modelList []string

func (m *modelList) String() string { return strings.Join(*m, ",") }

func (m *modelList) Set(v string) error {
	for n := range strings.SplitSeq(v, ",") {
		if n = strings.TrimSpace(n); n != "" {
			*m = append(*m, n)
		}
	}
	return nil
}

// parseFlags parses the command line into a config, with usage and errors
// written to output.
func parseFlags(args []string, output io.Writer) (config, error) {
	fs := flag.NewFlagSet("vllmsim", flag.ContinueOnError)
	fs.SetOutput(output)
	var c config
	var models modelList
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8000", "address to listen on")
	fs.Var(&models, "model", `served model name; repeat or separate with commas for several (default "`+vllmsim.DefaultModel+`")`)
	fs.DurationVar(&c.opts.TTFT, "ttft", 0, "base time to first token")
	fs.DurationVar(&c.opts.ITL, "itl", 0, "time per output token after the first")
	fs.DurationVar(&c.opts.StepGrowth, "step-growth", 0, "added to the time to first token and to each token's ITL for every other request running (steps that slow with the batch)")
	fs.Float64Var(&c.opts.PrefillTokensPerSecond, "prefill-tps", 0, "uncached prompt tokens prefilled per second, added to the time to first token (0 = free)")
	fs.Float64Var(&c.opts.FailRate, "fail-rate", 0, "share of inference requests answered 503, in [0,1]")
	fs.IntVar(&c.opts.BlockSize, "block-size", vllmsim.DefaultBlockSize, "prefix cache block size in tokens")
	fs.IntVar(&c.opts.CapacityBlocks, "capacity-blocks", vllmsim.DefaultCapacityBlocks, "prefix cache capacity in blocks")
	fs.IntVar(&c.opts.MaxTokensDefault, "max-tokens-default", vllmsim.DefaultMaxTokens, "output length of a request that sets no max_tokens")
	fs.IntVar(&c.opts.MaxModelLen, "max-model-len", vllmsim.DefaultMaxModelLen, "context window in tokens (prompt plus output)")
	fs.IntVar(&c.opts.MaxNumSeqs, "max-num-seqs", 0, "requests running at once; more wait (0 = no limit)")
	fs.BoolVar(&c.opts.CacheOutput, "cache-output", false, "also cache the full blocks of generated tokens, as vLLM does")
	fs.Uint64Var(&c.opts.Seed, "seed", 0, "seed of the fail-rate draws")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn or error")
	fs.StringVar(&c.kv.Endpoint, "kv-events", "", "publish KV cache events as vLLM does on this ZMQ endpoint, e.g. 'tcp://*:5557' (bound unless --kv-connect); empty = off")
	fs.StringVar(&c.kv.Topic, "kv-topic", "", "topic frame of the KV event messages (vLLM's default is empty)")
	fs.StringVar(&c.kv.ReplayEndpoint, "kv-replay", "", "bind a replay ROUTER socket here, e.g. 'tcp://*:5558'")
	kvFormat := fs.String("kv-format", "array", "KV event encoding: array (vLLM <= 0.23, e.g. 0.22) or map (vLLM >= 0.24)")
	fs.BoolVar(&c.kv.Connect, "kv-connect", false, "connect to the --kv-events endpoint (a watcher bound there) instead of binding it")
	fs.BoolVar(&c.kv.LegacyReplay, "kv-replay-legacy", false, "replay replies without the topic frame, as vLLM <= 0.25")
	fs.IntVar(&c.kv.DataParallelRank, "kv-dp-rank", 0, "data_parallel_rank sent in every KV event batch")
	fs.IntVar(&c.kv.BufferSteps, "kv-buffer-steps", vllmsim.DefaultKVBufferSteps, "KV event batches kept for replay")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	c.opts.Models = models
	layout, err := vllmsim.ParseKVFormat(*kvFormat)
	if err != nil {
		return config{}, err
	}
	c.kv.Layout = layout
	return c, nil
}

// run serves until ctx ends, then shuts down gracefully.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: c.logLevel}))
	c.opts.Logger = logger
	var kv *vllmsim.KVPublisher
	if c.kv.Endpoint != "" {
		c.kv.Logger = logger
		if kv, err = vllmsim.NewKVPublisher(c.kv); err != nil {
			return err
		}
		// Closed after the server: the last requests' events are sent.
		defer kv.Close()
		c.opts.Listener = kv
	}
	sim, err := vllmsim.New(c.opts)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           sim,
		ReadHeaderTimeout: 10 * time.Second,
		// Requests inherit ctx: on a signal, running generations stop at
		// once instead of holding the shutdown for their whole output.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	logger.Info("serving", "addr", ln.Addr().String(), "models", strings.Join(sim.Models(), ","))
	if kv != nil {
		logger.Info("publishing kv events", "endpoint", kv.Endpoint(), "connect", c.kv.Connect, "topic", c.kv.Topic,
			"replay", kv.ReplayEndpoint(), "format", c.kv.Layout.Form.String())
	}
	errc := make(chan error, 1) // buffered: Serve's result is read at most once
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	logger.Info("stopped")
	return nil
}
