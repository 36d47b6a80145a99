package config

import (
	"fmt"

	"github.com/boxcar-run/boxcar/internal/redact"
)

// CheckNATSURL checks a NATS URL list (nats.url, NATS_URL, submit's --nats) as the NATS client
// will read it. Like every check of a URL here, its error never holds the URL: one that does
// not parse may hold a password the parser cannot read (docs/security.md).
func CheckNATSURL(list string) error {
	return redact.CheckURLList(list, "nats")
}

// CheckStoreURL checks the form of a store URL (store.url, BOXCAR_STORE): one that parses, with
// no credentials; the store checks the rest when it opens it.
func CheckStoreURL(raw string) error {
	u, err := redact.ParseURL(raw)
	if err != nil {
		return err
	}
	if u.User != nil {
		return fmt.Errorf("%s: credentials do not belong in the URL; use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", redact.URL(raw))
	}
	return nil
}

// CheckHTTPURL checks an http(s) URL with a host: an S3 endpoint (store.endpoint), a model
// base URL (model.base_url, OPENAI_BASE_URL).
func CheckHTTPURL(raw string) error {
	_, err := redact.ParseHTTPURL(raw)
	return err
}

// validateEndpoints checks each URL the config gives, naming the field, never the value.
func (c Config) validateEndpoints() []error {
	var errs []error
	for _, e := range []struct {
		field, value string
		check        func(string) error
	}{
		{"nats.url", c.NATS.URL, CheckNATSURL},
		{"store.url", c.Store.URL, CheckStoreURL},
		{"store.endpoint", c.Store.Endpoint, CheckHTTPURL},
		{"model.base_url", c.Model.BaseURL, CheckHTTPURL},
	} {
		if e.value == "" {
			continue
		}
		if err := e.check(e.value); err != nil {
			errs = append(errs, &FieldError{Path: e.field, Msg: err.Error()})
		}
	}
	return errs
}
