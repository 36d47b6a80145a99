package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ProcessTree is pid and its descendants, parents first, read from /proc: each thread's
// children (/proc/<pid>/task/*/children), as a process forked from any of them is listed only
// there. A process that exits during the walk is left out with its children.
func ProcessTree(pid int) []int {
	out := []int{pid}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, c := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(c); err == nil {
				out = append(out, ProcessTree(n)...)
			}
		}
	}
	return out
}

// ProcStat is the fields of /proc/<pid>/stat after the command's closing parenthesis (the
// command may hold spaces and parentheses of its own): [0] the state, [1] the parent's pid,
// [19] the start time. Nil once the process is gone.
func ProcStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}
