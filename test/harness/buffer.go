package harness

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"sync"
)

// LogBuffer is a buffer a command writes (a worker's log, its stdout) while the test reads it.
// The zero value is ready to use.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Count is how many times re matches what was written so far.
func (b *LogBuffer) Count(re *regexp.Regexp) int { return len(re.FindAllString(b.String(), -1)) }

// Record returns string field key of the first JSON log record with message msg.
func (b *LogBuffer) Record(msg, key string) (string, bool) { return Record(b.String(), msg, key) }

// Record returns string field key of the first JSON log record in log with message msg.
func Record(log, msg, key string) (string, bool) {
	for line := range strings.SplitSeq(log, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			if v, ok := rec[key].(string); ok {
				return v, true
			}
		}
	}
	return "", false
}

// Bytes is a copy of everything written so far.
func (b *LogBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}
