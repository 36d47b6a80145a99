package queue

import (
	"context"
	"fmt"
	"time"
)

// DuplicateWindow is the job stream's duplicate window as the server holds it: a job id
// published again inside it is dropped. Clients that retry a publish stay inside it.
func (q *Queue) DuplicateWindow(ctx context.Context) (time.Duration, error) {
	s, err := q.js.Stream(ctx, q.cfg.Stream)
	if err != nil {
		return 0, fmt.Errorf("queue: look up stream %s: %w", q.cfg.Stream, err)
	}
	return s.CachedInfo().Config.Duplicates, nil
}
