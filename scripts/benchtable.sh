#!/usr/bin/env bash
# benchtable.sh FILE: one table of the rows of docs/performance.md from `go test -bench`
# output. Each figure is the median of the runs in FILE with its range [min-max]; a row whose
# benchmark is not in FILE says so: no figure is ever made up.
set -euo pipefail
file=${1:-bin/bench.txt}
# row | what | benchmark | targets: unit op value, comma separated
rows='1|queue layer: jobs/s fetch->run->ack vs raw fetch+double-ack|BenchmarkQueueLayer|x-of-raw>=0.5
2|bubblewrap lifecycle: Start+Exec true+Close vs bare bwrap|BenchmarkBubblewrapLifecycle|x-of-bare<=1.5
3|per-job overhead: whole runner vs the same primitive calls|BenchmarkJobOverhead|x-of-raw<=1.1,overhead-ms/job<=5
4|memory: worker RSS per in-flight job; a 64 MiB artifact job|BenchmarkWorkerMemory|MiB/job-at-1<=2,MiB/job-at-50<=2,artifact-MiB<=8
5|failover: SIGKILL->redelivery; SIGTERM->handover|BenchmarkFailover|sigkill-excess-ms<=1000,sigterm-ms<=1000
6|submission: submit run --jobs FILE vs raw publishes|BenchmarkSubmitJobs|ratio_to_raw>=0.5,jobs/s>=200
7|cluster pod start: Boxcar Start vs bare client-go|BenchmarkPodStart|x-of-bare-p50<=1.1
8|egress: HTTPS GET through the proxy (tunnel) vs direct|BenchmarkProxyHTTPS/splice|overhead-p50-ms<=2,overhead-p99-ms<=10
9|egress: HTTPS GET with a secret injected (TLS terminated) vs direct|BenchmarkProxyHTTPS/intercept|overhead-p50-ms<=2,overhead-p99-ms<=10
10|egress: per-job CA plus first leaf|BenchmarkCAAndFirstLeaf|ms/ca+leaf<=5
11|inputs: worker peak RSS with a 1 GiB input; refusal on a profile too small|BenchmarkWorkerInputMemory|peak-MiB<=143,reject-s<=5
12|egress: bubblewrap lifecycle with the egress bridge vs without a network|BenchmarkBubblewrapEgressLifecycle|
13|egress: pod lifecycle with the tunnel vs without a network|BenchmarkPodEgressLifecycle|
14|warm: bubblewrap claim to first command running vs cold Start|BenchmarkBubblewrapWarmStart|warm-run-ms<=10
15|warm: trivial jobs/s on warm bubblewrap sandboxes vs raw fetch+ack|BenchmarkWarmJobs|x-of-raw>=0.5
16|warm: burst of 50 onto an idle worker, pool min 0|BenchmarkWarmBurst|cold-fraction<=0.1
17|warm: cluster claim to first command result vs cold pod Start|BenchmarkWarm|warm-p50-ms<=150,warm-p99-ms<=500'
awk -v rows="$rows" '
function med(a, n,   i, j, t, s) {
	for (i = 1; i <= n; i++) s[i] = a[i]
	for (i = 2; i <= n; i++) { t = s[i]; for (j = i - 1; j >= 1 && s[j] > t; j--) s[j + 1] = s[j]; s[j + 1] = t }
	lo = s[1]; hi = s[n]
	return (n % 2) ? s[(n + 1) / 2] : (s[n / 2] + s[n / 2 + 1]) / 2
}
function fmtn(x) { return (x >= 100 || x <= -100) ? sprintf("%.0f", x) : sprintf("%.3g", x) }
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name)
	runs[name]++
	for (i = 3; i + 1 <= NF; i += 2) {
		u = $(i + 1); key = name SUBSEP u
		if (!(key in n)) { units[name] = units[name] " " u }
		v[key, ++n[key]] = $i
	}
}
/^bench: .* failed$/ { failed[$2] = 1 }
END {
	nrows = split(rows, rl, "\n")
	printf "%-3s %-60s %-22s %-26s %s\n", "row", "what", "figure", "median [min-max] of runs", "target"
	for (r = 1; r <= nrows; r++) {
		split(rl[r], f, "|")
		name = f[3]
		if (!(name in runs)) {
			printf "%-3s %-60s %s\n", f[1], f[2], "missing: " name " did not run" ((("^" name "$") in failed) ? " (it failed; see the log above)" : "")
			continue
		}
		first = 1
		nu = split(units[name], ul, " ")
		for (k = 1; k <= nu; k++) {
			u = ul[k]; if (u == "ns/op") continue
			key = name SUBSEP u; cnt = n[key]
			for (i = 1; i <= cnt; i++) xs[i] = v[key, i]
			m = med(xs, cnt)
			target = ""
			nt = split(f[4], tl, ",")
			for (t = 1; t <= nt; t++) {
				if (match(tl[t], /(<=|>=)/) && substr(tl[t], 1, RSTART - 1) == u) {
					op = substr(tl[t], RSTART, 2); lim = substr(tl[t], RSTART + 2) + 0
					ok = (op == "<=") ? (m <= lim) : (m >= lim)
					target = op " " lim (ok ? "  met" : "  NOT MET")
				}
			}
			printf "%-3s %-60s %-22s %-26s %s\n", first ? f[1] : "", first ? f[2] : "", u, fmtn(m) " [" fmtn(lo) "-" fmtn(hi) "] n=" cnt, target
			first = 0
		}
	}
}' "$file"
