package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Network is what a profile's sandbox may reach: nothing but the hosts in Allow, through the
// worker's egress proxy. A profile without one has no network at all.
type Network struct {
	// Allow lists the hosts the sandbox's commands may reach: "host" (any port),
	// "host:port", or "*.suffix" (any name strictly under suffix, optionally with ":port").
	// An entry names hosts, never addresses: the proxy resolves each name itself and refuses
	// loopback, private and link-local addresses whatever this says. Required (at least one).
	Allow []string `json:"allow"`
}

// Secret is a credential the sandbox's commands use without ever holding it: they see a random
// placeholder in the variable Env, and the worker's proxy swaps it for the real value in
// request headers sent over TLS to Hosts only.
type Secret struct {
	// Env is the variable the sandbox's commands read the placeholder from.
	Env string `json:"env"`
	// From is where the worker reads the real value, per job: "env:NAME" (a variable of the
	// worker's environment) or "file:/absolute/path" (a file, trailing newline dropped). The
	// value itself is never in the config, a log line or a manifest.
	From string `json:"from"`
	// Hosts are the only hosts the value is sent to, in Allow's syntax; each must be allowed.
	Hosts []string `json:"hosts"`
}

// Egress are the worker's settings for the per-sandbox proxy that profiles with a network
// reach the outside through. Zero values take the proxy's defaults.
type Egress struct {
	// Resolver is the DNS server ("host:port") the proxy resolves allowed names with.
	// Default: the host's resolver.
	Resolver string `json:"resolver,omitempty"`
	// UpstreamCA is a PEM file of roots the proxy trusts, besides the host's, when it checks
	// the certificate of an upstream it terminates TLS for (hosts a secret is bound to).
	UpstreamCA string `json:"upstream_ca,omitempty"`
	// DeniedCIDRs are refused on top of the built-in denials (loopback, link-local, private,
	// CGNAT, multicast, the host's own addresses and the worker's endpoints).
	DeniedCIDRs []string `json:"denied_cidrs,omitempty"`
	// AllowedCIDRs lift the built-in denials of private, CGNAT and benchmark ranges for these
	// prefixes (an internal package index, say). Loopback, link-local (metadata) and the host's
	// own addresses stay denied; DeniedCIDRs win over this.
	AllowedCIDRs []string `json:"allowed_cidrs,omitempty"`
	// NAT64Prefixes are the network's own NAT64 prefixes (RFC 6052 lengths: /32, /40, /48,
	// /56, /64, /96), besides the well-known 64:ff9b::/96: the IPv4 address an address in one
	// carries is checked as well (egress.Config.NAT64Prefixes).
	NAT64Prefixes []string `json:"nat64_prefixes,omitempty"`
	// Limits cap each job's traffic.
	Limits EgressLimits `json:"limits,omitzero"`
}

// EgressLimits cap one job's traffic through the proxy. Zero takes the default.
type EgressLimits struct {
	// MaxRequests counts forwarded requests, tunnels and requests inside intercepted tunnels.
	// Default: 10000.
	MaxRequests int64 `json:"max_requests,omitempty"`
	// MaxBytes counts both directions. Default: 1 GiB.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// MaxTunnels bounds concurrent connections. Default: 64.
	MaxTunnels int `json:"max_tunnels,omitempty"`
	// MaxHeaderBytes bounds a request's header. Default: 32 KiB.
	MaxHeaderBytes int `json:"max_header_bytes,omitempty"`
	// HeaderTimeout bounds reading a request header or a TLS ClientHello. Default: 10s.
	HeaderTimeout Duration `json:"header_timeout,omitempty"`
	// DialTimeout bounds resolving and dialling an upstream. Default: 10s.
	DialTimeout Duration `json:"dial_timeout,omitempty"`
	// IdleTimeout closes a connection idle this long. Default: 5m.
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
}

var (
	// hostLabel is one DNS label; a host is one or more, dot separated.
	hostLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	// reservedEnv are variables the worker sets for a networked sandbox's commands; a secret
	// named like one would be overwritten or would redirect traffic.
	reservedEnv = map[string]bool{
		"HTTP_PROXY": true, "HTTPS_PROXY": true, "ALL_PROXY": true, "NO_PROXY": true,
		"SSL_CERT_FILE": true, "REQUESTS_CA_BUNDLE": true, "NODE_EXTRA_CA_CERTS": true,
		"GIT_SSL_CAINFO": true, "PIP_CERT": true, "CURL_CA_BUNDLE": true,
		"PATH": true, "HOME": true, "LANG": true,
	}
)

// allowRule is one parsed Allow (or Hosts) entry.
type allowRule struct {
	host     string // lower case, without "*."
	wildcard bool   // "*.host": names strictly under host
	port     int    // 0: any
}

// parseAllow reads "host", "host:port", "*.suffix" or "*.suffix:port". Its errors quote the
// entry without what precedes an '@': a URL written here by mistake may carry a password.
func parseAllow(entry string) (allowRule, error) {
	var r allowRule
	shown := withoutCredentials(entry)
	host, port, err := splitPort(strings.ToLower(entry))
	if err != nil {
		return r, fmt.Errorf("%q: %w", shown, err)
	}
	r.port = port
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		host, r.wildcard = rest, true
	}
	if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return r, fmt.Errorf("%q is an address; allow hosts by name (the proxy resolves them and refuses internal addresses)", shown)
	}
	labels := strings.Split(host, ".")
	for _, l := range labels {
		if !hostLabel.MatchString(l) {
			return r, fmt.Errorf("%q is not a host name, host:port or *.suffix (label %q)", shown, withoutCredentials(l))
		}
	}
	if r.wildcard && len(labels) < 2 {
		return r, fmt.Errorf("%q would allow a whole top-level domain; name a suffix with two labels or more", shown)
	}
	r.host = host
	return r, nil
}

// splitPort splits a trailing ":port" off s; its error quotes nothing of s.
func splitPort(s string) (string, int, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return s, 0, nil
	}
	p, err := strconv.Atoi(s[i+1:])
	if err != nil || p < 1 || p > 65535 {
		return "", 0, errors.New("the port after the last ':' must be a number from 1 to 65535")
	}
	return s[:i], p, nil
}

// covers reports whether every host:port that b matches, a matches too.
func (a allowRule) covers(b allowRule) bool {
	if a.port != 0 && a.port != b.port {
		return false
	}
	if !a.wildcard {
		return !b.wildcard && a.host == b.host
	}
	return strings.HasSuffix(b.host, "."+a.host) || (b.wildcard && b.host == a.host)
}

func (n *Network) validate(field func(string) string) []error {
	var errs []error
	if len(n.Allow) == 0 {
		errs = append(errs, &FieldError{Path: field("network.allow"), Msg: "is empty; list the hosts the sandbox may reach, or leave network out for no network at all"})
	}
	for i, a := range n.Allow {
		if _, err := parseAllow(a); err != nil {
			errs = append(errs, &FieldError{Path: field(fmt.Sprintf("network.allow[%d]", i)), Msg: err.Error()})
		}
	}
	return errs
}

func validateSecrets(n *Network, secrets []Secret, field func(string) string) []error {
	var errs []error
	bad := func(f, format string, args ...any) {
		errs = append(errs, &FieldError{Path: field(f), Msg: fmt.Sprintf(format, args...)})
	}
	if len(secrets) > 0 && n == nil {
		bad("secrets", "a profile without network has nowhere to send a secret; add network.allow with the secrets' hosts")
		return errs
	}
	var allow []allowRule
	if n != nil {
		for _, a := range n.Allow {
			if r, err := parseAllow(a); err == nil {
				allow = append(allow, r)
			}
		}
	}
	seen := map[string]bool{}
	for i, s := range secrets {
		f := fmt.Sprintf("secrets[%d]", i)
		switch {
		case !envName.MatchString(s.Env):
			bad(f+".env", "%q must be letters, digits and _, not starting with a digit", s.Env)
		case reservedEnv[strings.ToUpper(s.Env)]:
			bad(f+".env", "%q is set by the worker for every networked command; choose another name", s.Env)
		case seen[s.Env]:
			bad(f+".env", "%q is declared twice", s.Env)
		}
		seen[s.Env] = true
		if err := checkSource(s.From); err != nil {
			bad(f+".from", "%v", err)
		}
		if len(s.Hosts) == 0 {
			bad(f+".hosts", "is empty; name the hosts the secret is sent to")
		}
		for j, h := range s.Hosts {
			if msg := coveredBy(h, allow); msg != "" {
				bad(fmt.Sprintf("%s.hosts[%d]", f, j), "%s", msg)
			}
		}
	}
	return errs
}

func coveredBy(h string, allow []allowRule) string {
	r, err := parseAllow(h)
	if err != nil {
		return err.Error()
	}
	for _, a := range allow {
		if a.covers(r) {
			return ""
		}
	}
	return fmt.Sprintf("%q is not in network.allow; a secret goes only to allowed hosts", withoutCredentials(h))
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// conventionalEnvName is a variable's name as variables are written (BOXCAR_API_TOKEN): upper
// case, words joined by _.
var conventionalEnvName = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)

// shownVariable is how an error names the variable an env: source reads: "variable NAME" for
// a name written as names are, upper case and, from 16 characters on, with a _ between words.
// Any other (a lower-case or mixed one, a long run of capitals and digits) may be the value
// itself pasted after env: (ghp_..., a base32 key), so it is described and not quoted.
func shownVariable(name string) string {
	if conventionalEnvName.MatchString(name) && (len(name) < 16 || strings.Contains(strings.Trim(name, "_"), "_")) {
		return "variable " + name
	}
	return "the variable its env: names (not shown: it is not an upper-case NAME such as BOXCAR_API_TOKEN, and may be the value itself pasted there)"
}

// notShown is why an error about a secret's source quotes none of it: the one mistake from
// invites is the value itself pasted there, and these errors reach the worker's log,
// check-config's output and a job's status.
const notShown = "what is written there is not shown, in case it is the value itself"

// checkSource checks the form of a secret's From without reading it. Its errors name the form
// expected and quote nothing of from.
func checkSource(from string) error {
	scheme, rest, _ := strings.Cut(from, ":")
	switch scheme {
	case "env":
		if !envName.MatchString(rest) {
			return fmt.Errorf("env: takes the name of a variable of the worker's environment (letters, digits and _, such as env:BOXCAR_API_TOKEN); %s", notShown)
		}
	case "file":
		if !filepath.IsAbs(rest) {
			return fmt.Errorf("file: takes an absolute path (such as file:/run/secrets/api-token); %s", notShown)
		}
	default:
		return fmt.Errorf("name the source as env:NAME or file:/absolute/path; %s", notShown)
	}
	return nil
}

// ReadSecret reads a secret's real value from its source, through lookupEnv (os.LookupEnv in
// the worker). Errors name a file's path or the variable (as shownVariable allows), never the
// value; the caller names the config key.
func ReadSecret(from string, lookupEnv func(string) (string, bool)) (string, error) {
	if err := checkSource(from); err != nil {
		return "", fmt.Errorf("%w: %v", ErrSecretUnavailable, err)
	}
	scheme, rest, _ := strings.Cut(from, ":")
	if scheme == "env" {
		v, ok := lookupEnv(rest)
		switch {
		case !ok:
			return "", fmt.Errorf("%w: %s is not set, or is empty, in the worker's environment; set it to the secret's value", ErrSecretUnavailable, shownVariable(rest))
		case v == "":
			return "", fmt.Errorf("%w: %s is empty in the worker's environment; set it to the secret's value", ErrSecretUnavailable, shownVariable(rest))
		}
		return v, nil
	}
	data, err := os.ReadFile(rest)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrSecretUnavailable, err)
	}
	v := strings.TrimRight(string(data), "\r\n")
	if v == "" {
		return "", fmt.Errorf("%w: %s is empty", ErrSecretUnavailable, rest)
	}
	return v, nil
}

func (e Egress) validate() []error {
	var errs []error
	for name, list := range map[string][]string{"egress.denied_cidrs": e.DeniedCIDRs, "egress.allowed_cidrs": e.AllowedCIDRs, "egress.nat64_prefixes": e.NAT64Prefixes} {
		for i, c := range list {
			if _, err := netip.ParsePrefix(c); err != nil {
				errs = append(errs, &FieldError{Path: fmt.Sprintf("%s[%d]", name, i), Msg: fmt.Sprintf("%q is not a CIDR prefix such as 10.20.0.0/16 or fd00::/8", withoutCredentials(c))})
			}
		}
	}
	errs = append(errs, nat64Lengths(e.NAT64Prefixes)...)
	if e.Resolver != "" {
		if _, _, err := splitHostPortStrict(e.Resolver); err != nil {
			errs = append(errs, &FieldError{Path: "egress.resolver", Msg: fmt.Sprintf("%q must be host:port, such as 10.0.0.2:53", withoutCredentials(e.Resolver))})
		}
	}
	l := e.Limits
	if l.MaxRequests < 0 || l.MaxBytes < 0 || l.MaxTunnels < 0 || l.MaxHeaderBytes < 0 || l.HeaderTimeout < 0 || l.DialTimeout < 0 || l.IdleTimeout < 0 {
		errs = append(errs, &FieldError{Path: "egress.limits", Msg: "must not be negative (0 takes the default)"})
	}
	if l.MaxHeaderBytes != 0 && l.MaxHeaderBytes < 1024 {
		errs = append(errs, &FieldError{Path: "egress.limits.max_header_bytes", Msg: fmt.Sprintf("%d is too small for real clients; use 1024 or more", l.MaxHeaderBytes)})
	}
	return errs
}

// nat64Lengths refuses a NAT64 prefix RFC 6052 gives no embedding of an IPv4 address for (one
// that does not parse is refused with the CIDRs).
func nat64Lengths(list []string) []error {
	var errs []error
	for i, c := range list {
		if p, err := netip.ParsePrefix(c); err == nil && (!p.Addr().Is6() || !slices.Contains([]int{32, 40, 48, 56, 64, 96}, p.Bits())) {
			errs = append(errs, fmt.Errorf("%w: egress.nat64_prefixes[%d]: %q is not an IPv6 prefix of length 32, 40, 48, 56, 64 or 96 (RFC 6052)", ErrInvalid, i, c))
		}
	}
	return errs
}

func splitHostPortStrict(s string) (string, int, error) {
	h, p, err := splitPort(s)
	if err == nil && (h == "" || p == 0) {
		err = errors.New("no port")
	}
	return h, p, err
}
