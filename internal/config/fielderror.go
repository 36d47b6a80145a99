package config

import (
	"fmt"
	"strconv"
)

// FieldError is one problem of a config: where it is in the file, which key, and what is
// wrong. Load and Parse give every FieldError a place; one made by a later check (Validate on a
// Config built in code, the agent's checks of the tools) has none until Source.Place gives it
// one. errors.Is(err, ErrInvalid) holds, or Err when set.
type FieldError struct {
	File         string // the config file; empty from Parse
	Line, Column int    // 1-based; 0 when not placed (yet)
	Path         string // the key path, e.g. profiles.analyst.sandbox.memory or tools[0].name
	Msg          string // what is wrong, and the fix where there is one
	Err          error  // the sentinel it is; nil means ErrInvalid
}

// Error is "file:line:col path: message" once placed, else "invalid config: path: message".
func (e *FieldError) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%v: %s: %s", e.sentinel(), e.Path, e.Msg)
	}
	loc := e.File
	if loc != "" {
		loc += ":"
	}
	loc += strconv.Itoa(e.Line)
	if e.Column > 0 {
		loc += ":" + strconv.Itoa(e.Column)
	}
	if e.Path == "" {
		return loc + ": " + e.Msg
	}
	return loc + " " + e.Path + ": " + e.Msg
}

func (e *FieldError) sentinel() error {
	if e.Err != nil {
		return e.Err
	}
	return ErrInvalid
}

// Unwrap is the sentinel: ErrInvalid, or Err when set.
func (e *FieldError) Unwrap() error { return e.sentinel() }
