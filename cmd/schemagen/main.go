// Command schemagen writes the repository's JSON Schemas from the Go types they describe:
// schema/worker-config.schema.json (the worker's --config file), schema/job.schema.json (the
// job message) and the "config" part of the Helm chart's values.schema.json, so `helm install`
// refuses what the worker would refuse at start. Run it with `go generate ./cmd/schemagen`;
// its test fails when a checked-in file differs from what it writes.
package main

//go:generate go run . -root ../..

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/jobschema"
	"github.com/boxcar-run/boxcar/internal/schemagen"
)

// The files schemagen writes, relative to the repository root.
const (
	workerConfigFile = "schema/worker-config.schema.json"
	jobFile          = "schema/job.schema.json"
	valuesFile       = "deploy/helm/boxcar/values.schema.json"
)

// chartSets are the worker config fields the chart writes itself (worker_id is each pod's
// name, signing_key comes from signing): values that set them are refused.
var chartSets = []string{"worker_id", "metrics_addr", "drain_grace", "signing_key", "sandbox"}

func main() {
	root := flag.String("root", ".", "repository root")
	flag.Parse()
	files, err := generate(*root)
	if err == nil {
		for name, data := range files {
			if err = os.WriteFile(filepath.Join(*root, name), data, 0o644); err != nil {
				break
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}

// generate returns every file's new contents; values.schema.json is read from root and only
// its properties.config replaced.
func generate(root string) (map[string][]byte, error) {
	worker, err := schemagen.Generate(config.Config{}, workerOptions())
	if err != nil {
		return nil, err
	}
	worker["$schema"] = "http://json-schema.org/draft-07/schema#"
	worker["title"] = "Boxcar worker config (worker --config)"
	worker["description"] = "The worker's YAML config. Unknown keys are errors; a field left out or written as its zero value takes its default."

	js, err := jobschema.Schema()
	if err != nil {
		return nil, err
	}

	chartConfig, err := chartConfigSchema()
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(root, valuesFile))
	if err != nil {
		return nil, err
	}
	var values schemagen.Schema
	if err := json.Unmarshal(raw, &values); err != nil {
		return nil, fmt.Errorf("%s: %w", valuesFile, err)
	}
	props, ok := values["properties"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s has no properties", valuesFile)
	}
	props["config"] = chartConfig
	// The chart's NetworkPolicy values (networkPolicy.exceptCIDRs, each peer's ipBlock) refer to
	// it: a CIDR the config's keys would refuse renders a policy the API server refuses.
	values["definitions"] = map[string]any{"cidr": config.CIDRSchema()}

	out := map[string][]byte{}
	for name, s := range map[string]schemagen.Schema{workerConfigFile: worker, jobFile: js, valuesFile: values} {
		if out[name], err = schemagen.Marshal(s); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// workerOptions are config's schema rules plus the tool kinds' from the agent's registry,
// which config cannot import: everything the worker checks at start.
func workerOptions() schemagen.Options {
	o := config.SchemaOptions()
	o.Rules["profiles.*.tools[]"] = agent.ToolSchema()
	return o
}

// chartConfigSchema is the worker config as the chart's values take it: without the fields
// the chart sets, and with an object store the pods can reach.
func chartConfigSchema() (schemagen.Schema, error) {
	o := workerOptions()
	o.Omit = chartSets
	o.Rules["store"] = schemagen.Schema{"required": []any{"url"}}
	o.Rules["store.url"] = schemagen.Schema{"pattern": "^(s3|file)://", "description": "s3://bucket[/prefix], or file:///path on a volume every worker mounts."}
	s, err := schemagen.Generate(config.Config{}, o)
	if err != nil {
		return nil, err
	}
	s["required"] = []any{"profiles", "store"}
	s["description"] = "The worker config (see docs/configuration.md), checked by the same rules as worker --config. " +
		"worker_id, metrics_addr, drain_grace, signing_key and sandbox are the chart's to set."
	return s, nil
}
