package queue_test

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/natsauthtest"
)

// TestCredsFileSeedStaysHome: a creds file is sent as its JWT and signs the server's nonce with
// its seed; the seed itself never leaves the client. nats.go takes a file without a decorated
// JWT whole for the JWT, so a seed file given as the creds file would go to the server, over
// plain TCP when the server has no TLS. Such a file is refused before any dial.
func TestCredsFileSeedStaysHome(t *testing.T) {
	t.Parallel()
	_, seedFile := natsauthtest.NKeyUser(t)
	seed, err := os.ReadFile(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	onlySeed, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	decorated, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	decoratedSeed, _ := decorated.Seed()
	seedOnlyCreds, _ := onlySeed.Seed()
	dir := t.TempDir()
	tests := []struct {
		name, content, seed string
	}{
		{name: "an nkey seed file", content: string(seed), seed: strings.TrimSpace(string(seed))},
		{name: "a seed with a comment", content: "# boxcar worker\n" + string(seedOnlyCreds) + "\n", seed: string(seedOnlyCreds)},
		{name: "a decorated seed without its JWT", content: "-----BEGIN USER NKEY SEED-----\n" + string(decoratedSeed) + "\n------END USER NKEY SEED------\n", seed: string(decoratedSeed)},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(dir, "user"+string(rune('a'+i))+".creds")
			if err := os.WriteFile(file, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got := make(chan string, 1)
			addr := fakeNATS(t, got)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			nc, err := queue.Connect(ctx, queue.ConnOptions{URL: "nats://" + addr, CredsFile: file})
			if err == nil {
				nc.Close()
				t.Fatal("connected with a creds file that holds no JWT")
			}
			noSecrets(t, "the error", err.Error(), []string{tt.seed})
			select {
			case line := <-got:
				noSecrets(t, "what the server received", line, []string{tt.seed})
			default:
			}
		})
	}
}

// fakeNATS accepts one client on loopback, greets it with an INFO that asks for a nonce
// signature, and sends the CONNECT line it gets to got.
func fakeNATS(t *testing.T, got chan<- string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = c.Write([]byte(`INFO {"server_id":"fake","version":"2.10.0","proto":1,"max_payload":1048576,"nonce":"bm9uY2U","auth_required":true}` + "\r\n"))
		line, _ := bufio.NewReader(c).ReadString('\n')
		got <- line
		_, _ = c.Write([]byte("-ERR 'Authorization Violation'\r\n"))
	}()
	return l.Addr().String()
}
