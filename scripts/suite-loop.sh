#!/usr/bin/env bash
# The whole test suite (scripts/test.sh) run after run on a loaded machine: how the
# "ten runs in a row without a failure" check is made.
#
#   scripts/suite-loop.sh            # 10 runs of HEAD, with a release build as load
#   scripts/suite-loop.sh 3 --no-load
#
# It clones HEAD into ~/.cache/mcs-suite-loop/src (so the checkout can change meanwhile) with
# its own target dir, builds the tests once, then runs scripts/test.sh the given number of
# times. Unless --no-load, once the tests are built, a second clone is built in release mode
# with one job, over and over, for as long as the runs last (what "a parallel build running"
# means here). Each run's log is kept in ~/.cache/mcs-suite-loop/run-N.log; one line a run
# (exit code, seconds, test binaries, tests passed and failed, load average) goes to
# ~/.cache/mcs-suite-loop/summary.txt and to stdout. CARGO_TARGET_DIR, if set, is the tests'
# target dir. It goes on after a failed run, and each run after a failed test binary
# (cargo test --no-fail-fast), so that one loop shows every flaky test; it ends with the runs
# and failures of each test binary (also in summary.txt); the exit code is
# non-zero if any run failed.
#
# Run one loop per machine at a time: mcs-client's tests bind fixed loopback addresses, so
# two suites side by side collide. Budget ~16-20 min a run on 2 cores under this load, and
# ~20 GB of disk for the two target dirs.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-10}
load=yes
[ "${2:-}" = "--no-load" ] && load=no

base="$HOME/.cache/mcs-suite-loop"
mkdir -p "$base"
rm -rf "$base/src" "$base/load-src" "$base/stop"
git clone -q . "$base/src"
commit=$(git -C "$base/src" rev-parse --short HEAD)
summary="$base/summary.txt"
echo "suite-loop: $runs run(s) of $commit, load: $load, started $(date -u +%FT%TZ)" | tee -a "$summary"

# The load and each step run in process groups of their own (job control), so that an
# interrupted loop stops all of them; `wait` lets the traps run at once.
load_pid=""
step_pid=""
cleanup() {
	touch "$base/stop"
	for pid in $step_pid $load_pid; do
		kill -- "-$pid" 2>/dev/null || true
	done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Runs "$@" in its own process group and waits for it; returns its exit code.
step() {
	set -m
	"$@" &
	step_pid=$!
	set +m
	local rc=0
	wait "$step_pid" || rc=$?
	step_pid=""
	return "$rc"
}

cd "$base/src"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$base/target}"
step cargo test --workspace --all-features --no-run >"$base/build.log" 2>&1
if [ "$load" = yes ]; then
	# The load starts once the tests are built: it is there for the runs, and it would only
	# slow the build down.
	git clone -q "$base/src" "$base/load-src"
	# A release build of the workspace with one job, from mcs-core up, again and again.
	set -m
	(
		set +m # one process group for the whole load
		cd "$base/load-src"
		export CARGO_TARGET_DIR="$base/target-load"
		while [ ! -e "$base/stop" ]; do
			touch mcs-core/src/lib.rs
			cargo build --release -j 1 --workspace --all-targets >"$base/load-last.log" 2>&1 || true
		done
	) &
	load_pid=$!
	set +m
fi

# Each test binary of a run's log and its result: "<crate>/<target> ok|FAILED" (a binary is
# named by the "Running" line before its "test result" line).
binary_results() {
	awk '/ Running (unittests|tests|benches|examples)/ {bin = $0; sub(/.* Running /, "", bin); sub(/ .*/, "", bin); if (bin == "unittests") {bin = $0; sub(/.* Running unittests /, "", bin); sub(/ .*/, "", bin)}}
		/ Running .*\/deps\// {match($0, /deps\/[^ )]*-[0-9a-f]+\)/); id = substr($0, RSTART + 5, RLENGTH - 23)}
		/test result: / {r = $0; sub(/.*test result: /, "", r); print id ":" bin, (r ~ /^ok/ ? "ok" : "FAILED")}' "$1"
}

failed_runs=0
for i in $(seq 1 "$runs"); do
	start=$(date +%s)
	rc=0
	step scripts/test.sh --no-fail-fast >"$base/run-$i.log" 2>&1 || rc=$?
	end=$(date +%s)
	passed=$(grep -E '^test result:' "$base/run-$i.log" | awk '{s+=$4} END {print s+0}')
	failed=$(grep -E '^test result:' "$base/run-$i.log" | awk '{s+=$6} END {print s+0}')
	bins=$(grep -cE '^test result:' "$base/run-$i.log" || true)
	[ "$rc" = 0 ] || failed_runs=$((failed_runs + 1))
	echo "run $i $commit rc=$rc $((end - start))s binaries=$bins passed=$passed failed=$failed" \
		"loadavg=$(cut -d' ' -f1-3 /proc/loadavg) end $(date -u +%T)" \
		"failed binaries: $(binary_results "$base/run-$i.log" | awk '$2 == "FAILED" {printf "%s ", $1}')" |
		tee -a "$summary"
done
echo "suite-loop: $((runs - failed_runs)) of $runs run(s) passed; runs and failures per test binary:" |
	tee -a "$summary"
for i in $(seq 1 "$runs"); do binary_results "$base/run-$i.log"; done |
	awk '{ran[$1]++} $2 == "FAILED" {failed[$1]++}
		END {for (b in ran) printf "  %-40s %3d run(s) %3d failed\n", b, ran[b], failed[b]}' |
	sort | tee -a "$summary"
[ "$failed_runs" = 0 ]
