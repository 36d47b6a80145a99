package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/boxcar-run/boxcar/internal/job"
)

// Tool results. Every tool call is answered with exactly one JSON object in the content of the
// tool message whose tool_call_id is the call's id. The shapes are a contract (the demo model
// in internal/demomodel reads them):
//
//	command tools and shell: {"exit_code":0,"timed_out":false,"stdout":"…","stderr":"…",
//	                          "stdout_truncated":false,"stderr_truncated":false}
//	                          plus "error" when the command ran but the sandbox reports a
//	                          problem with it (the workdir over its disk bound)
//	list_files:              {"path":".","files":[{"path":"sales.csv","size":123}],"truncated":false}
//	                          plus "unreadable":[{"path":"…","reason":"…"}] (and
//	                          "unreadable_more":N) naming folders the sandbox could not list
//	read_file:               {"path":"a.txt","size":9000,"offset":0,"content":"…","truncated":true,"next_offset":8192}
//	write_file:              {"path":"report.md","written":1234}
//	any failure:             {"error":"…"}
//
// Errors start with a fixed phrase: `tool "x" not found`, `invalid arguments: …`,
// `path … outside the workdir`, `refused: …` (shell policy), `not run: …` (a cap was reached),
// `failed: …` (the sandbox could not do it). A stream longer than the profile's
// max_output_bytes, counted as the model gets it in the JSON (jsonLen), keeps its head and tail
// around a marker "\n…[N bytes cut]…\n" and sets its *_truncated flag; a flag is also set when
// the sandbox itself discarded output. Tool output is data: nothing in it changes the loop, the
// tools or the policy.

// tool is one tool offered to the model.
type tool interface {
	// Definition names the tool and describes its arguments as a JSON Schema object.
	Definition() definition
	// Call runs the tool with arguments that have already been checked against the schema.
	Call(ctx context.Context, callID string, args json.RawMessage) result
}

// definition is what the model is told about a tool.
type definition struct {
	Name        string
	Description string
	Parameters  map[string]any
}

// result is what one tool call produced.
type result struct {
	model     any // the one JSON object the model sees
	full      any // the transcript's version with complete output; nil means model
	exitCode  int // the command's exit code; 0 for file tools; -1 when nothing ran
	timedOut  bool
	truncated bool
	err       string // set when the call failed; also in model as {"error":…}

	// For the transcript: the argv of a command tool or the shell, run or refused; and, when
	// the command ran, its run time and the digests of its streams as the sandbox captured
	// them.
	argv           []string
	ran            bool
	execDuration   time.Duration
	stdout, stderr streamDigest
	approvalWait   time.Duration // shell "ask": time spent waiting for a person
	approval       *job.Approval // shell: how the policy decided the command

	// detail is the sandbox's error behind err, for the worker's log only: its words may name
	// the host's paths (execProblems).
	detail error

	// lost is the sandbox's loss (sandbox.ErrSandboxLost) when the call found it gone: the run
	// ends with it, since no later call could do anything (lostSandbox).
	lost error
}

type errorResult struct {
	Error string `json:"error"`
}

// maxErrorBytes bounds the error message of a failed call. Messages quote what the model
// sent (a path, a command line), which may be megabytes long: head and tail are kept.
const maxErrorBytes = 1024

// failure is a result that tells the model what went wrong.
func failure(format string, args ...any) result {
	msg, _ := clip([]byte(fmt.Sprintf(format, args...)), maxErrorBytes)
	return result{model: errorResult{Error: msg}, exitCode: -1, err: msg}
}

// lostSandbox is the result of a call that found the sandbox gone from outside: the model is
// told, for the transcript, but the run ends with err (callTool) rather than letting the model
// go on without a workdir and call its answer a result.
func lostSandbox(err error) result {
	res := failure("failed: the sandbox was lost: %v", err)
	res.lost = err
	return res
}

// toolset is the registry of one run: the profile's compiled tools bound to the run's sandbox.
type toolset struct {
	order  []string
	byName map[string]toolEntry
}

type toolEntry struct {
	tool   tool
	def    definition
	schema *jsonschema.Schema
}

// definitions returns the tools in the form the chat API takes, in profile order.
func (ts *toolset) definitions() []openai.ChatCompletionToolUnionParam {
	defs := make([]openai.ChatCompletionToolUnionParam, 0, len(ts.order))
	for _, name := range ts.order {
		d := ts.byName[name].def
		fn := shared.FunctionDefinitionParam{Name: d.Name, Parameters: d.Parameters}
		if d.Description != "" {
			fn.Description = openai.String(d.Description)
		}
		defs = append(defs, openai.ChatCompletionFunctionTool(fn))
	}
	return defs
}

// declared returns name when the profile declares a tool of that name, else UnknownTool.
func (ts *toolset) declared(name string) string {
	if _, ok := ts.byName[name]; ok {
		return name
	}
	return UnknownTool
}

// call looks the tool up, checks the arguments against its schema and runs it.
func (ts *toolset) call(ctx context.Context, callID, name, args string) result {
	e, ok := ts.byName[name]
	if !ok {
		return failure("tool %q not found; the tools are %s", name, strings.Join(ts.order, ", "))
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(args))
	if err != nil {
		return failure("invalid arguments: not valid JSON: %v", err)
	}
	if _, ok := v.(map[string]any); !ok {
		return failure("invalid arguments: must be a JSON object")
	}
	if err := checkNumbers(v); err != nil {
		return failure("invalid arguments: %v", err)
	}
	if err := e.schema.Validate(v); err != nil {
		return failure("invalid arguments: %s", describeValidation(err))
	}
	return e.tool.Call(ctx, callID, json.RawMessage(args))
}

// Bounds on a number in a call's arguments: what a tool can take is an int64 or a float64. The
// schema validator works out the exact value of each number it checks (an integer, a bound, an
// enum) as a big.Rat, in the worker's time: 1e999999 took a quarter of a second of a core, and
// one call may hold a hundred thousand of them; and a reader of the transcript that takes its
// numbers as float64 cannot read a line that holds one past its range.
const (
	maxNumberBytes = 64
	maxExponent    = 400
)

// checkNumbers refuses a number of v (arguments as jsonschema.UnmarshalJSON reads them, each
// number a json.Number) past maxNumberBytes, maxExponent or float64's range.
func checkNumbers(v any) error {
	switch v := v.(type) {
	case json.Number:
		return checkNumber(string(v))
	case map[string]any:
		for _, e := range v {
			if err := checkNumbers(e); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range v {
			if err := checkNumbers(e); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkNumber(s string) error {
	if len(s) > maxNumberBytes {
		return fmt.Errorf("a number of %d characters (%s…), more than the %d a tool can take", len(s), s[:16], maxNumberBytes)
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		if exp, err := strconv.Atoi(s[i+1:]); err != nil || exp > maxExponent || exp < -maxExponent {
			return fmt.Errorf("the number %s is past what a tool can take: its exponent is more than %d either way", s, maxExponent)
		}
	}
	// Within the exponent's bound a number can still be past float64's range (1e309,
	// 100000000000e300), which a reader of the transcript cannot take.
	if f, _ := strconv.ParseFloat(s, 64); math.IsInf(f, 0) {
		return fmt.Errorf("the number %s is past what a tool can take: more than %g either way", s, math.MaxFloat64)
	}
	return nil
}

// describeValidation turns a schema validation error into one line that names each failing
// location.
func describeValidation(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	var leaves []string
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			leaves = append(leaves, e.Error())
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	const maxLeaves = 5
	if len(leaves) > maxLeaves {
		leaves = append(leaves[:maxLeaves], fmt.Sprintf("and %d more", len(leaves)-maxLeaves))
	}
	return strings.Join(leaves, "; ")
}

// schemaCache compiles each distinct parameter schema once and keeps it for later runs. Its
// size is bounded by the schemas the host's profiles declare.
type schemaCache struct {
	mu      sync.Mutex
	schemas map[string]*jsonschema.Schema
}

func (c *schemaCache) compile(params map[string]any) (*jsonschema.Schema, error) {
	if params == nil {
		params = map[string]any{"type": "object"}
	}
	key, err := json.Marshal(params) // map keys are sorted: equal schemas give equal keys
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.schemas[string(key)]; ok {
		return s, nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(key))
	if err != nil {
		return nil, err
	}
	comp := jsonschema.NewCompiler()
	comp.UseLoader(noLoader{}) // a schema may not pull in files or URLs
	const loc = "urn:boxcar:tool-parameters"
	if err := comp.AddResource(loc, doc); err != nil {
		return nil, err
	}
	s, err := comp.Compile(loc)
	if err != nil {
		return nil, err
	}
	if c.schemas == nil {
		c.schemas = map[string]*jsonschema.Schema{}
	}
	c.schemas[string(key)] = s
	return s, nil
}

type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema reference %s: only references inside the schema are allowed", url)
}

// clip returns b as a string when it fits in max bytes as the model gets it, inside a JSON
// string (jsonLen). A longer b keeps its head and tail around a marker "\n…[N bytes cut]…\n",
// N counting b's own bytes, cut between UTF-8 characters, all within max bytes in JSON.
func clip(b []byte, max int) (string, bool) {
	s := string(b)
	if jsonLen(s) <= max {
		return s, false
	}
	// The marker's N is less than len(s): room for the marker of len(s) is room enough.
	keep := max - jsonLen(cutMarker(len(s)))
	if keep <= 0 {
		return jsonHead(s, max), true // no room for the marker
	}
	head := jsonHead(s, keep-keep/2)
	tail := jsonTail(s[len(head):], keep/2)
	return head + cutMarker(len(s)-len(head)-len(tail)) + tail, true
}

func cutMarker(n int) string { return fmt.Sprintf("\n…[%d bytes cut]…\n", n) }
