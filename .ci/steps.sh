# Sourced by .ci/run and .ci/beside: `step NAME` starts a step (a header line with the
# time); at exit, pass or fail, a table of every step and how long it took is printed.
# STEP_MARK is the header's prefix ("=== ci" by default).

STEP_NAMES=() STEP_STARTS=()
step() {
	STEP_NAMES+=("$*") STEP_STARTS+=("$(date +%s)")
	echo; echo "${STEP_MARK:-=== ci}: $* ($(date -u +%H:%M:%S))"
}
summary() {
	# The exit status is the argument (from a trap's function) or $? (`trap summary EXIT`).
	local rc=${1:-$?} end i n=${#STEP_NAMES[@]} took mark
	end=$(date +%s)
	echo
	echo "${STEP_MARK:-=== ci}: time per step ($([ "$rc" = 0 ] && echo passed || echo "FAILED, exit $rc"))"
	for ((i = 0; i < n; i++)); do
		if ((i + 1 < n)); then took=$((STEP_STARTS[i + 1] - STEP_STARTS[i])); else took=$((end - STEP_STARTS[i])); fi
		if [ "$rc" != 0 ] && ((i + 1 == n)); then mark="FAILED"; else mark="ok"; fi
		printf '%6ds  %-6s  %s\n' "$took" "$mark" "${STEP_NAMES[i]}"
	done
	if ((n > 0)); then printf '%6ds  total\n' "$((end - STEP_STARTS[0]))"; fi
}
