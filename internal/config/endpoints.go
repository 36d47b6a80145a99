package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/boxcar-run/boxcar/internal/redact"
)

// checkNATSURL checks a NATS URL list (nats.url, NATS_URL, submit's --nats) as the NATS client
// will read it. Like every check of a URL here, its error never holds the URL: one that does
// not parse may hold a password the parser cannot read (docs/security.md).
func checkNATSURL(list string) error {
	return redact.CheckURLList(list, "nats")
}

// checkStoreURL checks the form of a store URL (store.url, BOXCAR_STORE): one that parses, with
// no credentials; the store checks the rest when it opens it.
func checkStoreURL(raw string) error {
	u, err := redact.ParseURL(raw)
	if err != nil {
		return err
	}
	if u.User != nil {
		return fmt.Errorf("%s: credentials do not belong in the URL; use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", redact.URL(raw))
	}
	return nil
}

// checkHTTPURL checks an http(s) URL with a host: an S3 endpoint (store.endpoint), a model
// base URL (model.base_url, OPENAI_BASE_URL).
func checkHTTPURL(raw string) error {
	_, err := redact.ParseHTTPURL(raw)
	return err
}

// URLKey is a key of the config that holds a URL, which the config file (shared, committed,
// a ConfigMap) must not carry a secret in. The Helm chart refuses the same in its values
// (boxcar.checkURLSecrets in deploy/helm/boxcar/templates/_helpers.tpl; TestURLKeysMatchTheChart
// holds the two lists equal).
type URLKey struct {
	Key string
	// EnvUser: the variable that stands for the key may carry user information (NATS_URL: the
	// NATS client logs in with it, and Boxcar shows it redacted). Every other client either
	// ignores it (the model client sends OPENAI_API_KEY, the S3 client the AWS_* keys) or
	// quotes the URL in its errors (Go's HTTP client shows a token@ whole), so it is refused.
	EnvUser bool
	// Secrets says where the secret belongs instead.
	Secrets string
	// Alone says what to give instead of a query or fragment, which no key's client reads
	// (the NATS client and the store read none, the model client drops a base URL's, an S3
	// endpoint takes none): one is refused as a likely secret (?api_key=, a signature) from
	// every source, as store.Open refuses it; empty: Secrets says it.
	Alone string
	value func(Config) string
	check func(string) error // the URL's form, once it holds no secret
}

const (
	s3Secrets    = "put the S3 keys in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment (or leave them unset for the machine's or pod's identity)"
	modelSecrets = "put the API key in OPENAI_API_KEY in the worker's environment (the worker sends it as a bearer token) and give the URL as scheme://host/path alone"
	natsAlone    = "the NATS client reads none: give the servers as nats://host:port (or tls://), comma-separated"
	storeAlone   = "the store reads none: give s3://bucket[/prefix] or file:///path, the region in store.region and path-style addressing in store.path_style"
	natsSecrets  = "give them with --nats-creds (NATS_CREDS), or --nats-user with --nats-password-file (NATS_USER, NATS_PASSWORD_FILE), or --nats-token-file (NATS_TOKEN_FILE)"
)

// URLKeys are the config's URL keys, each with where its secret belongs.
var URLKeys = []URLKey{
	{Key: "nats.url", EnvUser: true, Secrets: natsSecrets, Alone: natsAlone, value: func(c Config) string { return c.NATS.URL }, check: checkNATSURL},
	{Key: "store.url", Secrets: s3Secrets, Alone: storeAlone, value: func(c Config) string { return c.Store.URL }, check: checkStoreURL},
	{Key: "store.endpoint", Secrets: s3Secrets, value: func(c Config) string { return c.Store.Endpoint }, check: checkHTTPURL},
	{Key: "model.base_url", Secrets: modelSecrets, value: func(c Config) string { return c.Model.BaseURL }, check: checkHTTPURL},
}

// URLFrom is where a URL key's value was given, which decides the secrets it may carry.
type URLFrom int

const (
	// FromFile is a config file: shared, committed, a ConfigMap. It carries no secret.
	FromFile URLFrom = iota
	// FromFlag is a flag (submit's --nats, --store, --s3-endpoint): its value is in the process
	// list for every local user to read, so it carries no secret either.
	FromFlag
	// FromEnv is an environment variable (NATS_URL, BOXCAR_STORE, BOXCAR_S3_ENDPOINT,
	// OPENAI_BASE_URL), which may come from a Secret (valueFrom.secretKeyRef): it may carry
	// user information where the key's client logs in with it (URLKey.EnvUser: NATS_URL),
	// shown redacted everywhere. A query or fragment is refused from here too: no key's client
	// reads one, so it would be a secret in the logs for nothing.
	FromEnv
)

// CheckURL checks v, the value of the URL key key (one of URLKeys) given from from, as the
// config's load checks the key's: a secret the source may not carry is refused saying where it
// belongs, then the URL's form. The error names neither v nor where it came from: the caller
// names the flag or variable.
func CheckURL(key string, from URLFrom, v string) error {
	i := slices.IndexFunc(URLKeys, func(k URLKey) bool { return k.Key == key })
	if i < 0 {
		panic("config: " + key + " is not a URL key")
	}
	return URLKeys[i].checkFrom(from, v)
}

// checkFrom is CheckURL for this key.
func (k URLKey) checkFrom(from URLFrom, v string) error {
	if what := k.secret(v, from == FromEnv && k.EnvUser); what != "" {
		where, instead := "", k.Secrets
		if from == FromFlag {
			where = ", which every user of the machine sees in the process list"
		}
		if what != heldUser && k.Alone != "" {
			instead = k.Alone
		}
		return fmt.Errorf("holds %s%s; %s. The value is not shown here", what, where, instead)
	}
	return k.check(v)
}

// What secret finds.
const (
	heldUser  = "credentials (a user:password@ or a token@)"
	heldQuery = "a query (such as ?api_key=), which may be a secret"
	heldFrag  = "a fragment (#…), which may be a secret"
)

// secret says what secret-looking part raw holds ("" when none): each URL of a
// comma-separated list is read as the NATS client reads it, scheme:// added where missing. A
// URL that does not parse is left to the form check, whose error does not quote it. userOK
// lets user information pass.
func (k URLKey) secret(raw string, userOK bool) string {
	for _, part := range strings.Split(raw, ",") {
		part = strings.TrimSpace(part)
		if !strings.Contains(part, "://") {
			part = "x://" + part
		}
		u, err := redact.ParseURL(part)
		switch {
		case err != nil:
		case u.User != nil && !userOK:
			return heldUser
		case u.RawQuery != "" || u.ForceQuery:
			return heldQuery
		case u.Fragment != "":
			return heldFrag
		}
	}
	return ""
}

// validateEndpoints checks each URL the config gives, naming the field and where its secret
// belongs, never the value.
func (c Config) validateEndpoints() []error {
	var errs []error
	for _, k := range URLKeys {
		v := k.value(c)
		if v == "" {
			continue
		}
		if err := k.checkFrom(FromFile, v); err != nil {
			errs = append(errs, &FieldError{Path: k.Key, Msg: err.Error()})
		}
	}
	return errs
}
