package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// TestAuditProfileNamesAJobCanName: every profile a config defines can be named by a job: the
// worker refuses at load a profile name that job.Validate (and so `submit run --profile`)
// refuses, instead of starting with a profile no job can ever reach, and granting it to tenants.
func TestAuditProfileNamesAJobCanName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"web research", "-dash", "analyse/csv", "análisis", strings.Repeat("p", 129)} {
		t.Run(name[:min(len(name), 12)], func(t *testing.T) {
			t.Parallel()
			yaml := "profiles:\n  \"" + name + "\":\n    model: {name: m}\n    tools: [{name: read_file}]\n" +
				"tenants:\n  team-a: {profiles: [\"" + name + "\"]}\n"
			_, err := config.Parse([]byte(yaml))
			j := job.Job{Version: job.Version, ID: job.NewID(), Profile: name, Task: "t", SubmittedAt: time.Now()}
			jerr := j.Validate()
			if err == nil && jerr != nil {
				t.Errorf("the config loads with profile %q, which no job can name: %v", name, jerr)
			}
		})
	}
}
