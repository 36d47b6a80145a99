package egress

import (
	"sort"
	"sync"
	"time"
)

// Reason says why a decision went the way it did. The set is closed (bounded metric labels).
type Reason string

// Reasons. Allowed decisions carry ReasonAllowed or ReasonIntercepted.
const (
	ReasonAllowed        Reason = "allowed"         // forwarded or tunnelled as is
	ReasonIntercepted    Reason = "intercepted"     // TLS terminated for a secret-bound host, or one at its address
	ReasonNotAllowed     Reason = "not_allowed"     // no allow entry matches the host and port
	ReasonDeniedAddress  Reason = "denied_address"  // a resolved or literal address is in a denied range
	ReasonWorkerEndpoint Reason = "worker_endpoint" // the worker's own NATS, store or model endpoint
	ReasonResolve        Reason = "resolve_failed"  // the name did not resolve
	ReasonDial           Reason = "dial_failed"     // the checked address did not answer
	ReasonUpstreamTLS    Reason = "upstream_tls"    // TLS with the upstream failed (its certificate did not verify)
	// An allowed request that failed before the upstream answered is recorded with its failure,
	// not as allowed: outcomes in conn.go says which error is which, on every path.
	ReasonUpstreamClosed  Reason = "upstream_closed"  // the upstream closed or reset the connection before an answer
	ReasonUpstreamTimeout Reason = "upstream_timeout" // no answer within idle_timeout
	ReasonBadResponse     Reason = "bad_response"     // the upstream's answer is not an HTTP/1.1 response the proxy carries
	ReasonBadRequest      Reason = "bad_request"      // unparseable request, target or host
	ReasonSmuggling       Reason = "smuggling"        // CL+TE, duplicate lengths, bare LF, folding...
	ReasonHostMismatch    Reason = "host_mismatch"    // Host header differs from the target
	ReasonSNIMismatch     Reason = "sni_mismatch"     // ClientHello SNI differs from the CONNECT host
	ReasonNotTLS          Reason = "not_tls"          // a CONNECT tunnel that does not start with a ClientHello
	ReasonECH             Reason = "ech"              // a ClientHello that hides its real host (encrypted_client_hello)
	ReasonHeaderTooLarge  Reason = "header_too_large"
	ReasonHeaderTimeout   Reason = "header_timeout" // the client was too slow to send its header
	ReasonTunnelCap       Reason = "tunnel_cap"
	ReasonRequestCap      Reason = "request_cap"
	ReasonByteCap         Reason = "byte_cap"
	ReasonMethod          Reason = "method"      // a method the proxy does not forward (e.g. TRACE)
	ReasonClientTLS       Reason = "client_tls"  // the sandbox's client did not finish TLS with the job CA
	ReasonJobEnded        Reason = "job_ended"   // the job's proxy stopped before the upstream answered
	ReasonProxyError      Reason = "proxy_error" // the proxy panicked serving the request (a bug; it is logged)
)

// Decision is one allowed or denied request, for the transcript. It never holds a secret's
// value; for a denied request Host is what the client asked for, normalised.
type Decision struct {
	Time     time.Time     `json:"time"`
	Allowed  bool          `json:"allowed"`
	Reason   Reason        `json:"reason"`
	Method   string        `json:"method,omitempty"` // CONNECT, GET, ...
	Host     string        `json:"host,omitempty"`
	Port     int           `json:"port,omitempty"`
	Addr     string        `json:"addr,omitempty"`   // the checked address dialled, "ip:port"
	Status   int           `json:"status,omitempty"` // the upstream's HTTP status, when the proxy saw it
	BytesOut int64         `json:"bytes_out"`        // client to upstream
	BytesIn  int64         `json:"bytes_in"`         // to the client: the upstream's bytes and the proxy's own answers
	Duration time.Duration `json:"duration_ns"`
	Secrets  []string      `json:"secrets,omitempty"` // env names of secrets substituted
	Detail   string        `json:"detail,omitempty"`  // a short human explanation
	// Sent is how many times a request in a terminated tunnel went upstream (the Transport
	// replays one a host dropped unanswered): each is one of the job's requests.
	Sent int `json:"sent,omitempty"`
}

// requests is how many of the job's requests d is: each time it was sent, at least one.
func (d Decision) requests() int64 { return int64(max(d.Sent, 1)) }

// Summary is the job's egress, for the signed manifest.
type Summary struct {
	Requests int64         `json:"requests"`
	Denied   int64         `json:"denied"`
	BytesOut int64         `json:"bytes_out"`
	BytesIn  int64         `json:"bytes_in"`
	Hosts    []HostSummary `json:"hosts"`                  // hosts sent a byte, sorted by name
	Secrets  []string      `json:"secrets_used,omitempty"` // env names, sorted
	// ClosedUnread counts the connections and requests the proxy closed unread, with no
	// decision, once the job was past max_requests and told so (conn.go), in the transcript's
	// egress_summary line and the manifest's egress alike.
	ClosedUnread int64 `json:"closed_unread,omitempty"`
	// Lingered counts the bytes of refused requests' bodies the proxy read and dropped after
	// answering, before it closed their connections (lingerClose), in no decision: they are
	// taken from max_bytes, so bytes_out, bytes_in and lingered_bytes are what the job used of it.
	Lingered int64 `json:"lingered_bytes,omitempty"`
}

// HostSummary is the traffic to one host: the requests that sent it a byte, allowed or failed
// or cut after.
type HostSummary struct {
	Host     string `json:"host"`
	Requests int64  `json:"requests"`
	BytesOut int64  `json:"bytes_out"`
	BytesIn  int64  `json:"bytes_in"`
}

// ledger accumulates decisions into a Summary.
type ledger struct {
	mu      sync.Mutex
	sum     Summary
	hosts   map[string]*HostSummary
	secrets map[string]bool
}

func (l *ledger) add(d Decision) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hosts == nil {
		l.hosts, l.secrets = map[string]*HostSummary{}, map[string]bool{}
	}
	l.sum.Requests += d.requests()
	l.sum.BytesOut += d.BytesOut
	l.sum.BytesIn += d.BytesIn
	if !d.Allowed {
		l.sum.Denied++
	}
	// A host's traffic is every request that sent it a byte, however it ended: a request that
	// failed or was cut after it went out (upstream_closed, byte_cap) reached the host too.
	// Refusals before the dial send it nothing, and so does the CONNECT that opens a
	// terminated tunnel (the requests inside are the host's): counted, a tunnel with one
	// request showed its host two, and the proxy's own 200 as bytes from it.
	if d.BytesOut == 0 {
		return
	}
	h := l.hosts[d.Host]
	if h == nil {
		h = &HostSummary{Host: d.Host}
		l.hosts[d.Host] = h
	}
	h.Requests += d.requests()
	h.BytesOut += d.BytesOut
	h.BytesIn += d.BytesIn
	for _, s := range d.Secrets {
		l.secrets[s] = true
	}
}

// closedUnread counts a request closed unread, with no decision (Summary.ClosedUnread).
func (l *ledger) closedUnread() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sum.ClosedUnread++
}

// lingered counts n bytes read and dropped after a refusal (Summary.Lingered).
func (l *ledger) lingered(n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sum.Lingered += n
}

func (l *ledger) summary() Summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sum
	s.Hosts = make([]HostSummary, 0, len(l.hosts))
	for _, h := range l.hosts {
		s.Hosts = append(s.Hosts, *h)
	}
	sort.Slice(s.Hosts, func(i, j int) bool { return s.Hosts[i].Host < s.Hosts[j].Host })
	for n := range l.secrets {
		s.Secrets = append(s.Secrets, n)
	}
	sort.Strings(s.Secrets)
	return s
}
