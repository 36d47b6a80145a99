package agent_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
)

// TestOptionalPlaceholderAfterAFlag: an optional placeholder the model leaves out drops its own
// element only, so a flag before it takes the next element as its value: [grep, --max-count,
// "{{max}}", "{{pattern}}", data.csv] called without max ran grep --max-count PATTERN data.csv,
// the pattern as the count and the file as the pattern. The worker refuses such a command at
// start, naming the element and what to write instead; a required placeholder, one after "--",
// after a flag that holds its own value (--color=never) or after a word that is no flag is
// taken.
func TestOptionalPlaceholderAfterAFlag(t *testing.T) {
	const params = `parameters: {type: object, properties: {max: {type: integer}, pattern: {type: string}}, required: [pattern]}`
	tests := []struct {
		name    string
		command string
		refused string // the field named, "" when taken
	}{
		{"optional value of a long flag", `[grep, --max-count, "{{max}}", "{{pattern}}", data.csv]`, "command[2]"},
		{"optional value of a short flag", `[grep, "{{pattern}}", -m, "{{max}}", data.csv]`, "command[3]"},
		{"required value of a flag", `[grep, -e, "{{pattern}}", data.csv]`, ""},
		{"optional after --", `[head, -q, --, "{{max}}"]`, ""},
		{"optional after a flag with its value", `[grep, --color=never, "{{max}}", "{{pattern}}"]`, ""},
		{"optional after a word", `[seq, "{{pattern}}", "{{max}}"]`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			yaml := "profiles:\n  p:\n    model: {name: m}\n    tools:\n      - {name: find, command: " + tt.command + ", " + params + "}\n"
			cfg, err := config.Parse([]byte(yaml))
			if err != nil {
				t.Fatalf("config.Parse: %v", err)
			}
			err = agent.CheckProfiles(cfg.Profiles)
			if tt.refused == "" {
				if err != nil {
					t.Errorf("CheckProfiles: %v, want the command taken", err)
				}
				return
			}
			if !errors.Is(err, agent.ErrInvalidConfig) {
				t.Fatalf("CheckProfiles: %v, want ErrInvalidConfig", err)
			}
			for _, want := range []string{`profiles.p.tools[0].` + tt.refused + `: tool "find": `, "parameters.required", `"--"`} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("CheckProfiles: %v\nwant it to say %s", err, want)
				}
			}
		})
	}
}
