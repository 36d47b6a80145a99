package queue

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// A tenant's identity reads without consumers: the server checks no consumer's deliver
// subject (nats-server issue #8274), so a tenant allowed to create one could have it deliver
// into another tenant's job consumer (docs/security.md). What the server lets it do instead
// is look a bucket's stream up, asking for the subjects under a filter (its keys), and get a
// key's last value by a direct get with the key in the subject, which the server checks.

// readConcurrency bounds the direct gets one listing or one round of a watch has in flight:
// enough to keep the connection busy, few enough not to crowd out the worker's requests.
const readConcurrency = 16

// listKeys returns the keys below filter (a key pattern: "T.*", ">") for which the bucket's
// stream holds a message, sorted: from the stream's info with a subject filter, which nats.go
// pages through when the server splits a long list of subjects. A key deleted or purged is
// still listed (its marker is a message); getEach leaves it out.
func listKeys(ctx context.Context, js jetstream.JetStream, bucket, filter string) ([]string, error) {
	stream := "KV_" + bucket
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", stream, err)
	}
	prefix := "$KV." + bucket + "."
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(prefix+filter))
	if err != nil {
		return nil, fmt.Errorf("list the keys %s of bucket %s: %w", filter, bucket, err)
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subject := range info.State.Subjects {
		keys = append(keys, strings.TrimPrefix(subject, prefix))
	}
	sort.Strings(keys)
	return keys, nil
}

// got is what a direct get of one key found: its last entry, or why there is none
// (jetstream.ErrKeyNotFound for a key never written, deleted or purged).
type got struct {
	entry jetstream.KeyValueEntry
	err   error
}

// getEach gets the last entry of each key by direct gets, readConcurrency at a time; the
// result at i is keys[i]'s. A key that fails is that key's result only.
func getEach(ctx context.Context, kv getter, keys []string) []got {
	out := make([]got, len(keys))
	var g errgroup.Group
	g.SetLimit(readConcurrency)
	for i, key := range keys {
		g.Go(func() error {
			e, err := kv.Get(ctx, key)
			out[i] = got{entry: e, err: err}
			return nil
		})
	}
	_ = g.Wait() // every result carries its own error
	return out
}

// listEntries returns the current entries of the bucket's keys below filter, in key order,
// without the deleted and purged ones: what a watch's initial values were, with no consumer.
func listEntries(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, filter string) ([]jetstream.KeyValueEntry, error) {
	keys, err := listKeys(ctx, js, kv.Bucket(), filter)
	if err != nil {
		return nil, err
	}
	var out []jetstream.KeyValueEntry
	for i, r := range getEach(ctx, kv, keys) {
		switch {
		case errors.Is(r.err, jetstream.ErrKeyNotFound):
			continue // deleted or purged since it was listed
		case r.err != nil:
			return nil, fmt.Errorf("read %s of bucket %s: %w", keys[i], kv.Bucket(), r.err)
		}
		out = append(out, r.entry)
	}
	return out, nil
}
