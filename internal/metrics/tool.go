package metrics

// Outcomes of one tool call, the values of boxcar_tool_calls_total's outcome label.
const (
	ToolOK          = "ok"           // ran and exited 0
	ToolNonzeroExit = "nonzero_exit" // ran and exited non-zero
	ToolTimedOut    = "timed_out"    // ran into its timeout and was killed
	ToolError       = "error"        // did not run: invalid arguments, denied, unknown tool, sandbox failure
)

// ToolOutcome classifies one tool call from what the agent recorded about it: its exit code,
// whether it timed out, and the error that kept it from running (empty when it ran).
func ToolOutcome(exitCode int, timedOut bool, errMsg string) string {
	switch {
	case timedOut:
		return ToolTimedOut
	case errMsg != "":
		return ToolError
	case exitCode != 0:
		return ToolNonzeroExit
	}
	return ToolOK
}
