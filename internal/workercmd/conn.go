package workercmd

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/boxcar-run/boxcar/internal/connflags"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// connFlags are the worker's flags for reaching NATS, the store and the model with
// credentials and private CAs; connflags reads them the same way for submit.
type connFlags struct {
	nats    connflags.NATS
	s3CA    string
	modelCA string
}

// bindConnFlags adds every credential and TLS flag of the worker to fs.
func bindConnFlags(fs connflags.FlagSet, c *connFlags) {
	c.nats.Bind(fs)
	fs.StringVar(&c.s3CA, "s3-ca", "", "PEM `FILE` of the CAs that sign the S3 endpoint's certificate (default $BOXCAR_S3_CA, else AWS_CA_BUNDLE or the system's)")
	fs.StringVar(&c.modelCA, "model-ca", "", "PEM `FILE` of the CAs that sign the model endpoint's certificate (default $BOXCAR_MODEL_CA, else the system's)")
}

// httpClient is a client whose TLS trusts the CA file of --flagName, else of env, besides the
// system's; nil when neither is set, so that the caller keeps its default. An error names the
// one that gave the file.
func httpClient(flag, flagName, env string, getenv func(string) string) (*http.Transport, error) {
	path, from := flag, "--"+flagName
	if path == "" {
		path, from = getenv(env), env
	}
	if path == "" {
		return nil, nil
	}
	t, err := connflags.Transport(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", from, err)
	}
	return t, nil
}

// embeddedToken is the token of the embedded NATS server: the operator's (--nats-token-file,
// NATS_TOKEN) when given, else a new random one written to <data dir>/nats.token, mode 0600,
// where a local submit finds it. A listen address off this machine needs the operator's: a
// generated token would guard a server the network reaches with a secret no remote client
// has, and nobody chose that.
func embeddedToken(dataDir, listenHost string, given queue.ConnOptions) (string, error) {
	switch {
	case given.Token != "":
		return given.Token, nil
	case given.Auth() != "none":
		return "", errors.New("--embedded: the embedded NATS server takes a token only (--nats-token-file or NATS_TOKEN); unset the other NATS credentials")
	case !queue.IsLoopbackHost(listenHost):
		return "", fmt.Errorf("--nats-listen %s: the embedded NATS server listens off this machine only with a token that you give (--nats-token-file FILE or NATS_TOKEN); without one it serves loopback only (127.0.0.1)", listenHost)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b)
	path := filepath.Join(dataDir, connflags.EmbeddedTokenFile)
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	if err := os.WriteFile(tmp, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write the embedded NATS token: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("write the embedded NATS token: %w", err)
	}
	return tok, nil
}

// lockFile is the file in the data dir that one embedded worker holds locked while it runs.
const lockFile = "worker.lock"

// lockDataDir takes the data dir for this process, or says which process has it. The lock is
// an flock, so a worker that died leaves no stale lock behind: only its pid in the file.
func lockDataDir(dir string) (release func(), err error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		data := make([]byte, 32)
		n, _ := f.ReadAt(data, 0)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(data[:n]))); perr == nil {
				holder = "pid " + strconv.Itoa(pid)
			}
			return nil, fmt.Errorf("data dir %s is in use by %s (another `worker --embedded`); stop it, or give this one its own --data-dir", dir, holder)
		}
		return nil, fmt.Errorf("lock the data dir %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { _ = f.Close() }, nil
}
