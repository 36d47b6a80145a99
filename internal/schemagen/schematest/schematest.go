// Package schematest compiles generated schemas the way Helm compiles a chart's
// values.schema.json (santhosh-tekuri/jsonschema v6), for the tests that hold a schema to the
// Go code it restates.
package schematest

import (
	"bytes"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/yaml"

	"github.com/boxcar-run/boxcar/internal/schemagen"
)

// Compile returns a validator for s, read as draft-07 when it names no $schema, as the
// published schemas do.
func Compile(t testing.TB, s schemagen.Schema) *jsonschema.Schema {
	t.Helper()
	data, err := schemagen.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	if err := c.AddResource("file:///schema.json", doc); err != nil {
		t.Fatal(err)
	}
	v, err := c.Compile("file:///schema.json")
	if err != nil {
		t.Fatalf("the generated schema does not compile: %v", err)
	}
	return v
}

// ValidateYAML checks a YAML (or JSON) document against v as a tool reading the YAML would.
func ValidateYAML(v *jsonschema.Schema, doc []byte) error {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		return err
	}
	return v.Validate(inst)
}
