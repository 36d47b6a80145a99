//go:build !race

package bench_test

const raceEnabled = false
