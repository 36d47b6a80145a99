package config_test

import (
	"errors"
	"testing"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/config"
)

func TestExampleConfigParses(t *testing.T) {
	cfg, err := config.Parse(examples.Config)
	if err != nil {
		t.Fatalf("examples/boxcar.yaml: %v", err)
	}
	p, err := cfg.Profile("csv-analyst")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(p.Tools); got != 4 {
		t.Errorf("csv-analyst has %d tools, want 4", got)
	}
	if p.Tools[3].Kind != config.ToolCommand {
		t.Errorf("csv_stats kind = %q, want command", p.Tools[3].Kind)
	}
	if _, err := cfg.Profile("nope"); !errors.Is(err, config.ErrUnknownProfile) {
		t.Errorf("unknown profile error = %v, want ErrUnknownProfile", err)
	}
}
