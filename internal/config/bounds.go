package config

import (
	"fmt"
	"reflect"
	"strings"
	"time"
)

// MaxDuration is the longest duration any key of the config takes: ten years. The worker adds
// and doubles durations (an attempt may hold its slot twice its job_timeout, gc waits a
// job_timeout plus the ack wait), and a sum past time.Duration's 292 years wraps round to a
// deadline in the past, which would end a job at once or never.
const MaxDuration = 10 * 365 * 24 * time.Hour

// valueRule is one rule every key of a kind obeys wherever it is in the config; a key a
// specific check of Validate already names is not named again.
type valueRule struct {
	applies func(v reflect.Value, key string) bool
	problem func(reflect.Value) string // "" when the value is fine
}

// signedKeys are the integers of the config that are not counts or sizes: a model's seed may be
// any integer.
var signedKeys = map[string]bool{"seed": true}

// NoRetries is the model.max_retries that turns the model client's retries off: 0 takes the
// default (3), as every unset key does.
const NoRetries = -1

// valueRules hold for every duration and every integer of the config but signedKeys: none is a
// count, a size or a time that may be negative (but max_retries' NoRetries), and no duration
// may be long enough to wrap.
var valueRules = []valueRule{
	{
		applies: func(_ reflect.Value, key string) bool { return key == "max_retries" },
		problem: func(v reflect.Value) string {
			if v.Int() < NoRetries {
				return fmt.Sprintf("%d is below %d; give the number of retries, %d for none, or leave it unset for the default", v.Int(), NoRetries, NoRetries)
			}
			return ""
		},
	},
	{
		applies: func(v reflect.Value, _ string) bool { return v.Type() == reflect.TypeFor[Duration]() },
		problem: func(v reflect.Value) string {
			d := time.Duration(v.Int())
			switch {
			case d < 0:
				return fmt.Sprintf("%s is negative; give a positive duration such as 90s, or leave it unset for the default", d)
			case d > MaxDuration:
				return fmt.Sprintf("%s is longer than %s (10 years), the longest duration the worker takes; give a shorter one", d, MaxDuration)
			}
			return ""
		},
	},
	{
		applies: func(v reflect.Value, key string) bool {
			return v.Kind() >= reflect.Int && v.Kind() <= reflect.Int64 && !signedKeys[key]
		},
		problem: func(v reflect.Value) string {
			if v.Int() < 0 {
				return fmt.Sprintf("%d is negative; give a positive number, or leave it unset for the default", v.Int())
			}
			return ""
		},
	},
}

// checkValues walks v (a config struct) and reports each key that breaks a valueRule, unless
// covered says a specific check already reported it.
func checkValues(v reflect.Value, path string, covered func(string) bool) []error {
	key := path[strings.LastIndexAny(path, ".]")+1:]
	for _, r := range valueRules {
		if r.applies(v, key) {
			if msg := r.problem(v); msg != "" && !covered(path) {
				return []error{&FieldError{Path: path, Msg: msg}}
			}
			return nil
		}
	}
	var errs []error
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			errs = checkValues(v.Elem(), path, covered)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if name := fieldName(v.Type().Field(i)); name != "" {
				errs = append(errs, checkValues(v.Field(i), join(path, name), covered)...)
			}
		}
	case reflect.Map:
		iter := v.MapRange()
		for iter.Next() {
			errs = append(errs, checkValues(iter.Value(), join(path, iter.Key().String()), covered)...)
		}
	case reflect.Slice:
		for i := range v.Len() {
			errs = append(errs, checkValues(v.Index(i), fmt.Sprintf("%s[%d]", path, i), covered)...)
		}
	}
	return errs
}

// namedIn says whether a key path is already named by one of errs: the same key, or a key
// that encloses it (a check of "nats" speaks for nats.ack_wait).
func namedIn(errs []error) func(string) bool {
	return func(path string) bool {
		for _, err := range errs {
			fe, ok := err.(*FieldError) //nolint:errorlint // Validate's own errors, never wrapped
			if !ok {
				continue
			}
			if fe.Path == path || strings.HasPrefix(path, fe.Path+".") || strings.HasPrefix(path, fe.Path+"[") {
				return true
			}
		}
		return false
	}
}
