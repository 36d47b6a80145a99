// Package workercmd is the worker command: its command tree (command.go) and flags (flags.go),
// config file, environment and wiring of the parts into a running worker. cmd/worker adds only
// signal handling and the exit code.
package workercmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// run is the worker itself, with its flags parsed.
func run(ctx context.Context, o options, getenv func(string) string, stdout, stderr io.Writer) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

	cfg, src, err := loadConfig(o, getenv)
	if err != nil {
		return err
	}
	if o.embedded {
		if err := os.MkdirAll(o.dataDir, 0o700); err != nil {
			return fmt.Errorf("create data dir: %w", err)
		}
		host, port, err := splitListen(o.natsListen)
		if err != nil {
			return err
		}
		ns, err := queue.StartEmbedded(queue.EmbeddedOptions{Host: host, Port: port, StoreDir: filepath.Join(o.dataDir, "nats")})
		if err != nil {
			return err
		}
		defer ns.Shutdown()
		cfg.NATS.URL = ns.ClientURL()
		// The sandbox stays the config's (bubblewrap by default): one machine can still run
		// its jobs in pods of a cluster it reaches.
		cfg.Store = config.Store{URL: "file://" + filepath.Join(o.dataDir, "store")}
		log.Info("embedded NATS listening", "url", cfg.NATS.URL, "data_dir", o.dataDir)
	}
	if o.metricsAddr != "" {
		cfg.MetricsAddr = o.metricsAddr
	}

	// What can be checked without NATS or the store comes first: a bad setting stops the
	// worker at once, not after a wait.
	sandboxes, err := newProvider(cfg, log)
	if err != nil {
		return err
	}
	m := metrics.New()
	modelURL := modelBaseURL(cfg, getenv)
	gate, err := newModelGate(modelURL, getenv("OPENAI_API_KEY"), m, log)
	if err != nil {
		return err
	}
	ag, err := agent.New(agent.Config{
		BaseURL:        modelURL,
		APIKey:         getenv("OPENAI_API_KEY"),
		HTTPClient:     &http.Client{Transport: m.ModelTransport(http.DefaultTransport.(*http.Transport).Clone())},
		RequestTimeout: cfg.Model.RequestTimeout.Std(),
		MaxRetries:     cfg.Model.MaxRetries,
		Gate:           gate,
		Logger:         log,
		Profiles:       cfg.Profiles, // compiled now: a bad profile stops the worker here
	})
	if err != nil {
		return src.Place(err)
	}
	signer, err := signingKey(o, cfg, log)
	if err != nil {
		return err
	}
	st, err := store.Open(ctx, cfg.Store.URL, store.Options{Endpoint: cfg.Store.Endpoint, Region: cfg.Store.Region,
		PathStyle: cfg.Store.PathStyle, AllowUnsafeOverwrite: cfg.Store.AllowUnsafeOverwrite,
		ProbeInterval: time.Duration(cfg.Store.ProbeInterval), Logger: log})
	if err != nil {
		return err
	}
	defer st.Close()
	link, err := queue.Dial(cfg.NATS.URL, "boxcar-worker "+cfg.WorkerID, log)
	if err != nil {
		return err
	}
	defer link.Close()

	g, gctx := errgroup.WithContext(ctx)
	// The endpoints come up before the worker waits for anything, so /readyz says what it
	// waits for. They outlive the drain: /healthz keeps the kubelet from killing a draining
	// worker, /readyz says it is draining, and /metrics shows the last jobs finish.
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(gctx))
	defer stopServing()
	boot := &starting{link: link}
	if cfg.MetricsAddr != "off" {
		g.Go(func() error {
			return m.Serve(serveCtx, cfg.MetricsAddr, boot.ready, log, func(a net.Addr) {
				log.Info("metrics listening", "addr", a.String())
			})
		})
	}
	// A NATS or store that does not answer yet is waited for, not a reason to exit: a
	// rollout that restarts NATS must not turn into crash loops.
	q, err := awaitQueue(gctx, log, boot, cfg.NATS)
	if err == nil {
		err = awaitStore(gctx, log, boot, st)
	}
	if err != nil {
		stopServing()
		if serr := g.Wait(); serr != nil {
			return serr
		}
		if ctx.Err() != nil {
			log.Info("worker stopped before it was ready")
			return nil
		}
		return err
	}
	r, err := runner.New(runner.Config{
		Worker:        cfg,
		Queue:         q,
		Approvals:     q,
		Sandboxes:     sandboxes,
		Store:         st,
		Agent:         ag,
		Metrics:       m,
		ModelEndpoint: modelURL,
		ModelGate:     gate,
		SigningKey:    signer,
		Logger:        log,
	})
	if err != nil {
		stopServing()
		_ = g.Wait()
		return err
	}
	m.WatchQueue(serveCtx, q.ConsumerLag)
	g.Go(func() error { return q.AdvertiseProfiles(gctx, cfg.WorkerID, cfg.Profiles) }) // for `submit profiles` and run's check
	boot.set(nil, readiness(r, link, st, sandboxes, gate))
	g.Go(func() error {
		defer stopServing()
		return r.Run(gctx)
	})
	if kp, ok := sandboxes.(*sandbox.KubernetesProvider); ok {
		// Sandbox pods whose job no live worker holds (their worker crashed or was replaced,
		// the job ended or moved on) are removed at start and then every minute.
		held := func(jobID, worker string) bool {
			if worker == cfg.WorkerID {
				return r.Holds(jobID)
			}
			st, err := q.Status(gctx, jobID)
			if err != nil {
				return !errors.Is(err, queue.ErrUnknownJob) // when in doubt, spare it
			}
			return !st.State.Terminal() && st.Worker == worker
		}
		g.Go(func() error { return kp.RunReaper(gctx, time.Minute, held) })
	}
	log.Info("worker ready", "worker_id", cfg.WorkerID, "concurrency", cfg.Concurrency, "sandbox", sandboxes.Backend(),
		"store", st.URL(""), "nats", cfg.NATS.URL, "model", modelURL, "profiles", len(cfg.Profiles))
	fmt.Fprintf(stdout, "worker ready: nats %s, store %s\n", cfg.NATS.URL, st.URL(""))
	err = g.Wait()
	log.Info("worker stopped")
	return err
}

// loadConfig reads the config the flags name (the example profiles with --embedded and no
// --config) and applies the environment; the Source places later errors in the file.
func loadConfig(o options, getenv func(string) string) (config.Config, *config.Source, error) {
	var (
		cfg config.Config
		src *config.Source
		err error
	)
	switch {
	case o.configPath != "":
		cfg, src, err = config.LoadSource(o.configPath)
	case o.embedded:
		cfg, src, err = config.ParseSource("examples/boxcar.yaml (built in)", examples.Config)
	default:
		return cfg, nil, errors.New("no --config: give a config file, or run `worker --embedded` to use the example profiles")
	}
	if err != nil {
		return cfg, src, err
	}
	if !o.embedded {
		if v := getenv("NATS_URL"); v != "" {
			cfg.NATS.URL = v
		}
		if v := getenv("BOXCAR_STORE"); v != "" {
			cfg.Store.URL = v
		}
		if cfg.Store.URL == "" {
			return cfg, src, errors.New("no store: set store.url in the config (s3://bucket or file:///path) or BOXCAR_STORE")
		}
	}
	return cfg, src, nil
}

func newProvider(cfg config.Config, log *slog.Logger) (sandbox.Provider, error) {
	switch cfg.Sandbox.Backend {
	case "bubblewrap":
		return sandbox.NewBubblewrap(sandbox.BubblewrapConfig{
			BwrapPath:      cfg.Sandbox.Bubblewrap.Path,
			Root:           cfg.Sandbox.Bubblewrap.Root,
			DiskBestEffort: cfg.Sandbox.Bubblewrap.DiskBestEffort,
			Logger:         log,
		})
	case "kubernetes":
		// client-go logs through klog; keep its lines in the worker's JSON log.
		klog.SetSlogLogger(log)
		restCfg, err := kubeConfig(cfg.Sandbox.Kubernetes.Kubeconfig)
		if err != nil {
			return nil, err
		}
		client, err := kubernetes.NewForConfig(restCfg)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
		return sandbox.NewKubernetes(sandbox.KubernetesConfig{
			Client:          client,
			RESTConfig:      restCfg,
			Namespace:       cfg.Sandbox.Kubernetes.Namespace,
			ImagePullPolicy: corev1.PullPolicy(cfg.Sandbox.Kubernetes.ImagePullPolicy),
			WorkerID:        cfg.WorkerID,
			Instance:        cfg.Sandbox.Kubernetes.Instance,
			Logger:          log,
		})
	default:
		return nil, fmt.Errorf("sandbox backend %q is not available in this build", cfg.Sandbox.Backend)
	}
}

// kubeConfig is the in-cluster config, or the kubeconfig file the config names.
func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: not in a cluster (%w); set sandbox.kubernetes.kubeconfig", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: kubeconfig %s: %w", path, err)
	}
	return c, nil
}

func modelBaseURL(cfg config.Config, getenv func(string) string) string {
	if cfg.Model.BaseURL != "" {
		return cfg.Model.BaseURL
	}
	if v := getenv("OPENAI_BASE_URL"); v != "" {
		return v
	}
	return "https://api.openai.com/v1"
}

func splitListen(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("--nats-listen %q: %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("--nats-listen %q: bad port", addr)
	}
	if port == 0 {
		port = -1 // nats-server's "any free port"
	}
	return host, port, nil
}
