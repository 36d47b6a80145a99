package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Workers and `submit` before tenants kept every input (InputKey) and run (RunPrefix) at the
// store's root; today every one is under a tenant's folder (ForTenant), and those of the root
// are tenant default's. AdoptRootLayout moves them there, so that there is one place to look
// for a run and an input afterwards: a job queued before the upgrade finds its input, a worker
// finds a run committed before it and does not run the job again, and `submit verify`, get,
// logs and gc read the run as any other.

// ErrOtherObject marks an object of the root layout that AdoptRootLayout left where it is:
// the tenant's folder holds another object under its key.
var ErrOtherObject = errors.New("the tenant's folder holds another object under the key")

// RootAdoption is what AdoptRootLayout did.
type RootAdoption struct {
	// Moved counts the objects moved from the root into the tenant's folder.
	Moved int
	// Kept are the root's objects left in place (ErrOtherObject), each with the reason: for a
	// run, every object of it, since the job ran and committed on both sides of the upgrade
	// and only a person can tell which run to keep.
	Kept map[string]error
}

// AdoptRootLayout moves the inputs and runs at the root of root into into (tenant default's
// store, ForTenant), keeping their keys: each object is copied create-only, and removed from
// the root once its copy, or an object of the same bytes already there, is in place. A run's
// objects are copied before its signature and its signature before its manifest, so that the
// tenant's folder never shows a committed run missing a part, and a run is removed from the
// root only once all of it is copied. A run whose manifest, or any object, differs from the
// one the tenant's folder holds under its key stays at the root whole (Kept). It is
// idempotent, and safe to run from several workers at once: an object another moved first is
// skipped. Nothing to do, past two listings, once the root holds neither.
func AdoptRootLayout(ctx context.Context, root, into Store) (RootAdoption, error) {
	done := RootAdoption{Kept: map[string]error{}}
	inputs, err := root.List(ctx, "inputs/")
	if err != nil {
		return done, fmt.Errorf("store: list the inputs at the store's root: %w", err)
	}
	for _, obj := range inputs {
		if err := done.move(ctx, root, into, []ObjectInfo{obj}); err != nil {
			return done, err
		}
	}
	objs, err := root.List(ctx, "runs/")
	if err != nil {
		return done, fmt.Errorf("store: list the runs at the store's root: %w", err)
	}
	for _, run := range byRun(objs) {
		if err := done.move(ctx, root, into, run); err != nil {
			return done, err
		}
	}
	return done, nil
}

// byRun groups the objects under runs/ by the run's folder, each with its signature and then
// its manifest last.
func byRun(objs []ObjectInfo) [][]ObjectInfo {
	runs := map[string][]ObjectInfo{}
	var order []string
	for _, o := range objs {
		id, _, _ := strings.Cut(strings.TrimPrefix(o.Key, "runs/"), "/")
		if _, ok := runs[id]; !ok {
			order = append(order, id)
		}
		runs[id] = append(runs[id], o)
	}
	out := make([][]ObjectInfo, 0, len(order))
	for _, id := range order {
		run := runs[id]
		rank := func(o ObjectInfo) int {
			switch o.Key {
			case SignatureKey(id):
				return 1
			case ManifestKey(id):
				return 2
			}
			return 0
		}
		slices.SortStableFunc(run, func(a, b ObjectInfo) int { return rank(a) - rank(b) })
		out = append(out, run)
	}
	return out
}

// move copies objs, in order, from root into into, then removes them from root; an object
// that differs leaves every one of objs at the root, recorded in Kept.
func (d *RootAdoption) move(ctx context.Context, root, into Store, objs []ObjectInfo) error {
	for _, o := range objs {
		err := copyOnce(ctx, root, into, o)
		if errors.Is(err, ErrOtherObject) {
			for _, k := range objs {
				d.Kept[k.Key] = fmt.Errorf("%s: %w", o.Key, err)
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
	for _, o := range objs {
		if err := root.Delete(ctx, o.Key); err != nil {
			return fmt.Errorf("store: remove %s from the store's root once moved: %w", o.Key, err)
		}
		d.Moved++
	}
	return nil
}

// copyOnce copies one object create-only. An object of the same bytes already in place is
// no error (a run earlier cut short, or another worker); one of other bytes is ErrOtherObject.
// One gone from the root meanwhile was moved by another worker.
func copyOnce(ctx context.Context, root, into Store, o ObjectInfo) error {
	rc, err := root.Get(ctx, o.Key)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("store: read %s at the store's root: %w", o.Key, err)
	}
	err = into.PutIfAbsent(ctx, o.Key, rc, o.Size)
	rc.Close()
	if !errors.Is(err, ErrExists) {
		if err != nil {
			return fmt.Errorf("store: copy %s from the store's root into %s: %w", o.Key, into.URL(o.Key), err)
		}
		return nil
	}
	same, err := sameObject(ctx, root, into, o.Key, o.Size)
	if errors.Is(err, ErrNotFound) || same {
		return nil // moved by another worker meanwhile, or copied before
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: %s", ErrOtherObject, into.URL(o.Key))
}

// sameObject reports whether into holds under key the size bytes root holds.
func sameObject(ctx context.Context, root, into Store, key string, size int64) (bool, error) {
	x, err := digestOf(ctx, root, key, size)
	if err != nil {
		return false, err
	}
	y, err := digestOf(ctx, into, key, size)
	return x == y, err
}
