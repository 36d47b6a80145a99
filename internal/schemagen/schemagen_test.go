package schemagen_test

import (
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/schemagen"
)

type inner struct {
	N int `json:"n,omitempty"`
}

type doc struct {
	Name  string           `json:"name"`
	Items []inner          `json:"items,omitempty"`
	ByKey map[string]inner `json:"by_key,omitempty"`
	Opt   *inner           `json:"opt,omitempty"`
}

// TestRuleForAMissingPathFails: a rule whose field was renamed or removed is an error, not a
// rule that silently stops applying.
func TestRuleForAMissingPathFails(t *testing.T) {
	_, err := schemagen.Generate(doc{}, schemagen.Options{Rules: map[string]schemagen.Schema{"items[].m": {"minimum": 0}}})
	if err == nil || !strings.Contains(err.Error(), "items[].m") {
		t.Fatalf("Generate: %v, want an error naming items[].m", err)
	}
}

func TestStructure(t *testing.T) {
	s, err := schemagen.Generate(doc{}, schemagen.Options{
		Rules: map[string]schemagen.Schema{"items[].n": {"minimum": 1}, "by_key.*.n": {"maximum": 9}},
		Omit:  []string{"opt"},
	})
	if err != nil {
		t.Fatal(err)
	}
	props := s["properties"].(schemagen.Schema)
	if got := s["required"].([]any); len(got) != 1 || got[0] != "name" {
		t.Errorf("required = %v, want [name]", got)
	}
	if s["additionalProperties"] != false {
		t.Error("unknown keys are allowed")
	}
	if _, ok := props["opt"]; ok {
		t.Error("the omitted field is still there")
	}
	item := props["items"].(schemagen.Schema)["items"].(schemagen.Schema)["properties"].(schemagen.Schema)["n"].(schemagen.Schema)
	if item["type"] != "integer" || item["minimum"] != 1 {
		t.Errorf("items[].n = %v", item)
	}
	val := props["by_key"].(schemagen.Schema)["additionalProperties"].(schemagen.Schema)["properties"].(schemagen.Schema)["n"].(schemagen.Schema)
	if val["maximum"] != 9 {
		t.Errorf("by_key.*.n = %v", val)
	}
}
