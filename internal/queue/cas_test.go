package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// counter is the value the compare-and-set table writes.
type counter struct {
	N    int    `json:"n"`
	Note string `json:"note,omitempty"`
}

// TestUpdate is the one compare-and-set loop behind statuses and approvals, row by row: what
// it writes, what it returns, and that a writer in between is never overwritten.
func TestUpdate(t *testing.T) {
	t.Parallel()
	kv := casBucket(t)
	ctx := t.Context()
	errNo := errors.New("refused")
	bump := func(c *counter, _ uint64) (bool, error) { c.N++; return true, nil }
	tests := []struct {
		name    string
		start   *counter // the key's value before; nil: no value
		first   func(rev uint64) guess[counter]
		change  func(kv jetstream.KeyValue, key string) func(*counter, uint64) (bool, error)
		want    counter
		wantErr error
		writes  uint64 // revisions the key gains
	}{
		{name: "a missing key is created", change: func(jetstream.KeyValue, string) func(*counter, uint64) (bool, error) { return bump }, want: counter{N: 1}, writes: 1},
		{name: "a value is updated", start: &counter{N: 4}, change: func(jetstream.KeyValue, string) func(*counter, uint64) (bool, error) { return bump }, want: counter{N: 5}, writes: 1},
		{
			name: "a change that declines writes nothing", start: &counter{N: 4},
			change: func(jetstream.KeyValue, string) func(*counter, uint64) (bool, error) {
				return func(*counter, uint64) (bool, error) { return false, nil }
			},
			want: counter{N: 4},
		},
		{
			name: "a change that fails writes nothing and returns the value", start: &counter{N: 4},
			change: func(jetstream.KeyValue, string) func(*counter, uint64) (bool, error) {
				return func(c *counter, _ uint64) (bool, error) { c.N = 99; return false, errNo }
			},
			want: counter{N: 99}, wantErr: errNo,
		},
		{
			name: "a writer in between is kept: the change runs again on its value", start: &counter{N: 1},
			change: func(kv jetstream.KeyValue, key string) func(*counter, uint64) (bool, error) {
				raced := false
				return func(c *counter, rev uint64) (bool, error) {
					if !raced {
						raced = true
						if _, err := kv.Update(ctx, key, []byte(`{"n":10,"note":"other"}`), rev); err != nil {
							return false, err
						}
					}
					c.N++
					return true, nil
				}
			},
			want: counter{N: 11, Note: "other"}, writes: 2,
		},
		{
			name: "a stale guess costs a read, not the other writer's value", start: &counter{N: 7, Note: "now"},
			first:  func(rev uint64) guess[counter] { return guess[counter]{v: counter{N: 1}, rev: rev - 1, ok: true} },
			change: func(jetstream.KeyValue, string) func(*counter, uint64) (bool, error) { return bump },
			want:   counter{N: 8, Note: "now"}, writes: 1,
		},
		{
			name: "a right guess is written without a read", start: &counter{N: 7},
			first: func(rev uint64) guess[counter] {
				return guess[counter]{v: counter{N: 7, Note: "guessed"}, rev: rev, ok: true}
			},
			change: func(jetstream.KeyValue, string) func(*counter, uint64) (bool, error) { return bump },
			want:   counter{N: 8, Note: "guessed"}, writes: 1,
		},
		{
			name: "a writer that always wins ends in contention", start: &counter{},
			change: func(kv jetstream.KeyValue, key string) func(*counter, uint64) (bool, error) {
				return func(c *counter, rev uint64) (bool, error) {
					if _, err := kv.Update(ctx, key, []byte(`{"n":0}`), rev); err != nil {
						return false, err
					}
					return true, nil
				}
			},
			want: counter{}, wantErr: errContention, writes: casTries,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "k" + string(rune('a'+i))
			var rev uint64
			if tt.start != nil {
				var err error
				if rev, err = kv.Create(ctx, key, mustJSON(*tt.start)); err != nil {
					t.Fatal(err)
				}
			}
			var first guess[counter]
			if tt.first != nil {
				first = tt.first(rev)
			}
			got, gotRev, err := update(ctx, kv, key, first, tt.change(kv, key))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr == nil || errors.Is(tt.wantErr, errNo) {
				if got != tt.want {
					t.Errorf("returned %+v, want %+v", got, tt.want)
				}
			}
			stored, storedRev, rerr := read[counter](ctx, kv, key)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if storedRev-rev != tt.writes {
				t.Errorf("the key gained %d revisions, want %d", storedRev-rev, tt.writes)
			}
			if err == nil && (stored != got || storedRev != gotRev) {
				t.Errorf("stored %+v at %d, returned %+v at %d", stored, storedRev, got, gotRev)
			}
		})
	}
}

// casBucket is a bucket on an embedded nats-server of the test's own, with queuetest.MaxStore,
// which this package's own tests cannot import (queuetest imports queue).
func casBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	ns, err := StartEmbedded(EmbeddedOptions{MaxStore: 1 << 40, Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return bucketOn(t, ns)
}

func bucketOn(t *testing.T, ns *server.Server) jetstream.KeyValue {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "CAS", History: 64})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}
