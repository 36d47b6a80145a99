// Package workercmd is the worker command: its command tree (command.go) and flags (flags.go),
// config file, environment and wiring of the parts into a running worker (worker.go: Start, and
// the Worker it returns, whose Ready says when it takes jobs). cmd/worker adds only signal
// handling and the exit code.
package workercmd

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// loadConfig reads the config the flags name (the example profiles with --embedded and no
// --config); readStartEnv applies the environment. The Source places later errors in the file.
func loadConfig(o Options) (config.Config, *config.Source, error) {
	var (
		cfg config.Config
		src *config.Source
		err error
	)
	switch {
	case o.ConfigPath != "":
		cfg, src, err = config.LoadSource(o.ConfigPath)
	case o.Embedded:
		cfg, src, err = config.ParseSource("examples/boxcar.yaml (built in)", examples.Config)
	default:
		return cfg, nil, errors.New("no --config: give a config file, or run `worker --embedded` to use the example profiles")
	}
	return cfg, src, err
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
		k := sandbox.KubernetesConfigFor(cfg.Sandbox.Kubernetes)
		k.Client, k.RESTConfig, k.WorkerID, k.Logger = client, restCfg, cfg.WorkerID, log
		return sandbox.NewKubernetes(k)
	default:
		return nil, fmt.Errorf("sandbox backend %q is not available in this build", cfg.Sandbox.Backend)
	}
}

// kubeConfig is the worker's rest.Config, from the cluster it runs in or from path. Every
// client made from it refuses the API server's redirects (sandbox.RefuseRedirects): client-go
// puts the cluster's token on the request that follows one, to whatever origin it names.
func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: not in a cluster (%w); set sandbox.kubernetes.kubeconfig", err)
		}
		return sandbox.RefuseRedirects(c), nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: kubeconfig %s: %w", path, err)
	}
	return sandbox.RefuseRedirects(c), nil
}

// applyEnvURLs sets the URLs the environment gives over the config's, each checked by the
// rule of the config key it stands for as the environment gives it (config.CheckURL,
// config.Validate ran before), the variable named and never its value; every problem is one
// error of the joined result.
func applyEnvURLs(cfg *config.Config, getenv func(string) string) error {
	var errs []error
	for _, e := range []struct {
		env, key string
		field    *string
	}{
		{"NATS_URL", "nats.url", &cfg.NATS.URL},
		{"BOXCAR_STORE", "store.url", &cfg.Store.URL},
	} {
		v := getenv(e.env)
		if v == "" {
			continue
		}
		if err := config.CheckURL(e.key, config.FromEnv, v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.env, err))
			continue
		}
		*e.field = v
	}
	return errors.Join(errs...)
}

// modelBaseURL is model.base_url (checked with the config), else OPENAI_BASE_URL, checked here
// by model.base_url's rule.
func modelBaseURL(cfg config.Config, getenv func(string) string) (string, error) {
	if cfg.Model.BaseURL != "" {
		return cfg.Model.BaseURL, nil
	}
	if v := getenv("OPENAI_BASE_URL"); v != "" {
		if err := config.CheckURL("model.base_url", config.FromEnv, v); err != nil {
			return "", fmt.Errorf("OPENAI_BASE_URL: %w", err)
		}
		return v, nil
	}
	return "https://api.openai.com/v1", nil
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
