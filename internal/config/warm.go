package config

import (
	"fmt"
	"time"
)

// Warm keeps sandboxes of a profile started ahead of its jobs (internal/pool). Each warm
// sandbox serves exactly one job and is then removed; the pool follows the queue's lag within
// Min and Max and never holds more sandboxes than the worker has free slots.
type Warm struct {
	// Min is how many warm sandboxes are kept however idle the queue is. Default: 0.
	Min int `json:"min,omitempty"`
	// Max bounds the warm sandboxes of the profile. Default: 0, the worker's concurrency.
	Max int `json:"max,omitempty"`
	// Idle is how long the pool keeps more than the queue asks for before it drains towards
	// Min. Default: 2m.
	Idle Duration `json:"idle,omitempty"`
	// MaxAge replaces a warm sandbox nobody claimed within it. Default: 30m.
	MaxAge Duration `json:"max_age,omitempty"`
}

// withDefaults fills the warm settings' defaults.
func (w Warm) withDefaults() Warm {
	def(&w.Idle, Duration(2*time.Minute))
	def(&w.MaxAge, Duration(30*time.Minute))
	return w
}

// validate reports what no pool can honour.
func (w Warm) validate(field func(string) string) []error {
	var errs []error
	bad := func(f, format string, args ...any) {
		errs = append(errs, &FieldError{Path: field("warm." + f), Msg: fmt.Sprintf(format, args...)})
	}
	if w.Min < 0 || w.Max < 0 {
		bad("min", "min %d and max %d must not be negative", w.Min, w.Max)
	}
	if w.Max > 0 && w.Min > w.Max {
		bad("min", "%d is above max %d; lower min or raise max", w.Min, w.Max)
	}
	if w.Idle <= 0 {
		bad("idle", "must be positive, such as 2m")
	}
	if w.MaxAge <= 0 {
		bad("max_age", "must be positive, such as 30m")
	}
	return errs
}
