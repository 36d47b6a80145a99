package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/backoff"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// Each served tenant's dead letters are in a stream of its own, <dead_letter_stream>_T, under
// the subjects <dead_letter_stream>_T.J. A tenant's submitter reads its letters by that
// stream's info and direct gets, and the info, asked with a subject filter, lists every subject
// the stream holds, which the server cannot scope to the filter: in the one stream shared by
// every tenant, team-a's submitter listed team-b's dead-lettered job ids.
//
// The shared stream, named dead_letter_stream, keeps its subjects (<dead_letter_stream>.T.J):
// two streams may not take one subject, and narrowing it to make room for the tenants' would
// leave an older worker of an upgrade with nowhere to publish for as long as the two changes
// take, so no subject moves and nothing is refused. It keeps the letters written before the
// upgrade and those older workers write during it, and stays the home of the letters of a
// tenant whose own stream cannot take them: an unknown tenant's (unserved.go), a retired one's
// whose stream was removed, or any tenant's before `worker setup` of this version made its
// stream, or with the worker's credentials generated before it. No tenant's identity may look it up: it reads its own
// letters there by a direct get with the subject in the request's subject, which lists nothing.
// A reader looks in the tenant's stream, then in the shared one (DeadLetterOf).

// deadLetterStream is tenant's dead-letter stream: <dead_letter_stream>_T. A tenant name has
// no '_', so no two tenants, nor a tenant and the shared stream, share one (config checks
// the length and the other names).
func deadLetterStream(cfg config.NATS, tenant string) string {
	return cfg.DeadLetterStream + "_" + tenant
}

// DeadLetterStream is the name of tenant's dead-letter stream, for what names it to an
// operator.
func DeadLetterStream(cfg config.NATS, tenant string) string { return deadLetterStream(cfg, tenant) }

// tenantLetterSubject is where job r's dead letter goes in its tenant's stream:
// <dead_letter_stream>_T.J, J as dlqToken writes it.
func tenantLetterSubject(cfg config.NATS, r Ref) string {
	return deadLetterStream(cfg, r.Tenant) + "." + dlqToken(r.ID)
}

// deadLetterConfig is tenant's dead-letter stream, or with tenant "" the shared one. Each is
// bounded on its own by nats.dead_letter_max_age and nats.dead_letter_max_bytes.
func deadLetterConfig(cfg config.NATS, tenant string) jetstream.StreamConfig {
	name, subjects, what := cfg.DeadLetterStream, cfg.DeadLetterStream+".>", "Boxcar jobs that can never run, with the reason: those of tenants no worker serves, and every tenant's written before each had a stream of its own"
	if tenant != "" {
		name = deadLetterStream(cfg, tenant)
		subjects, what = name+".>", "Boxcar jobs of tenant "+tenant+" that can never run, with the reason"
	}
	return jetstream.StreamConfig{
		Name:        name,
		Description: what,
		Subjects:    []string{subjects},
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      time.Duration(cfg.DeadLetterMaxAge),
		MaxBytes:    orUnlimited(cfg.DeadLetterMaxBytes),
		MaxMsgs:     -1,
		Duplicates:  2 * time.Minute, // the server's default, written out to compare with
		Discard:     jetstream.DiscardOld,
		// The server's default, written out to compare with.
		MaxMsgsPerSubject: -1,
		// A submitter reads its tenant's letters by a direct get with the subject in the
		// request's subject, the only read natsconfig grants it (a get with the subject in the
		// payload could name another tenant's); without direct gets no server answers it.
		AllowDirect: true,
		Metadata:    map[string]string{settingMeta("max_age"): "nats.dead_letter_max_age", settingMeta("max_bytes"): "nats.dead_letter_max_bytes"},
	}
}

// declareDeadLetters creates or updates the shared dead-letter stream and each tenant's.
func (a *Admin) declareDeadLetters(ctx context.Context, tenants []string) error {
	for _, tenant := range append([]string{""}, tenants...) {
		dead := deadLetterConfig(a.cfg, tenant)
		if err := a.ownedStream(ctx, deadLetterBounds, &dead, true); err != nil {
			return err
		}
		deadBefore := dead
		deadBefore.MaxAge, deadBefore.MaxBytes = 30*24*time.Hour, -1
		if _, err := ensureStream(ctx, a.js, dead, deadBefore, a.log); err != nil {
			return fmt.Errorf("queue: set up dead-letter stream %s: %w", dead.Name, err)
		}
	}
	return nil
}

// letterBox is where a dead letter is: a stream and its subject.
type letterBox struct{ stream, subject string }

// errLettered is publishLetter's answer when the job's letter is in the shared stream already:
// an older worker of an upgrade wrote it, and it is the job's one.
var errLettered = errors.New("the job's dead letter is in the shared dead-letter stream already")

// letterWriter writes jobs' dead letters: a worker's (Consumer.letters) or `worker setup`'s,
// retiring a tenant (deadLetterAll). Each writes a job's letter where the others would, so that
// the server's check of one letter a subject holds between them.
type letterWriter struct {
	js  jetstream.JetStream
	cfg config.NATS
	log *slog.Logger
}

// letters is the worker's letterWriter.
func (c *Consumer) letters() letterWriter { return letterWriter{js: c.js, cfg: c.cfg, log: c.log} }

// publishLetter writes job r's dead letter, once (publishOnce), and says where it went: into
// its tenant's stream, else into the shared one. A letter the tenant's stream cannot take goes
// to the shared one, where it is kept and found as an older worker's: the server has no such
// stream (`worker setup` of this version has not run; a tenant never served, or one whose
// stream the operator removed) or refuses this login its subjects (credentials generated
// before it, or without a retired tenant). A stream that is there and answers nobody is
// electing its leader: the letter waits for it (publishOwn), and is never written into the
// shared one, which does not know the letter the tenant's may hold. Whether the writer serves
// the tenant does not matter: a retired tenant's job whose worker wrote its letter into the
// tenant's stream and stopped before its term got a second one in the shared stream, from
// setup retiring the tenant or from the sweep of a worker that does not serve it. served says
// only whether a letter that goes to the shared stream is worth a warning.
func (w letterWriter) publishLetter(ctx context.Context, r Ref, data []byte, served bool) (letterBox, error) {
	shared := letterBox{w.cfg.DeadLetterStream, dlqSubject(w.cfg, r)}
	if !job.ValidTenant(r.Tenant) {
		return shared, w.publishShared(ctx, shared, r, data, "")
	}
	own := letterBox{deadLetterStream(w.cfg, r.Tenant), tenantLetterSubject(w.cfg, r)}
	if r.ID != "" {
		switch found, err := w.sharedLettered(ctx, shared); {
		case err != nil:
			return shared, err
		case found:
			return shared, errLettered
		}
	}
	err := w.publishOwn(ctx, own, r, data)
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, ErrRefused) {
		if served {
			w.log.WarnContext(ctx, "the tenant's dead-letter stream does not take the job's letter; it goes to the shared dead-letter stream: run `worker setup` of this version and regenerate the worker's NATS credentials (`worker nats-config`)",
				"job_id", r.ID, "tenant", r.Tenant, "stream", own.stream, "shared", shared.stream, "error", err)
		}
		return shared, w.publishShared(ctx, shared, r, data, own.stream)
	}
	return own, err
}

// publishShared publishes the letter into the shared stream. A refusal shows on the connection
// alone, and the publish waited for an answer until the caller's deadline, as if NATS were
// down: it is ErrRefused at once, naming the grants the login lacks, the tenant's stream's
// too when it was refused there first (own; "": not asked).
func (w letterWriter) publishShared(ctx context.Context, shared letterBox, r Ref, data []byte, own string) error {
	err := unlessRefused(ctx, w.js.Conn(), []string{shared.subject}, func(ctx context.Context) error {
		return publishOnce(ctx, w.js, shared.subject, r, data)
	})
	if !errors.Is(err, ErrRefused) {
		return err
	}
	grants := "publish on " + shared.stream + ".>, where the letters of a tenant with no dead-letter stream of its own go"
	if own != "" {
		grants = "publish on " + own + ".> (tenant " + r.Tenant + "'s dead-letter stream) and on " + shared.stream + ".> (the shared one)"
	}
	return fmt.Errorf("%w: this login may not write job %s's dead letter in any dead-letter stream; grant the worker %s, as `worker nats-config` does, and use its credentials", ErrRefused, r, grants)
}

// sharedLettered reports whether the shared stream holds the job's letter (box), which an older
// worker of an upgrade may have written. Nobody answering is none only when the server says
// the stream is gone (sharedStream.lookup): a stream electing its leader answers nobody too,
// and a worker that took that as no letter wrote a second one, into the tenant's stream. So it
// is an error then, wrapping errUnanswered, and nothing is written: the job's end is tried
// again (the runner's settle waits for NATS), and finds the older worker's letter.
func (w letterWriter) sharedLettered(ctx context.Context, box letterBox) (bool, error) {
	msg, err := (&sharedStream{nc: w.js.Conn(), name: box.stream}).lookup(ctx, w.js, box.subject)
	if err != nil {
		return false, fmt.Errorf("queue: read the dead letter %s in %s: %w", box.subject, box.stream, err)
	}
	return msg != nil, nil
}

// letterRounds bounds how often publishOwn offers a letter to a stream that is there and
// answers nobody: backoff.Delay's waits between, 250 ms doubling to 4 s, about 8 s in all,
// longer than a leader election takes. Past them the Term fails, and is tried again.
const letterRounds = 6

// publishOwn publishes the letter into the tenant's stream (own). Nobody answering is no such
// stream only when the server says so (the error then wraps jetstream.ErrStreamNotFound): a
// stream electing its leader answers nobody too, and its letter went to the shared stream, out
// of its tenant's listing; and a letter an earlier delivery wrote into it (its worker died
// before the term), which the shared stream's check of one per subject cannot see, was
// written again there. So while the stream is there (or the look-up fails, as one does
// during an election) the publish is tried again, and past letterRounds it is an error.
func (w letterWriter) publishOwn(ctx context.Context, own letterBox, r Ref, data []byte) error {
	for round := 1; ; round++ {
		err := unlessRefused(ctx, w.js.Conn(), []string{own.subject}, func(ctx context.Context) error {
			return publishOnce(ctx, w.js, own.subject, r, data)
		})
		switch {
		case !errors.Is(err, jetstream.ErrNoStreamResponse):
			return err
		case !streamThere(ctx, w.js, own.stream):
			return fmt.Errorf("%w (%w)", err, jetstream.ErrStreamNotFound)
		case round == letterRounds:
			return fmt.Errorf("%w: the dead-letter stream %s is there and answers nobody, its leader being elected or its server restarting; the job's end is tried again", err, own.stream)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff.Delay(round)):
		}
	}
}

// streamThere reports whether the server has stream name, or cannot say.
func (c *Consumer) streamThere(ctx context.Context, name string) bool {
	return streamThere(ctx, c.js, name)
}

// streamThere reports whether the server has stream name, or cannot say.
func streamThere(ctx context.Context, js jetstream.JetStream, name string) bool {
	ctx, cancel := context.WithTimeout(ctx, sharedLook)
	defer cancel()
	_, err := js.Stream(ctx, name)
	return !errors.Is(err, jetstream.ErrStreamNotFound)
}

// publishOnce publishes a dead letter on subject only while the subject holds none (the
// server checks). A letter names its job by the subject, so a letter with no job id has no
// subject of its own to be checked on: every such letter shared one (~unknown), and one whose
// writer stopped before its term, or before setup removed its message, was written again at the
// next try. It is refused: a message that names no job is lettered under its sequence in its
// job stream (letterRef), the id its status is recorded under.
func publishOnce(ctx context.Context, js jetstream.JetStream, subject string, r Ref, data []byte) error {
	if r.ID == "" {
		return fmt.Errorf("queue: dead letter on %s names no job, so it cannot be written once: give the message's stream sequence as its id (job.SeqID)", subject)
	}
	_, err := js.Publish(ctx, subject, data, jetstream.WithExpectLastSequencePerSubject(0))
	return err
}

// letterRef is the job a message's dead letter goes under: the one its subject names, else,
// for a subject that names none, its sequence in its job stream (job.SeqID), as a worker
// records its status (runner's statusID).
func letterRef(r Ref, seq uint64) Ref {
	if r.ID == "" && seq != 0 {
		r.ID = job.SeqID(seq)
	}
	return r
}

// DeadLetterOf is job r's dead letter: in its tenant's stream, else in the shared one, where an
// older worker or a worker whose tenant's stream could not take it wrote it;
// jetstream.ErrMsgNotFound when neither holds one, or this login may read neither. It reads by
// direct gets with the subject in the request's subject, which a submitter of r's tenant is
// granted in both.
func DeadLetterOf(ctx context.Context, nc *nats.Conn, cfg config.NATS, r Ref) ([]byte, error) {
	boxes := []letterBox{{cfg.DeadLetterStream, dlqSubject(cfg, r)}}
	if job.ValidTenant(r.Tenant) {
		boxes = slices.Insert(boxes, 0, letterBox{deadLetterStream(cfg, r.Tenant), tenantLetterSubject(cfg, r)})
	}
	for _, b := range boxes {
		data, found, err := lastOn(ctx, nc, b)
		if err != nil {
			return nil, err
		}
		if found {
			return data, nil
		}
	}
	return nil, jetstream.ErrMsgNotFound
}

// lastOn reads the last message on the box's subject by a direct get (sharedStream: no such
// stream, and a refusal, are no message there). Each call looks anew: a tenant's stream may be
// made meanwhile.
func lastOn(ctx context.Context, nc *nats.Conn, b letterBox) ([]byte, bool, error) {
	msg, err := (&sharedStream{nc: nc, name: b.stream}).get(ctx, b.subject)
	switch {
	case err != nil:
		return nil, false, fmt.Errorf("queue: read the dead letter %s in %s: %w", b.subject, b.stream, err)
	case msg == nil:
		return nil, false, nil
	}
	return msg.Data, true, nil
}
