// Package egress owns the per-sandbox egress proxy: the only way out of a sandbox that has
// network access. It decides which hosts a job may reach, resolves each name once, checks every
// resolved address against ranges that are denied whatever the allowlist says, and dials the
// checked address (no rebinding between check and dial). It swaps credential placeholders for
// their real values only on TLS to the hosts a credential is bound to.
//
// It knows nothing of NATS, models, profiles or sandbox backends: the caller builds a Policy
// from the profile, a Config from the worker's settings, creates one listener per sandbox (a
// unix socket a backend bind-mounts or forwards) and serves one Proxy on it.
//
// The API, in use order:
//
//	m := egress.NewMetrics(reg)                   // once per worker
//	p, err := egress.New(egress.Config{Metrics: m, WorkerEndpoints: eps, OnDecision: rec},
//		egress.Policy{Allow: []string{"api.example.com", "*.files.example.com", "pkg.example.com:443"},
//			Secrets: []egress.Secret{{Env: "EXAMPLE_TOKEN", Value: real, Hosts: []string{"api.example.com"}}}})
//	ln, _ := net.Listen("unix", sockPath)         // one per sandbox
//	go p.Serve(ctx, ln)                           // returns when ctx ends or ln closes
//	env := p.Env("127.0.0.1:3128", "/etc/boxcar/egress-ca.pem") // HTTP(S)_PROXY, placeholders, CA vars
//	os.WriteFile(caInSandbox, append(hostRoots, p.CACertPEM()...), 0o644) // the bundle at caPath
//	...
//	s := p.Summary()                              // hosts, requests and bytes per host, secrets used
//
// What is filtered: HTTP requests sent to the proxy (forward form) and CONNECT tunnels carrying
// TLS. What is not: anything that does not go through the proxy (UDP, raw TCP, DNS); the
// sandbox must have no other route out, which is the backend's job.
package egress
