package sandbox_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// listing answers the file script's list with a fixed text, as a pod whose job wrote into the
// answer would.
type listing string

func (l listing) Exec(_ context.Context, _, _ string, argv []string, _ io.Reader, stdout, _ io.Writer) error {
	if i := slices.Index(argv, "boxcar-file"); i >= 0 && argv[i+1] == "list" {
		_, err := io.WriteString(stdout, string(l))
		return err
	}
	return nil
}

// TestKubernetesListLeavesOutBadLines: the pod's listing comes from inside the pod, where the
// job can forge it. A line whose size does not parse, or parses below 0 (which would lower the
// runner's total against its caps), is a file List cannot stat: left out, and named.
func TestKubernetesListLeavesOutBadLines(t *testing.T) {
	for _, tt := range []struct {
		name string
		line string
	}{
		{name: "negative size", line: "-4611686018427387904 644"},
		{name: "size of -1", line: "-1 644"},
		{name: "stat failed", line: ""},
		{name: "not a number", line: "x 644"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			fakeKubelet(t, client, nil)
			answer := listing("/work/out\x00" + tt.line + "\x00/work/out/bad.bin\x00" + "5 644\x00/work/out/ok.txt\x00")
			p := newKubernetes(t, client, func(c *sandbox.KubernetesConfig) { c.Executor = answer })
			sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
			files, err := sb.List(t.Context(), "out")
			var incomplete *sandbox.IncompleteError
			if !errors.As(err, &incomplete) || len(incomplete.Skipped) != 1 || incomplete.Skipped[0].Path != "out/bad.bin" {
				t.Fatalf("List err = %v, want out/bad.bin named as left out", err)
			}
			if len(files) != 1 || files[0].Path != "out/ok.txt" || files[0].Size != 5 {
				t.Errorf("List = %+v, want only out/ok.txt of 5 bytes", files)
			}
		})
	}
}
