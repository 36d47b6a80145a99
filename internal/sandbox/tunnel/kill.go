package tunnel

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// killRounds bounds kill's rounds: each stops and kills all it found, so only processes forked
// while a round read /proc survive it, and a round finds fewer of those each time.
const killRounds = 50

// kill kills every process whose environment holds mark (NAME=VALUE), until none is left. It
// runs in the pod's side and starts no process: it reads /proc and sends signals, which need
// no free slot in the pod's process bound. The processes found are all stopped, then all
// killed: killed one by one, the rest of a fork bomb would keep forking in the gaps.
func kill(mark string) {
	for range killRounds {
		pids := marked([]byte(mark))
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGSTOP)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// marked lists the processes whose environment holds mark. A process that has exited (a
// zombie included) has no environment left to read and is not listed.
func marked(mark []byte) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		for entry := range bytes.SplitSeq(env, []byte{0}) {
			if bytes.Equal(entry, mark) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}
