// Package harness is what every test tree shares (test/e2e, test/bench, test/cluster,
// test/faults and the packages' own tests): the one wait, Wait (Poll for code without a
// testing.T), with a timeout that grows on CI and on a loaded machine; LogBuffer, the locked
// buffer a worker writes while a test reads; Env, an environment a command is given instead of
// the process's; Process, a worker run as a child process whose readiness is its
// --ready-file; and ProcessTree and ProcStat, a process's descendants and state from /proc,
// for the tests that look for what a worker or a sandbox left running. It imports nothing of
// Boxcar, so any package's tests can use it; test/testworker starts a worker in-process from
// a typed config.
//
// Only tests and the test programs import it: depguard keeps test/... out of the binaries.
package harness
