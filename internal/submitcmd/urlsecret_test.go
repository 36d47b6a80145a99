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

// TestURLSecretsRefusedBySource: a flag's value is in the process list for every user of the
// machine, so a secret in --nats, --store or --s3-endpoint is refused as the workers' config
// refuses one, naming the flag and where the secret belongs; a variable may carry a URL's user
// information where its client logs in with it (NATS_URL; it may come from a Secret), never a
// query, which no key's client reads. No output holds the secret.
func TestURLSecretsRefusedBySource(t *testing.T) {
	t.Parallel()
	const secret, id = "Hunter2-s3cret", "20261202t101500-abcdef012345"
	get := []string{"get", id, "--out", "OUT"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		command []string
		want    []string // nil: only that the secret is not there
	}{
		{name: "password in --nats", args: []string{"--nats", "nats://boxcar:" + secret + "@127.0.0.1:1"}, command: []string{"list"},
			want: []string{"--nats: holds credentials", "process list", "--nats-creds"}},
		{name: "token in the second of --nats", args: []string{"--nats", "nats://127.0.0.1:1," + secret + "@127.0.0.1:2"}, command: []string{"status", id, "-o", "json"},
			want: []string{"--nats: holds credentials"}},
		{name: "keys in --store", args: []string{"--store", "s3://AKIDEXAMPLE:" + secret + "@bucket"}, command: get,
			want: []string{"--store: holds credentials", "AWS_SECRET_ACCESS_KEY"}},
		{name: "keys in --s3-endpoint", args: []string{"--store", "s3://bucket", "--s3-endpoint", "http://AKIDEXAMPLE:" + secret + "@127.0.0.1:1"}, command: get,
			want: []string{"--s3-endpoint: holds credentials", "AWS_SECRET_ACCESS_KEY"}},
		{name: "signature in BOXCAR_S3_ENDPOINT", args: []string{"--store", "s3://bucket"}, env: map[string]string{"BOXCAR_S3_ENDPOINT": "http://127.0.0.1:1/?X-Amz-Signature=" + secret}, command: get,
			want: []string{"BOXCAR_S3_ENDPOINT: holds a query", "AWS_SECRET_ACCESS_KEY"}},
		{name: "keys in BOXCAR_S3_ENDPOINT", args: []string{"--store", "s3://bucket"}, env: map[string]string{"BOXCAR_S3_ENDPOINT": "http://AKIDEXAMPLE:" + secret + "@127.0.0.1:1"}, command: get,
			want: []string{"BOXCAR_S3_ENDPOINT: holds credentials", "AWS_SECRET_ACCESS_KEY"}},
		{name: "token in NATS_URL's query", env: map[string]string{"NATS_URL": "nats://127.0.0.1:1/?auth_token=" + secret}, command: []string{"list"},
			want: []string{"NATS_URL: holds a query", "nats://host:port"}},
		{name: "region in --store's query", args: []string{"--store", "s3://bucket?region=eu-west-1"}, command: get,
			want: []string{"--store: holds a query", "store.region"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			home := t.TempDir()
			// Keys of its own and no metadata service: an S3 client the check let through
			// would reach 127.0.0.1:1 only.
			env := map[string]string{"BOXCAR_HOME": home, "AWS_ACCESS_KEY_ID": "AKIDTEST", "AWS_SECRET_ACCESS_KEY": "not-a-key",
				"AWS_EC2_METADATA_DISABLED": "true", "AWS_REGION": "us-east-1"}
			for k, v := range tt.env {
				env[k] = v
			}
			args := append(append([]string{}, tt.command...), tt.args...)
			for i, a := range args {
				args[i] = strings.ReplaceAll(a, "OUT", home+"/out")
			}
			var stdout, stderr bytes.Buffer
			err := Run(t.Context(), args, func(k string) string { return env[k] }, &stdout, &stderr)
			if err == nil {
				t.Fatalf("submit %v: no error", args)
			}
			_, msg := ExitCode(err)
			all := msg + "\n" + stdout.String() + stderr.String()
			if strings.Contains(all, "s3cr") {
				t.Errorf("submit %s prints the secret:\n%s", tt.command[0], all)
			}
			for _, w := range tt.want {
				if !strings.Contains(all, w) {
					t.Errorf("submit %s: the error does not say %q:\n%s", tt.command[0], w, all)
				}
			}
		})
	}
}
