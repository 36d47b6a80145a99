package harness

import (
	"maps"
	"os"
)

// Env is an environment given to a command (workercmd, submitcmd) in place of the process's:
// the commands read nothing else, so tests with different ones run side by side.
type Env map[string]string

// Getenv reads e; a nil Env reads nothing.
func (e Env) Getenv(k string) string { return e[k] }

// With is a copy of e with the pairs kv (key, value, key, value …) added.
func (e Env) With(kv ...string) Env {
	c := maps.Clone(e)
	if c == nil {
		c = Env{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		c[kv[i]] = kv[i+1]
	}
	return c
}

// List is e as KEY=value pairs, for exec.Cmd.Env.
func (e Env) List() []string {
	l := make([]string, 0, len(e))
	for k, v := range e {
		l = append(l, k+"="+v)
	}
	return l
}

// ProcessEnv is the process's environment, for a child process that should see it: PATH and
// the rest, with e's pairs last (they win).
func (e Env) ProcessEnv() []string { return append(os.Environ(), e.List()...) }
