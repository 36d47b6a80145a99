//go:build race

package bench_test

// raceEnabled: the race detector multiplies a process's memory, so absolute memory targets
// are not checked under it.
const raceEnabled = true
