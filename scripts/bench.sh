#!/usr/bin/env bash
# make bench: runs the side-by-side benchmarks of docs/performance.md (BENCH_COUNT times
# each, default 3), keeps the raw `go test -bench` output in bin/bench.txt (benchstat reads it)
# and prints one table of them (scripts/benchtable.sh). BENCH_CLUSTER=0 leaves out rows 7, 13 and 17.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
COUNT=${BENCH_COUNT:-3}
OUT=$(pwd)/bin/bench.txt
mkdir -p bin
: >"$OUT"

# run DIR PACKAGE BENCH-REGEX BENCHTIME [WRAPPER...]
run() {
	local dir=$1 pkg=$2 re=$3 benchtime=$4
	shift 4
	echo "bench: $re in $pkg (-benchtime $benchtime -count $COUNT)" >&2
	if ! (cd "$dir" && "$@" "$GO" test -tags integration -run '^$' -bench "$re" -benchtime "$benchtime" -count "$COUNT" -timeout 40m "$pkg") 2>&1 | tee -a "$OUT" >&2; then
		echo "bench: $re failed" | tee -a "$OUT" >&2
	fi
}

run . ./test/bench '^BenchmarkQueueLayer$' 200x
run . ./internal/sandbox '^BenchmarkBubblewrapLifecycle$' 30x
run . ./test/bench '^BenchmarkJobOverhead$' 30x
run . ./test/bench '^BenchmarkWorkerMemory$' 1x
run . ./test/bench '^BenchmarkWorkerInputMemory$' 1x
run . ./test/bench '^BenchmarkFailover$' 3x
run . ./internal/egress '^Benchmark(ProxyHTTPS|CAAndFirstLeaf)$' 200x
run . ./internal/sandbox '^BenchmarkBubblewrapEgressLifecycle$' 20x
run . ./internal/sandbox '^BenchmarkBubblewrapWarmStart$' 30x
run . ./test/bench '^BenchmarkWarmJobs$' 100x
run . ./test/bench '^BenchmarkWarmBurst$' 1x
if grep -qs 'func BenchmarkSubmitJobs' internal/submitcmd/*_test.go; then
	run . ./internal/submitcmd '^BenchmarkSubmitJobs$' 1x
fi
# Rows 7, 13 and 17 run on the single-node cluster of test/cluster, a shared resource: root only, one
# user at a time (the lock), built once by `make test-cluster`.
if [ "${BENCH_CLUSTER:-1}" != 1 ]; then
	echo "bench: rows 7, 13 and 17 left out (BENCH_CLUSTER=0)" >&2
elif [ "$(id -u)" != 0 ]; then
	echo "bench: rows 7, 13 and 17 left out: the test cluster needs root" >&2
else
	test/cluster/build.sh >&2
	run test/cluster . '^BenchmarkPodStart$' 1x flock /tmp/boxcar-cluster.lock
	run test/cluster . '^BenchmarkWarm$' 1x flock /tmp/boxcar-cluster.lock
	# Row 13 runs the release image's binary in the pods: it needs bin/image.tar (make image).
	if [ -s bin/image.tar ]; then
		run test/cluster . '^BenchmarkPodEgressLifecycle$' 1x flock /tmp/boxcar-cluster.lock
	else
		echo "bench: row 13 left out: no bin/image.tar; run make image first" >&2
	fi
fi
echo >&2
scripts/benchtable.sh "$OUT"
