package workercmd

import (
	"errors"
	"maps"
	"net/http"
	"slices"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// startEnv is what a worker takes at start from its flags and the environment rather than its
// config file: the NATS connection, the model's URL and the transports of the model and the
// store (nil: the default).
type startEnv struct {
	nats           queue.ConnOptions
	modelURL       string
	modelTransport *http.Transport
	s3Transport    *http.Transport
}

// readStartEnv applies the environment and the connection flags to cfg and checks them as a
// starting worker needs them: NATS_URL and BOXCAR_STORE over the config's URLs (not with
// --embedded, which runs its own), the NATS login and TLS files (--nats-*, else NATS_*), the
// model's URL (OPENAI_BASE_URL), the CA files of the store and the model (--s3-ca,
// BOXCAR_S3_CA, --model-ca, BOXCAR_MODEL_CA) and each profile's secrets. Each problem is one
// error of the joined result and names the flag or variable, never a value. The worker's start
// (open) and `worker check-config` both call it: check-config says what a start would.
func readStartEnv(cfg *config.Config, conn connFlags, embedded bool, getenv func(string) string) (startEnv, error) {
	var env startEnv
	errs := []error{checkProfileEgress(*cfg, getenv)}
	if !embedded {
		errs = append(errs, applyEnvURLs(cfg, getenv))
		if cfg.Store.URL == "" {
			errs = append(errs, errors.New("no store: set store.url in the config (s3://bucket or file:///path) or BOXCAR_STORE"))
		}
	}
	var err error
	if env.nats, err = conn.nats.Options(cfg.NATS.URL, "boxcar-worker "+cfg.WorkerID, getenv); err != nil {
		errs = append(errs, err)
	} else if !embedded {
		errs = append(errs, env.nats.Check())
	}
	if env.modelURL, err = modelBaseURL(*cfg, getenv); err != nil {
		errs = append(errs, err)
	}
	if env.modelTransport, err = httpClient(conn.modelCA, "model-ca", "BOXCAR_MODEL_CA", getenv); err != nil {
		errs = append(errs, err)
	}
	if env.s3Transport, err = httpClient(conn.s3CA, "s3-ca", "BOXCAR_S3_CA", getenv); err != nil {
		errs = append(errs, err)
	}
	return env, errors.Join(errs...)
}

// checkProfileEgress checks each networked profile as its jobs' proxies will (runner.CheckEgress:
// its secrets read, the proxy's own checks with the config's egress section), so that a secret
// that cannot be read or used, or an upstream_ca with no certificate, stops the worker at start
// instead of failing every job of the profile later. The error names the secret's key in the
// config and its variable, never its value.
func checkProfileEgress(cfg config.Config, getenv func(string) string) error {
	ec, err := proxyConfig(cfg)
	if err == nil {
		err = egress.Check(ec, egress.Policy{})
	}
	if err != nil {
		return err // "egress.upstream_ca: ..." or "egress: invalid config: upstream CA: ..."
	}
	lookupEnv := func(k string) (string, bool) { v := getenv(k); return v, v != "" }
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(cfg.Profiles)) {
		if err := runner.CheckEgress(ec, name, cfg.Profiles[name], lookupEnv); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
