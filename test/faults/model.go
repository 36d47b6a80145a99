//go:build faults

package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
)

// The model outage: 3 minutes, well past the ~90 s in which a worker without the breaker
// dead-lettered every job; here AckWait is 5s and max_deliver 3, so it is 36 AckWaits and many
// times the retries of a job (1s, 2s backoff), and within csv-analyst's job_timeout of 5m, which
// bounds how long a held job waits.
const (
	outageJobs   = 20
	outageFor    = 3 * time.Minute
	outageRunFor = 4 // jobs running when the model stops
)

// modelOutage stops the model while outageJobs are queued and some run, keeps it down for
// outageFor, and starts it again on its address. It returns the ids of the jobs it
// submitted, and checks them once they end: none dead, every one committed at its first
// delivery with the turns a job spends without an outage, and boxcar_model_up read 0 on both
// workers meanwhile. The failures it counts are returned in wrong.
func (h *harness) modelOutage() (ids []string, wrong int, err error) {
	stamp := time.Now().UTC().Format("150405")
	// What a job spends without an outage, measured now on the same workers.
	base := fmt.Sprintf("faults-model-%s-base", stamp)
	if err := h.submitWaves([]string{base}, 0); err != nil {
		return nil, 0, err
	}
	if err := h.drain([]string{base}); err != nil {
		return nil, 0, fmt.Errorf("the job before the model outage: %w", err)
	}
	st, err := h.statuses(base)
	if err != nil {
		return nil, 0, err
	}
	turns := st[base].SpentTurns
	if st[base].State != job.StateSucceeded || turns == 0 {
		return nil, 0, fmt.Errorf("the job before the model outage ended %s with %d turns: %s", st[base].State, turns, st[base].Error)
	}

	for i := range outageJobs {
		ids = append(ids, fmt.Sprintf("faults-model-%s-%02d", stamp, i))
	}
	if err := h.submitWaves(ids, 0); err != nil {
		return nil, 0, err
	}
	if err := poll(2*time.Minute, fmt.Sprintf("%d of the outage's jobs to run", outageRunFor), func() bool {
		st, err := h.statuses(ids...)
		running := 0
		for _, s := range st {
			if s.State == job.StateRunning {
				running++
			}
		}
		return err == nil && running >= outageRunFor
	}); err != nil {
		return ids, 0, err
	}
	h.faults++
	fmt.Fprintf(os.Stderr, "faults: stop the model for %s with %d jobs queued or running\n", outageFor, outageJobs)
	h.model.Kill()
	stopped := time.Now()
	down, readyz := h.watchModelDown(stopped.Add(outageFor))
	time.Sleep(time.Until(stopped.Add(outageFor)))
	if err := h.restartModel(); err != nil {
		return ids, 0, err
	}
	if err := h.drain(ids); err != nil {
		return ids, 0, fmt.Errorf("after the model came back: %w", err)
	}
	return ids, h.checkOutage(ids, turns, down, readyz), nil
}

// watchModelDown polls each worker's boxcar_model_up and /readyz until, and reports whether
// each read 0 and said the model was down before deadline.
func (h *harness) watchModelDown(deadline time.Time) (down, readyz [2]bool) {
	for time.Now().Before(deadline) && !(down[0] && down[1] && readyz[0] && readyz[1]) {
		for i := range h.workers {
			base := h.metricsURL(i)
			if base == "" {
				continue
			}
			down[i] = down[i] || strings.Contains(get(base+"/metrics"), "\nboxcar_model_up 0\n")
			readyz[i] = readyz[i] || strings.Contains(get(base+"/readyz"), "model: model endpoint down since")
		}
		time.Sleep(200 * time.Millisecond)
	}
	return down, readyz
}

// checkOutage counts what the outage's jobs broke: a dead job, a second delivery, turns other
// than a job's without the outage, a worker that did not report the model down.
func (h *harness) checkOutage(ids []string, turns int, down, readyz [2]bool) int {
	wrong := 0
	fail := func(format string, args ...any) {
		wrong++
		fmt.Fprintf(os.Stderr, "faults: MODEL "+format+"\n", args...)
	}
	st, err := h.statuses(ids...)
	if err != nil {
		fail("read the statuses of the outage's jobs: %v", err)
		return wrong
	}
	committed, spent := 0, 0
	for _, id := range ids {
		s := st[id]
		spent += s.SpentTurns
		switch {
		case s.State != job.StateSucceeded:
			fail("%s ended %s (attempt %d): %s", id, s.State, s.Attempt, s.Error)
		case s.Attempt != 1:
			fail("%s succeeded at attempt %d: the outage spent a delivery", id, s.Attempt)
		case s.SpentTurns != turns:
			fail("%s spent %d turns, a job without the outage %d", id, s.SpentTurns, turns)
		default:
			committed++
		}
	}
	for i := range h.workers {
		if !down[i] || !readyz[i] {
			fail("worker %d: boxcar_model_up read 0: %v, /readyz said the model was down: %v", i, down[i], readyz[i])
		}
	}
	fmt.Fprintf(os.Stderr, "faults: model outage %s: %d jobs, %d committed at their first delivery, %d turns (%d without the outage: %d), model_up 0 on workers %v\n",
		outageFor, len(ids), committed, spent, len(ids), len(ids)*turns, down)
	return wrong
}

// restartModel starts the demo model again on the address it had: the workers' proxy points
// there.
func (h *harness) restartModel() error {
	u, err := url.Parse(h.modelURL)
	if err != nil {
		return err
	}
	for i, a := range h.model.Args {
		if a == "--addr" {
			h.model.Args[i+1] = u.Host
		}
	}
	if err := h.model.Start(context.Background()); err != nil {
		return err
	}
	return poll(30*time.Second, "the demo model to listen again", func() bool {
		c, err := net.DialTimeout("tcp", u.Host, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

var metricsListening = regexp.MustCompile(`"msg":"metrics listening","addr":"([^"]+)"`)

// metricsURL is the base URL of worker i's endpoints, from the last start in its log.
func (h *harness) metricsURL(i int) string {
	b, err := os.ReadFile(h.workers[i].Log)
	if err != nil {
		return ""
	}
	m := metricsListening.FindAllSubmatch(b, -1)
	if len(m) == 0 {
		return ""
	}
	return "http://" + string(m[len(m)-1][1])
}

// get returns the body of url, or "" when it cannot be read.
func get(url string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
