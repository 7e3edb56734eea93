#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ for a bounded time each.
#
#   scripts/fuzz.sh                    # every target, 60 s each
#   scripts/fuzz.sh all <seconds>      # every target, <seconds> each
#   scripts/fuzz.sh --smoke            # every target, 10 s each (what CI runs)
#   scripts/fuzz.sh --build            # build every target, run none (CI, beside the tests)
#   scripts/fuzz.sh <target> [seconds] # one target (default 60 s)
#   scripts/fuzz.sh --list             # the target names
#
# Targets: names, reasons, decode, merge, fold, dns (see docs/testing.md, "Fuzzing").
#
# cargo-fuzz comes from scripts/tools.sh. It builds with the stable
# toolchain (RUSTC_BOOTSTRAP=1 unlocks the -Z flags cargo-fuzz passes), address sanitizer
# on, debug assertions and overflow checks on. Build output goes to
# ~/.cache/mcs-fuzz-target (MCS_FUZZ_TARGET_DIR overrides it). Each target starts from the
# seed corpus in fuzz/corpus/<target>/ (read only) and grows a scratch corpus in
# ~/.cache/mcs-fuzz/corpus/<target>/, so runs never dirty the tree and later runs on the
# same machine start where earlier ones stopped. A crash leaves its input in
# fuzz/artifacts/<target>/ (ignored by git), prints the reproduction command and fails the
# script. The last lines are the executions per target and their total.
set -euo pipefail
cd "$(dirname "$0")/.."

STATE="$HOME/.cache/mcs-fuzz"
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${MCS_FUZZ_TARGET_DIR:-$HOME/.cache/mcs-fuzz-target}"
export CARGO_TERM_COLOR=never

mapfile -t ALL < <(sed -n 's/^name = "\([a-z_]*\)"$/\1/p' fuzz/Cargo.toml | grep -vx mcs-fuzz)

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

seconds=60
targets=("${ALL[@]}")
case "${1:-}" in
	"") ;;
	all) seconds="${2:-60}" ;;
	--smoke)
		seconds=10
		# A fresh scratch corpus: a smoke run starts from the seeds, so its time stays
		# bounded however much longer runs have grown the cached corpus.
		STATE=$(mktemp -d)
		trap 'rm -rf "$STATE"' EXIT
		;;
	--build) seconds=0 ;;
	--list) printf '%s\n' "${ALL[@]}"; exit 0 ;;
	-h|--help) usage ;;
	-*) usage ;;
	*)
		if ! printf '%s\n' "${ALL[@]}" | grep -qx "$1"; then
			echo "fuzz: unknown target $1; targets: ${ALL[*]}" >&2
			exit 2
		fi
		targets=("$1")
		seconds="${2:-60}"
		;;
esac
case "$seconds" in
	''|*[!0-9]*) echo "fuzz: seconds must be a whole number, got $seconds" >&2; exit 2 ;;
esac

PATH="$(scripts/tools.sh cargo-fuzz | tail -n 1):$PATH"
export PATH

# Every checkout (each CI clone is a new path) builds mcs-core and the fuzz targets afresh,
# under new names in the shared target; remove earlier checkouts' builds of them so the
# target does not grow by ~200 MB a run. Their dependencies stay cached. MCS_FUZZ_PRUNE=0
# keeps them: CI sets it when it runs what `--build` built for this checkout.
if [ "${MCS_FUZZ_PRUNE:-1}" != 0 ]; then
	cargo clean --manifest-path fuzz/Cargo.toml --release --target "$(rustc -vV | sed -n 's/^host: //p')" \
		-p mcs-core -p mcs-fuzz --quiet
fi

echo "fuzz: building ${targets[*]} ($(cargo fuzz --version), $(rustc --version))"
start=$(date +%s)
if [ "${#targets[@]}" -eq "${#ALL[@]}" ]; then
	(cd fuzz && cargo fuzz build)
else
	(cd fuzz && cargo fuzz build "${targets[0]}")
fi
echo "fuzz: built in $(( $(date +%s) - start )) s; ${seconds} s per target"
[ "$seconds" = 0 ] && exit 0

mkdir -p "$STATE/logs"
total=0
failed=()
summary=()
for t in "${targets[@]}"; do
	scratch="$STATE/corpus/$t"
	log="$STATE/logs/$t.log"
	mkdir -p "$scratch" "fuzz/corpus/$t"
	echo "fuzz: $t for ${seconds} s (log: $log)"
	status=0
	# The scratch corpus comes first: libFuzzer writes new inputs only to the first one.
	(cd fuzz && cargo fuzz run "$t" "$scratch" "corpus/$t" -- \
		-max_total_time="$seconds" -print_final_stats=1 -timeout=25 -rss_limit_mb=2048 \
		>"$log" 2>&1) || status=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
	execs=${execs:-0}
	corpus=$(find "$scratch" -type f | wc -l)
	total=$((total + execs))
	if [ "$status" -ne 0 ]; then
		failed+=("$t")
		summary+=("$(printf '%-8s %12s executions  %4s s  corpus %5s  FAILED (exit %s)' \
			"$t" "$execs" "$seconds" "$corpus" "$status")")
		echo "fuzz: $t FAILED; the end of its log:"
		tail -n 60 "$log"
		grep -h 'Test unit written to\|cargo fuzz run' "$log" | sed 's/^/fuzz:   /' || true
	else
		summary+=("$(printf '%-8s %12s executions  %4s s  corpus %5s' \
			"$t" "$execs" "$seconds" "$corpus")")
	fi
done

echo
echo "fuzz: results"
printf '%s\n' "${summary[@]}"
printf '%-8s %12s executions\n' total "$total"
if [ "${#failed[@]}" -gt 0 ]; then
	echo "fuzz: crashes in ${failed[*]}; inputs are in fuzz/artifacts/<target>/" >&2
	exit 1
fi
