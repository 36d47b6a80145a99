// Package examples holds the example worker configuration and input that `make demo` uses and
// that `worker --embedded` falls back to when it is given no --config.
package examples

import _ "embed"

// Config is boxcar.yaml: the example worker configuration with the csv-analyst profile.
//
//go:embed boxcar.yaml
var Config []byte

// SalesCSV is the example input file.
//
//go:embed sales.csv
var SalesCSV []byte
