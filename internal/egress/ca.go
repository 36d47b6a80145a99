package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"
)

// authority is a per-job CA: an ECDSA P-256 key made at New that lives only in this process,
// a short validity, and name constraints that limit it to the hosts it may sign leaves for
// (caNames: the allowed ones, when the job holds a secret), so a copy of it in the sandbox
// vouches for nothing else. Leaves are
// cached per name, up to maxLeaves.
type authority struct {
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	pem      []byte
	validity time.Duration

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

func newAuthority(validity time.Duration, names []string, addrs []net.IP) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "Boxcar egress per-job CA", Organization: []string{"Boxcar"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		// With no bound host the CA signs nothing; ".invalid" (RFC 6761) keeps it unusable.
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         append([]string{"invalid"}, names...),
	}
	for _, ip := range addrs {
		bits := 8 * len(ip)
		tmpl.PermittedIPRanges = append(tmpl.PermittedIPRanges, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
	}
	if len(addrs) == 0 {
		// No IP range permitted would permit every address (TestCAConstraints).
		tmpl.ExcludedIPRanges = []*net.IPNet{{IP: make(net.IP, 4), Mask: net.CIDRMask(0, 32)}, {IP: make(net.IP, 16), Mask: net.CIDRMask(0, 128)}}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("egress: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("egress: CA certificate: %w", err)
	}
	return &authority{
		cert: cert, key: key, validity: validity,
		pem:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		leaves: map[string]*tls.Certificate{},
	}, nil
}

// maxLeaves bounds the leaves a job's CA keeps. A secret bound to "*.example.com" terminates
// TLS for every name under it, so a job could have a leaf signed and kept for each name it
// makes up, as many as max_requests lets it CONNECT to (about 2 KiB each, for the job's
// life); past the bound a leaf is signed again when its name comes back (under 1 ms).
const maxLeaves = 64

// leaf returns the cached leaf for name (a DNS name or an IP literal), signing it on first use.
func (a *authority) leaf(name string) (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.leaves[name]; ok {
		return c, nil
	}
	c, err := a.leafFor([]string{name})
	if err != nil {
		return nil, err
	}
	for old := range a.leaves {
		if len(a.leaves) < maxLeaves {
			break
		}
		delete(a.leaves, old)
	}
	a.leaves[name] = c
	return c, nil
}

// leafFor signs a new leaf for names.
func (a *authority) leafFor(names []string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress: leaf key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     a.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, name := range names {
		if ip := net.ParseIP(name); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, name)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, fmt.Errorf("egress: leaf for %s: %w", names[0], err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("egress: crypto/rand failed: %v", err)) // crypto/rand does not fail on Linux
	}
	return n
}
