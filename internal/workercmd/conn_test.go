package workercmd

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/connflags"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestLockDataDir: a second worker on the same data dir is refused and told which process
// holds it; once the first lets go, the dir can be taken again.
func TestLockDataDir(t *testing.T) {
	dir := t.TempDir()
	release, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockDataDir(dir)
	if err == nil || !strings.Contains(err.Error(), "in use by pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second lock: %v; want in use by pid %d", err, os.Getpid())
	}
	release()
	again, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again()
}

func TestEmbeddedToken(t *testing.T) {
	tests := []struct {
		name    string
		host    string
		given   queue.ConnOptions
		wantErr bool
		file    bool // a generated token is written to the data dir
	}{
		{name: "loopback generates a token", host: "127.0.0.1", file: true},
		{name: "localhost generates a token", host: "localhost", file: true},
		{name: "all interfaces without a token", host: "0.0.0.0", wantErr: true},
		{name: "a LAN address without a token", host: "192.0.2.10", wantErr: true},
		{name: "all interfaces with the operator's token", host: "0.0.0.0", given: queue.ConnOptions{Token: "operator-token"}},
		{name: "a user login instead of a token", host: "127.0.0.1", given: queue.ConnOptions{User: "u", Password: "p"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tok, err := embeddedToken(dir, tt.host, tt.given)
			if (err != nil) != tt.wantErr {
				t.Fatalf("embeddedToken: %q, %v; want error %v", tok, err, tt.wantErr)
			}
			fi, ferr := os.Stat(filepath.Join(dir, connflags.EmbeddedTokenFile))
			switch {
			case tt.file && (ferr != nil || fi.Mode().Perm() != 0o600 || len(tok) < 32):
				t.Errorf("token file: %v, %v (token %d chars); want mode 0600 and a long token", fi, ferr, len(tok))
			case !tt.file && ferr == nil:
				t.Errorf("a token file was written")
			case tt.given.Token != "" && tok != tt.given.Token:
				t.Errorf("token %q, want the operator's", tok)
			}
		})
	}
}
