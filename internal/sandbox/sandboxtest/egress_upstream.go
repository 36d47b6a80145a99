package sandboxtest

import (
	"archive/zip"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Names the egress suite's resolver answers. The index host is the one a secret is bound to.
const (
	indexHost = "pkgs.boxcar.test"
	otherHost = "other.boxcar.test"
	wheelName = "boxcar_demo-1.0-py3-none-any.whl"
)

// upstream is the suite's package index and API, served in the test's network namespace: it
// records the Authorization header of each request, server side only (it never echoes one).
type upstream struct {
	caPEM []byte
	wheel []byte
	mu    sync.Mutex
	auth  map[string][]string // host → Authorization headers seen
}

func (u *upstream) seen(host string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.auth[host]...)
}

func (u *upstream) handler() http.Handler {
	sum := sha256.Sum256(u.wheel)
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from "+r.Host) })
	mux.HandleFunc("/auth", func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		u.mu.Lock()
		u.auth[host] = append(u.auth[host], r.Header.Get("Authorization"))
		u.mu.Unlock()
		fmt.Fprint(w, "recorded")
	})
	mux.HandleFunc("/simple/boxcar-demo/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"/packages/%s#sha256=%s\">%s</a></body></html>\n", wheelName, hex.EncodeToString(sum[:]), wheelName)
	})
	mux.HandleFunc("/packages/"+wheelName, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(u.wheel) })
	return mux
}

// serveUpstream starts the index on ln, over TLS when tlsCfg is set.
func serveUpstream(t *testing.T, u *upstream, ln net.Listener, tlsCfg *tls.Config) {
	srv := &http.Server{Handler: u.handler(), TLSConfig: tlsCfg, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if tlsCfg != nil {
			_ = srv.Serve(tls.NewListener(ln, tlsCfg))
		} else {
			_ = srv.Serve(ln)
		}
	}()
	t.Cleanup(func() { _ = srv.Close(); <-done })
}

// testPKI makes a CA and a server certificate for the suite's names.
func testPKI(t *testing.T) (caPEM []byte, cert tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "boxcar egress suite upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: indexHost},
		DNSNames:  []string{indexHost, otherHost},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// demoWheel is a pure-Python wheel of boxcar-demo 1.0 whose module says VALUE = 42.
func demoWheel(t *testing.T) []byte {
	t.Helper()
	files := []struct{ name, body string }{
		{"boxcar_demo/__init__.py", "VALUE = 42\n"},
		{"boxcar_demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: boxcar-demo\nVersion: 1.0\n"},
		{"boxcar_demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: boxcar-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record bytes.Buffer
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("boxcar_demo-1.0.dist-info/RECORD,,\n")
	w, err := zw.Create("boxcar_demo-1.0.dist-info/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = w.Write(record.Bytes())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// canary counts whatever reaches a listener that must see nothing.
type canary struct {
	name string
	hits atomic.Int64
}

func (c *canary) watchTCP(ln net.Listener) {
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.hits.Add(1)
			conn.Close()
		}
	}()
}

func (c *canary) watchUDP(pc net.PacketConn) {
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			c.hits.Add(1)
		}
	}()
}
