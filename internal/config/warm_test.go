package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
)

const (
	warmProfile   = "profiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n"
	secondProfile = "  q:\n    model: {name: m}\n    tools: [{name: read_file}]\n"
)

func TestWarmDefaultsAndDecode(t *testing.T) {
	cfg, err := config.Parse([]byte(warmProfile + "    warm: {min: 1, max: 4}\n"))
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Profiles["p"].Warm
	if w == nil || w.Min != 1 || w.Max != 4 || w.Idle.Std() != 2*time.Minute || w.MaxAge.Std() != 30*time.Minute {
		t.Errorf("warm = %+v, want min 1, max 4, idle 2m, max_age 30m", w)
	}
	cfg, err = config.Parse([]byte(warmProfile))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Profiles["p"].Warm != nil {
		t.Errorf("a profile without warm has %+v, want none", cfg.Profiles["p"].Warm)
	}
}

func TestWarmInvalid(t *testing.T) {
	tests := []struct {
		name, warm, wantField string
	}{
		{"min above max", "{min: 3, max: 2}", "profiles.p.warm.min"},
		{"negative", "{min: -1}", "profiles.p.warm.min"},
		{"zero-length idle", "{idle: 0s}", ""}, // 0 means the default
		{"negative idle", "{idle: -1s}", "profiles.p.warm.idle"},
		{"negative max_age", "{max_age: -5m}", "profiles.p.warm.max_age"},
		{"unknown key", "{size: 3}", "profiles.p.warm.size"},
		{"a minimum no tenant may take", "{min: 2}\n" + secondProfile + "tenants:\n  a: {profiles: [q]}", "profiles.p.warm.min"},
		{"no minimum, no tenant: nothing kept", "{max: 2}\n" + secondProfile + "tenants:\n  a: {profiles: [q]}", ""},
		{"a minimum a tenant takes", "{min: 2}\n" + secondProfile + "tenants:\n  a: {profiles: [q]}\n  b: {profiles: [p]}", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Parse([]byte(warmProfile + "    warm: " + tt.warm + "\n"))
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			if !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("Parse: %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.wantField) {
				t.Errorf("Parse: %v\nwant the field %s named", err, tt.wantField)
			}
		})
	}
}
