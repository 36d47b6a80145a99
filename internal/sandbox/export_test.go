package sandbox

import (
	"slices"
	"time"
)

// HostState is what a bubblewrap sandbox holds on the host, for tests of the external test
// package to check that it is all gone afterwards.
type HostState struct {
	Dir     string   // the workdir's host folder
	Scratch string   // the host folder of /tmp and /dev/shm (a tmpfs where the worker mounts)
	Lock    string   // the lock file
	Cgroups []string // the cgroup folders
	UID     int      // the host uid the sandbox runs as; -1 when the worker is not root
}

// Paths are the host paths of the sandbox's state, each there until it is removed.
func (st HostState) Paths() []string {
	return append([]string{st.Dir, st.Scratch, st.Lock}, st.Cgroups...)
}

// BubblewrapHostState describes a bubblewrap sandbox that has not been closed yet.
func BubblewrapHostState(sb Sandbox) HostState {
	b, _ := As[*bubblewrapSandbox](sb)
	st := HostState{Dir: b.hostDir, Scratch: b.scratchDir, Lock: b.hostDir + lockSuffix, UID: b.uid}
	if b.cg != nil {
		st.Cgroups = slices.Clone(b.cg.dirs)
	}
	return st
}

// WithoutDiskMount makes a provider walk workdirs instead of mounting a tmpfs for each: the
// baseline of benchmarks and of tests that show what the walk misses.
func WithoutDiskMount(c *BubblewrapConfig) {
	c.noDiskMount = true
	c.DiskBestEffort = true
}

// WithoutDiskMountStrict is as if no tmpfs could be mounted, without accepting best effort.
func (c BubblewrapConfig) WithoutDiskMountStrict() BubblewrapConfig {
	c.noDiskMount = true
	return c
}

// WithoutSeccomp runs sandboxes without the seccomp filter: the baseline of benchmarks and of
// tests that show what the filter stops.
func WithoutSeccomp(c *BubblewrapConfig) { c.noSeccomp = true }

// SetPodCAFile has AttachEgress on Kubernetes write the CA at path (a pod side that runs on the
// test's host) until the test ends.
func SetPodCAFile(t interface{ Cleanup(func()) }, path string) {
	was := podCAFile
	podCAFile = path
	t.Cleanup(func() { podCAFile = was })
}

// UseGoSpare gives the provider's warm sandboxes the Go spare (the worker's binary) even where
// they could have the shell spare.
func UseGoSpare(p *BubblewrapProvider) { goSpareOnly.Store(p, true) }

// AgeKubernetesSandbox makes a Kubernetes sandbox's pod d older, as if it had been created d
// earlier (its claim's deadline counts from then).
func AgeKubernetesSandbox(sb Sandbox, d time.Duration) {
	k, _ := As[*kubernetesSandbox](sb)
	k.created = k.created.Add(-d)
}

// MaxListing is the bound every backend holds a List's answer to.
const MaxListing = maxListing

// MessageQueueBytes is the bound of a bubblewrap sandbox's POSIX message queues.
const MessageQueueBytes = messageQueueBytes

// PollWakeups is how many times the disk polls of a bubblewrap sandbox's commands woke up.
func PollWakeups(sb Sandbox) int64 {
	b, _ := As[*bubblewrapSandbox](sb)
	return b.pollWakeups.Load()
}

// DiskPollMin is the shortest interval of a running command's disk poll.
const DiskPollMin = diskPollMin

// SignalsQueuedBound is how many pending signals and POSIX timers a bubblewrap sandbox holds.
const SignalsQueuedBound = sigPendingLimit

// AbandonUIDClaims drops the locks of p's claims of host uids and leaves their files, as a
// worker that dies does.
func AbandonUIDClaims(p *BubblewrapProvider) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.inUse {
		c.l.f.Close()
	}
}
