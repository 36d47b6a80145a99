package egress

import (
	"sort"
)

// caEnvVars are the variables common clients read for an extra CA bundle: OpenSSL (curl,
// python ssl, git's default build), requests, node, git, pip and curl.
var caEnvVars = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "PIP_CERT", "CURL_CA_BUNDLE"}

// Env returns, sorted, the "NAME=value" variables the sandbox's commands need: the proxy
// variables for proxyAddr (the proxy's "host:port" as seen inside the sandbox), one
// placeholder per secret, and the CA bundle variables pointing at caPath (the file inside the
// sandbox where the caller put CACertPEM, together with the roots the sandbox's clients should
// trust for every other host: NODE_EXTRA_CA_CERTS adds, the others replace). An empty caPath
// leaves the CA variables out.
func (p *Proxy) Env(proxyAddr, caPath string) []string {
	url := "http://" + proxyAddr
	vars := map[string]string{
		"HTTP_PROXY": url, "HTTPS_PROXY": url, "ALL_PROXY": url,
		"http_proxy": url, "https_proxy": url, "all_proxy": url,
		// Loopback inside the sandbox is the sandbox's own; everything else goes to the proxy.
		"NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1",
	}
	if caPath != "" {
		for _, v := range caEnvVars {
			vars[v] = caPath
		}
	}
	for _, s := range p.policy.secrets {
		vars[s.env] = s.placeholder
	}
	out := make([]string, 0, len(vars))
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
