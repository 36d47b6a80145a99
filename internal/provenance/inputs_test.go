package provenance

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
)

// TestMaxInputsIsTheJobs: MaxInputs is the most inputs a job message can hold. The smallest
// input a job holds takes minInputBytes of the message at least, so a manifest of any job
// parses (a bound below the job's would refuse a real run); a job with one more does not
// encode.
func TestMaxInputsIsTheJobs(t *testing.T) {
	smallest, err := json.Marshal(job.Input{Name: "a", URI: "a", SHA256: strings.Repeat("0", 64)})
	if err != nil {
		t.Fatal(err)
	}
	if len(smallest) < minInputBytes {
		t.Fatalf("the smallest input a job holds is %d bytes, %s; MaxInputs counts %d", len(smallest), smallest, minInputBytes)
	}
	j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "csv-analyst", Task: "t", SubmittedAt: time.Now()}
	for i := range MaxInputs + 1 {
		j.Inputs = append(j.Inputs, job.Input{Name: fmt.Sprint(i), URI: "a", SHA256: strings.Repeat("0", 64)})
	}
	if _, err := j.Encode(); !errors.Is(err, job.ErrInvalid) {
		t.Errorf("a job of %d inputs encodes (%v); MaxInputs is %d", len(j.Inputs), err, MaxInputs)
	}
}
