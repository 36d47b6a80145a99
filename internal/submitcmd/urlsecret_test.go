package submitcmd

import (
	"bytes"
	"strings"
	"testing"
)

// TestURLCredentialsNotPrinted: a URL whose password does not parse (written as it is), given
// by a flag or a variable, stops submit with an error that names the flag or variable and
// holds no part of the password, in text and in -o json. url.Parse, nats.go and the AWS SDK
// quote such a URL whole in their errors.
func TestURLCredentialsNotPrinted(t *testing.T) {
	t.Parallel()
	const id = "20261202t101500-abcdef012345"
	sources := []struct {
		name, scheme string
		flag         bool     // a flag, else an environment variable
		args         []string // besides it, to reach the code that reads it
		commands     [][]string
	}{
		{name: "--nats", scheme: "nats", flag: true},
		{name: "NATS_URL", scheme: "nats"},
		{name: "--store", scheme: "s3", flag: true, commands: [][]string{{"get", id, "--out", "OUT"}}},
		{name: "BOXCAR_STORE", scheme: "s3", commands: [][]string{{"get", id, "--out", "OUT"}}},
		{name: "--s3-endpoint", scheme: "http", flag: true, args: []string{"--store", "s3://bucket"}, commands: [][]string{{"get", id, "--out", "OUT"}}},
		{name: "BOXCAR_S3_ENDPOINT", scheme: "http", args: []string{"--store", "s3://bucket"}, commands: [][]string{{"get", id, "--out", "OUT"}}},
	}
	forms := []string{"s3cr%ZZet", "s3cr/et", "s3cr?et", "s3cr#et", "s3cr et"}
	for _, src := range sources {
		commands := src.commands
		if commands == nil {
			commands = [][]string{{"list"}, {"status", id, "-o", "json"}}
		}
		for _, form := range forms {
			url := src.scheme + "://boxcar:Hunter2-" + form + "@127.0.0.1:1"
			for _, cmd := range commands {
				home := t.TempDir()
				env := map[string]string{"BOXCAR_HOME": home}
				args := append(append([]string{}, cmd...), src.args...)
				for i, a := range args {
					args[i] = strings.ReplaceAll(a, "OUT", home+"/out")
				}
				if src.flag {
					args = append(args, src.name, url)
				} else {
					env[src.name] = url
				}
				var stdout, stderr bytes.Buffer
				err := Run(t.Context(), args, func(k string) string { return env[k] }, &stdout, &stderr)
				if err == nil {
					t.Fatalf("submit %s with %s %q: no error", cmd[0], src.name, form)
				}
				_, msg := ExitCode(err)
				all := msg + stdout.String() + stderr.String()
				if strings.Contains(all, "s3cr") || strings.Contains(all, "boxcar:") {
					t.Errorf("submit %s prints the password of %s:\n%s", cmd[0], src.name, all)
				}
				if !strings.Contains(all, src.name) {
					t.Errorf("submit %s: the error does not name %s:\n%s", cmd[0], src.name, all)
				}
			}
		}
	}
}
