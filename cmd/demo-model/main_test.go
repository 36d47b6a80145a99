package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRunServesUntilCancelled(t *testing.T) {
	addrFile := filepath.Join(t.TempDir(), "model.url")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, []string{"--addr", "127.0.0.1:0", "--addr-file", addrFile}, outW, io.Discard)
		outW.Close()
		done <- err
	}()

	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the base URL from stdout: %v", err)
	}
	baseURL := strings.TrimSpace(line)
	if !strings.HasPrefix(baseURL, "http://127.0.0.1:") || !strings.HasSuffix(baseURL, "/v1") {
		t.Fatalf("stdout = %q, want http://127.0.0.1:PORT/v1", baseURL)
	}
	inFile, err := os.ReadFile(addrFile)
	if err != nil || strings.TrimSpace(string(inFile)) != baseURL {
		t.Fatalf("--addr-file holds %q (%v), want %q", inFile, err, baseURL)
	}

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(baseURL + "/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v1/models = %d, want 200", resp.StatusCode)
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("run after cancel = %v, want nil", err)
	}
	if _, err := os.Stat(addrFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the address file is still there after exit (%v)", err)
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{name: "unknown flag", args: []string{"--port", "1"}},
		{name: "stray argument", args: []string{"serve"}},
		{name: "bad address", args: []string{"--addr", "not-an-address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := run(context.Background(), tt.args, io.Discard, io.Discard); err == nil {
				t.Error("run succeeded, want an error")
			}
		})
	}
}
