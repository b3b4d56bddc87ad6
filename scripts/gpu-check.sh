#!/usr/bin/env bash
# gpu-check.sh: run kiln on a real GPU machine and compare what it finds with
# nvidia-smi, then measure the GPUs' links with kiln bench and judge them
# against their ratings. It never changes a GPU setting (no nvidia-smi -pm,
# -r, -mig, -pl, -ac or the like; nvidia-smi is only asked to print; kiln
# bench only allocates memory and copies).
#
# Usage: scripts/gpu-check.sh
#
# Environment:
#   OUT       when set, results are written there: summary.txt, inventory.json,
#             topo.txt, doctor.json, doctor-from.json, nvidia-smi-q.xml,
#             nvidia-smi-topo.txt, bundle.tar.gz (the record bundle),
#             bench.json, bench.txt, bench-record.json (kiln bench --record)
#             and doctor-bench.json (kiln doctor on that record)
#   KILN_BIN  use this kiln binary instead of building one with go
#   STEP_TIMEOUT  seconds each step may take (default 180)
#   BENCH_ARGS    more arguments for kiln bench (default none; for example
#                 "--size 64MiB -n 5" for a quicker run)
#
# Exit status: 0 when every step ran (doctor findings and figures below
# their rating are not failures), 1 when a step failed: build error, kiln
# could not run, or a crash.

set -u -o pipefail

STEP_TIMEOUT=${STEP_TIMEOUT:-180}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
out=${OUT:-}
if [[ -n $out ]]; then
	mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
	dest=$out
else
	dest=$work
fi

steps=()  # "name|seconds|rc|status" per step
failed=0

now() {
	if [[ -n ${EPOCHREALTIME:-} ]]; then
		printf '%s\n' "${EPOCHREALTIME/,/.}"
	else
		date +%s.%N
	fi
}

# run_step NAME OUTFILE ACCEPT CMD...: runs CMD with its stdout in OUTFILE and
# its stderr in $work/NAME.err, timed. ACCEPT is the highest exit status that
# still counts as a run (kiln doctor exits 1 or 2 for findings).
run_step() {
	local name=$1 outfile=$2 accept=$3
	shift 3
	local t0 t1 rc=0 status
	t0=$(now)
	if command -v timeout >/dev/null 2>&1; then
		timeout "$STEP_TIMEOUT" "$@" >"$outfile" 2>"$work/$name.err" || rc=$?
	else
		"$@" >"$outfile" 2>"$work/$name.err" || rc=$?
	fi
	t1=$(now)
	if ((rc == 0)); then
		status=ok
	elif ((rc <= accept)); then
		status=findings
	elif ((rc == 124)); then
		status="FAIL (timed out after ${STEP_TIMEOUT}s)"
		failed=1
	else
		status="FAIL"
		failed=1
	fi
	steps+=("$name|$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')|$rc|$status")
	if [[ $status == FAIL* ]]; then
		printf 'gpu-check: step %s failed (exit %d):\n' "$name" "$rc" >&2
		tail -n 20 "$work/$name.err" >&2
	fi
	return 0
}

skip_step() {
	steps+=("$1|-|-|skipped: $2")
}

# count_json_key FILE KEY: how many times "KEY" appears as a key in FILE.
count_json_key() {
	[[ -s $1 ]] || { echo "-"; return; }
	grep -o "\"$2\"[[:space:]]*:" "$1" | wc -l | tr -d ' '
}

# gpus_in_snapshot FILE: the number of GPUs in a kiln snapshot JSON.
gpus_in_snapshot() {
	local f=$1
	[[ -s $f ]] || { echo "-"; return; }
	if command -v python3 >/dev/null 2>&1; then
		python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1])).get("gpus") or []))' "$f" 2>/dev/null || echo "?"
	elif command -v jq >/dev/null 2>&1; then
		jq '.gpus // [] | length' "$f" 2>/dev/null || echo "?"
	else
		# Every GPU has a "vendor" key; PCI devices do not.
		count_json_key "$f" vendor
	fi
}

# pcie_table FILE: one line per GPU of a kiln snapshot: address, model,
# PCIe generation and width, current / max.
pcie_table() {
	local f=$1
	[[ -s $f ]] || return 0
	if command -v python3 >/dev/null 2>&1; then
		python3 - "$f" <<'PY' 2>/dev/null || echo "  (inventory.json could not be read)"
import json, sys
s = json.load(open(sys.argv[1]))
for g in s.get("gpus") or []:
    p = g.get("pcie") or {}
    v = lambda k: str(p.get(k) or "?")
    print("  %-3s %-13s %-28s Gen%s/%s x%s/%s" % (g.get("index", "?"), g.get("pci_address") or "-",
          (g.get("model") or "-")[:28], v("current_gen"), v("max_gen"), v("current_width"), v("max_width")))
PY
	elif command -v jq >/dev/null 2>&1; then
		jq -r '.gpus[]? | "  \(.index) \(.pci_address // "-") \(.model // "-") Gen\(.pcie.current_gen // "?")/\(.pcie.max_gen // "?") x\(.pcie.current_width // "?")/\(.pcie.max_width // "?")"' "$f"
	else
		echo "  (python3 or jq needed to print kiln's PCIe table)"
	fi
}

# bench_table FILE: the short table of a kiln bench JSON report: each GPU's
# host link (pinned memory on its own NUMA node) and memory, the slowest and
# the fastest GPU pair one way and both ways, the collectives; each figure
# beside its rating with the ratio and verdict.
bench_table() {
	local f=$1
	[[ -s $f ]] || { echo "  (no kiln bench results)"; return 0; }
	if ! command -v python3 >/dev/null 2>&1; then
		echo "  (python3 needed to print the bench table; see bench.txt)"
		return 0
	fi
	python3 - "$f" <<'PY' 2>/dev/null || echo "  (bench.json could not be read)"
import json, sys
r = json.load(open(sys.argv[1]))
res = r.get("results") or []
unit = {"bidi": "GB/s (bidi)", "read+write": "GB/s (r+w)", "bus": "GB/s (bus)"}
def fig(v, d):
    return "-" if not v else "%.1f %s" % (v, unit.get(d, "GB/s (uni)"))
rows = []
for m in res:
    t = m.get("test")
    if t in ("h2d", "d2h") and m.get("memory") == "pinned" and m.get("host_local") is not False:
        rows.append(m)
    elif t == "device" or t in ("all-reduce", "all-gather", "reduce-scatter"):
        rows.append(m)
for t in ("p2p", "p2p-bidi"):
    pairs = sorted([m for m in res if m.get("test") == t and m.get("median_gbps")], key=lambda m: m["median_gbps"])
    rows += pairs[:1] + pairs[-1:] if len(pairs) > 1 else pairs
lat = sorted([m for m in res if m.get("test") == "p2p-latency" and m.get("median_us")], key=lambda m: m["median_us"])
print("  threshold %s%%, median of %s runs, %s below rating, %s failed" % (
    r.get("threshold_percent"), max([m.get("repetitions", 0) for m in res] or [0]),
    sum(m.get("verdict") == "below-rating" for m in res), sum(m.get("verdict") == "failed" for m in res)))
print("  %-14s %-26s %-18s %-18s %6s  %s" % ("test", "link", "measured", "rated", "ratio", "verdict"))
for m in rows:
    d = m.get("direction")
    ratio = "%.0f%%" % (100 * m["ratio"]) if m.get("ratio") else "-"
    print("  %-14s %-26s %-18s %-18s %6s  %s" % (m.get("test"), (m.get("link") or "-")[:26], fig(m.get("median_gbps"), d),
          fig(m.get("rated_gbps"), d), ratio, m.get("verdict")))
if lat:
    print("  p2p latency (8-byte copy): %.2f to %.2f us" % (lat[0]["median_us"], lat[-1]["median_us"]))
for n in r.get("notes") or []:
    print("  note: " + n)
PY
}

# severities FILE: "critical N, warning N, info N" from a doctor JSON report.
severities() {
	local f=$1
	[[ -s $f ]] || { echo "-"; return; }
	local c w i
	c=$(grep -o '"severity"[[:space:]]*:[[:space:]]*"critical"' "$f" | wc -l | tr -d ' ')
	w=$(grep -o '"severity"[[:space:]]*:[[:space:]]*"warning"' "$f" | wc -l | tr -d ' ')
	i=$(grep -o '"severity"[[:space:]]*:[[:space:]]*"info"' "$f" | wc -l | tr -d ' ')
	echo "critical $c, warning $w, info $i"
}

# --- build -----------------------------------------------------------------
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
kiln=${KILN_BIN:-}
if [[ -n $kiln ]]; then
	if [[ ! -x $kiln ]]; then
		echo "gpu-check: KILN_BIN=$kiln is not an executable file" >&2
		exit 1
	fi
	skip_step build "KILN_BIN=$kiln"
else
	kiln=/tmp/kiln
	export CGO_ENABLED=1
	export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
	run_step build "$work/build.out" 0 go build -o "$kiln" ./cmd/kiln
	if ((failed)); then
		echo "gpu-check: cannot build kiln; nothing else to run" >&2
		exit 1
	fi
fi

# --- kiln on the live machine ------------------------------------------------
run_step inventory "$dest/inventory.json" 0 "$kiln" inventory -o json
run_step inventory-sysfs "$work/inventory-sysfs.json" 0 "$kiln" inventory --no-nvml -o json
run_step topo "$dest/topo.txt" 0 "$kiln" topo
run_step doctor "$dest/doctor.json" 2 "$kiln" doctor -o json
run_step record "$work/record.out" 0 "$kiln" inventory --record "$dest/bundle"

# --- nvidia-smi, when present, and the doctor on its captures ---------------
smi_gpus="-"
if command -v nvidia-smi >/dev/null 2>&1; then
	run_step nvidia-smi-q "$dest/nvidia-smi-q.xml" 0 nvidia-smi -q -x
	run_step nvidia-smi-topo "$dest/nvidia-smi-topo.txt" 0 nvidia-smi topo -m
	run_step nvidia-smi-L "$work/nvidia-smi-L.txt" 0 nvidia-smi -L
	smi_gpus=$(grep -c '^GPU [0-9]' "$work/nvidia-smi-L.txt")
	from=()
	[[ -s $dest/nvidia-smi-q.xml ]] && from+=(--from "$dest/nvidia-smi-q.xml")
	[[ -s $dest/nvidia-smi-topo.txt ]] && from+=(--from "$dest/nvidia-smi-topo.txt")
	if ((${#from[@]})); then
		run_step doctor-from "$dest/doctor-from.json" 2 "$kiln" doctor -o json "${from[@]}"
	else
		skip_step doctor-from "nvidia-smi printed nothing"
	fi
	run_step nvidia-smi-pcie "$work/nvidia-smi-pcie.csv" 0 nvidia-smi \
		--query-gpu=index,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max \
		--format=csv,noheader
else
	skip_step nvidia-smi "nvidia-smi not installed"
	skip_step doctor-from "no nvidia-smi captures"
fi

# --- kiln bench: measured links beside their ratings ------------------------
# Exit 1 (a figure below its rating) and 2 (a test could not run) still
# leave results to read; 3 means it could not measure at all.
read -r -a bench_args <<<"${BENCH_ARGS:-}"
run_step bench "$dest/bench.json" 2 "$kiln" bench -o json --no-progress --record "$dest/bench-record.json" "${bench_args[@]}"
if [[ -s $dest/bench-record.json ]]; then
	run_step bench-text "$dest/bench.txt" 2 "$kiln" bench --from "$dest/bench-record.json"
	run_step doctor-bench "$dest/doctor-bench.json" 2 "$kiln" doctor -o json --from "$dest/bench-record.json"
else
	skip_step bench-text "kiln bench recorded nothing"
	skip_step doctor-bench "kiln bench recorded nothing"
fi

# The bundle comes back as one archive.
nvml_gpus="-"
if [[ -d $dest/bundle ]]; then
	if [[ -f $dest/bundle/nvml.json ]]; then
		nvml_gpus=$(count_json_key "$dest/bundle/nvml.json" pci_bus_id)
	else
		nvml_gpus="0 (no nvml.json: NVML not available)"
	fi
	if [[ -n $out ]]; then
		tar -czf "$out/bundle.tar.gz" -C "$out" bundle && rm -rf "$out/bundle"
	fi
fi

# --- summary ------------------------------------------------------------------
summary() {
	echo "== kiln gpu-check on $(hostname 2>/dev/null || echo '?') at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo
	echo "GPUs found"
	printf '  %-22s %s\n' "sysfs (kiln --no-nvml)" "$(gpus_in_snapshot "$work/inventory-sysfs.json")"
	printf '  %-22s %s\n' "NVML (record bundle)" "$nvml_gpus"
	printf '  %-22s %s\n' "kiln inventory" "$(gpus_in_snapshot "$dest/inventory.json")"
	printf '  %-22s %s\n' "nvidia-smi -L" "$smi_gpus"
	echo
	echo "PCIe per GPU (kiln: current/max)"
	pcie_table "$dest/inventory.json"
	if [[ -s $work/nvidia-smi-pcie.csv ]]; then
		echo "PCIe per GPU (nvidia-smi: index, bus id, gen cur, gen max, width cur, width max)"
		sed 's/^/  /' "$work/nvidia-smi-pcie.csv"
	fi
	echo
	echo "Doctor findings"
	printf '  %-22s %s\n' "live" "$(severities "$dest/doctor.json")"
	printf '  %-22s %s\n' "from nvidia-smi" "$(severities "${dest}/doctor-from.json")"
	printf '  %-22s %s\n' "from kiln bench" "$(severities "${dest}/doctor-bench.json")"
	echo
	echo "kiln bench (measured vs rated)"
	bench_table "$dest/bench.json"
	echo
	echo "Steps"
	printf '  %-16s %8s %4s  %s\n' step seconds rc status
	local s name secs rc status
	for s in "${steps[@]}"; do
		IFS='|' read -r name secs rc status <<<"$s"
		printf '  %-16s %8s %4s  %s\n' "$name" "$secs" "$rc" "$status"
	done
	local e
	for e in "$work"/*.err; do
		[[ -s $e ]] || continue
		echo
		echo "-- stderr of $(basename "$e" .err) (last 15 lines)"
		tail -n 15 "$e"
	done
}

if [[ -n $out ]]; then
	summary | tee "$out/summary.txt"
else
	summary
fi
exit "$failed"
