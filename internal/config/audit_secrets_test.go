package config_test

import (
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
)

// TestAuditSecretsFromQuotesAPastedValue: a secret's `from` names where the value is, and the
// one mistake it invites is the value itself pasted there. The error then quotes it whole (in
// the worker's start error and in check-config's output, which are logged), where the
// config's other messages redact what could be a credential ("never by value",
// docs/configuration.md).
func TestAuditSecretsFromQuotesAPastedValue(t *testing.T) {
	t.Parallel()
	const value = "ghp_R3alT0kenValue0123456789abcdefABCD"
	for _, from := range []string{value, "Bearer " + value, "env:" + value + "-x"} {
		t.Run(from[:6], func(t *testing.T) {
			t.Parallel()
			yaml := `
profiles:
  api:
    model: {name: m}
    tools: [{name: read_file}]
    network: {allow: [api.example.com]}
    secrets: [{env: API_TOKEN, from: "` + from + `", hosts: [api.example.com]}]
`
			_, err := config.Parse([]byte(yaml))
			if err == nil {
				t.Fatal("Parse accepted the pasted value")
			}
			if strings.Contains(err.Error(), value) {
				t.Fatalf("the error quotes the value pasted in from: %v", strings.ReplaceAll(err.Error(), value, "<VALUE>"))
			}
		})
	}
}
