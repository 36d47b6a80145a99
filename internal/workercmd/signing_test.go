package workercmd

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

func TestSigningKey(t *testing.T) {
	flagKeys, err := provenance.WriteKeyPair(filepath.Join(t.TempDir(), "flag"))
	if err != nil {
		t.Fatal(err)
	}
	cfgKeys, err := provenance.WriteKeyPair(filepath.Join(t.TempDir(), "config"))
	if err != nil {
		t.Fatal(err)
	}
	pubOf := func(kp provenance.KeyPair) ed25519.PublicKey {
		pub, err := provenance.ReadPublicKeyFile(kp.PublicPath)
		if err != nil {
			t.Fatal(err)
		}
		return pub
	}

	tests := []struct {
		name      string
		embedded  bool
		flag      string
		config    string
		want      ed25519.PublicKey // nil: unsigned
		wantErr   bool
		wantOwn   bool // the key pair in <data dir>/keys was made
		wantInLog string
	}{
		{name: "flag wins over config", flag: flagKeys.PrivatePath, config: cfgKeys.PrivatePath, want: pubOf(flagKeys), wantInLog: "--signing-key"},
		{name: "config", config: cfgKeys.PrivatePath, want: pubOf(cfgKeys), wantInLog: "signing_key"},
		{name: "embedded with a key given makes none", embedded: true, flag: flagKeys.PrivatePath, want: pubOf(flagKeys)},
		{name: "embedded without a key makes one", embedded: true, wantOwn: true, wantInLog: "created a signing key pair"},
		{name: "cluster without a key signs nothing", wantInLog: "manifests are not signed"},
		{name: "missing key file", flag: filepath.Join(t.TempDir(), "none.key"), wantErr: true},
		{name: "public key given as the private key", flag: flagKeys.PublicPath, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			o := Options{Embedded: tt.embedded, DataDir: t.TempDir(), SigningKey: tt.flag}
			key, err := signingKey(o, config.Config{SigningKey: tt.config}, slog.New(slog.NewJSONHandler(&logs, nil)))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error: %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			own := filepath.Join(o.DataDir, keysDir, provenance.PublicKeyFile)
			_, statErr := os.Stat(own)
			if tt.wantOwn != (statErr == nil) {
				t.Fatalf("own key pair exists: %v, want %v", statErr == nil, tt.wantOwn)
			}
			want := tt.want
			if tt.wantOwn {
				if want, err = provenance.ReadPublicKeyFile(own); err != nil {
					t.Fatal(err)
				}
			}
			switch {
			case want == nil && key != nil:
				t.Error("got a key, want none")
			case want != nil && (key == nil || !want.Equal(key.Public())):
				t.Error("got another key than the one configured")
			}
			if !strings.Contains(logs.String(), tt.wantInLog) {
				t.Errorf("log lacks %q:\n%s", tt.wantInLog, logs.String())
			}
		})
	}
}

func TestKeygen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	var stdout, stderr bytes.Buffer
	if err := Run(t.Context(), []string{"keygen", "--out", dir}, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("keygen: %v\n%s", err, stderr.String())
	}
	if _, err := provenance.ReadPrivateKeyFile(filepath.Join(dir, provenance.PrivateKeyFile)); err != nil {
		t.Error(err)
	}
	if !strings.Contains(stdout.String(), "key id:") {
		t.Errorf("keygen printed %q", stdout.String())
	}
	err := Run(t.Context(), []string{"keygen", "--out", dir}, func(string) string { return "" }, &stdout, &stderr)
	if !errors.Is(err, fs.ErrExist) {
		t.Errorf("second keygen: %v, want fs.ErrExist", err)
	}
	if err := Run(t.Context(), []string{"keygen"}, func(string) string { return "" }, &stdout, &stderr); err == nil {
		t.Error("keygen without --out succeeded")
	}
}
