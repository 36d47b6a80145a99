#!/usr/bin/env bash
# make demo: start an embedded worker in a temporary data dir, submit the example job, wait for
# it, print the report and the manifest's summary, stop the worker. Everything is real (NATS,
# bubblewrap sandbox, store, tools); without OPENAI_API_KEY or OPENAI_BASE_URL the model is a
# scripted demo server.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/bin
data=$(mktemp -d /tmp/boxcar-demo.XXXXXX)
export BOXCAR_HOME=$data
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

wait_for_line() { # wait_for_line FILE PATTERN WHAT [LOG]
	for _ in $(seq 1 300); do
		if grep -q "$2" "$1" 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	echo "demo: $3 did not start; its log:" >&2
	cat "${4:-$1}" >&2 || true
	exit 1
}

if [[ -z ${OPENAI_API_KEY:-} && -z ${OPENAI_BASE_URL:-} ]]; then
	"$bin/demo-model" --addr 127.0.0.1:0 --addr-file "$data/model-url" >"$data/demo-model.log" 2>&1 &
	pids+=($!)
	wait_for_line "$data/demo-model.log" "http://" "the demo model"
	OPENAI_BASE_URL=$(cat "$data/model-url")
	export OPENAI_BASE_URL
	echo "== model: scripted demo model, not an LLM ($OPENAI_BASE_URL)"
	echo "   set OPENAI_API_KEY (and OPENAI_BASE_URL for other endpoints) to use a real model"
else
	echo "== model: ${OPENAI_BASE_URL:-https://api.openai.com/v1}"
fi

# The worker writes its addresses to the ready file once it takes jobs.
"$bin/worker" --embedded --data-dir "$data" --nats-listen 127.0.0.1:0 --metrics-addr 127.0.0.1:0 \
	--ready-file "$data/worker.ready" >"$data/worker.out" 2>"$data/worker.log" &
pids+=($!)
wait_for_line "$data/worker.ready" '"nats"' "the worker" "$data/worker.log"
nats_url=$(sed -n 's/.*"nats":"\([^"]*\)".*/\1/p' "$data/worker.ready")
echo "== worker: embedded NATS at $nats_url, data dir $data"

echo "== submitting the csv-analyst job on examples/sales.csv"
set +e
"$bin/submit" run --nats "$nats_url" --profile csv-analyst \
	--task "Analyse sales.csv: how many units were sold, and which columns matter? Write report.md." \
	--input examples/sales.csv --wait --timeout 5m --output json >"$data/result.json"
rc=$?
set -e
result=$(tail -n 1 "$data/result.json")
echo "== result: $result"
id=$(sed -n 's/.*"id":"\([^"]*\)".*/\1/p' <<<"$result")
if [[ $rc -ne 0 || -z $id ]]; then
	echo "demo: the job did not succeed (exit $rc); worker log: $data/worker.log" >&2
	tail -n 20 "$data/worker.log" >&2
	exit 1
fi
echo
# The report is where the committed manifest says (the attempt's folder); get follows it.
"$bin/submit" get --store "file://$data/store" "$id" --out "$data/result" >/dev/null
echo "== report (submit get $id)"
cat "$data/result/report.md"
echo
echo "== manifest summary (tenants/default/runs/$id/manifest.json)"
"$bin/submit" manifest --store "file://$data/store" "$id"
echo
echo "== verification (signed with the worker's key in $data/keys)"
"$bin/submit" verify --store "file://$data/store" "$id"
echo
echo "== store holds:"
(cd "$data/store" && find "tenants/default/runs/$id" -type f | sort)
