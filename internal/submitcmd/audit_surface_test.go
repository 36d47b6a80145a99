package submitcmd

import (
	"bytes"
	"strings"
	"testing"
)

// TestAuditNATSURLPasswordNotPrinted: a NATS URL with a password (NATS_URL or --nats) is shown
// redacted in submit's errors, as queue.RedactURL promises. A password url.Parse cannot read
// ('%' without two hex digits) makes nats.go's parse error quote the whole URL, wrapped after
// the redacted one, so the password is printed in full (and with -o json, in the JSON error).
func TestAuditNATSURLPasswordNotPrinted(t *testing.T) {
	t.Parallel()
	const secret = "Hunter2-s3cr%ZZet"
	url := "nats://boxcar:" + secret + "@127.0.0.1:1"
	for _, args := range [][]string{{"list", "--nats", url}, {"status", "20261202t101500-abcdef012345", "--nats", url, "-o", "json"}} {
		var stdout, stderr bytes.Buffer
		home := t.TempDir()
		err := Run(t.Context(), args, func(k string) string { return map[string]string{"BOXCAR_HOME": home}[k] }, &stdout, &stderr)
		if err == nil {
			t.Fatalf("submit %s: no error", args[0])
		}
		_, msg := ExitCode(err)
		if all := msg + stdout.String() + stderr.String(); strings.Contains(all, "s3cr") {
			t.Errorf("submit %s prints the NATS password:\n%s", args[0], all)
		}
	}
}
