#!/usr/bin/env bash
# The cargo tools the checks use, each at a pinned version, installed from crates.io into
# ~/.cache/mcs-tools (MCS_TOOLS) when missing or at another version; prints the folder
# holding their binaries (its last line).
#
#   scripts/tools.sh                 # all of them
#   scripts/tools.sh cargo-deny ...  # some of them
#
# cargo-cyclonedx (scripts/release.sh), cargo-deny (scripts/deny.sh), cargo-fuzz
# (scripts/fuzz.sh), cargo-hack (scripts/crate-checks.sh). Each is compiled from source the
# first time (all four: 5 min 37 s on 2 cores, 7 min before the settings below); .ci/beside
# installs them beside the test suite.
# Two installs at once wait for each other (cargo locks the install root).
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="${MCS_TOOLS:-$HOME/.cache/mcs-tools}"

declare -A VERSIONS=(
	[cargo-cyclonedx]=0.5.9
	[cargo-deny]=0.20.2
	[cargo-fuzz]=0.13.2
	[cargo-hack]=0.6.46
)

# The version a tool reports, as `cargo <sub> --version` prints it.
installed_version() {
	local sub=${1#cargo-}
	"$TOOLS/bin/$1" "$sub" --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1
}

want=("$@")
[ ${#want[@]} -gt 0 ] || want=("${!VERSIONS[@]}")
build=""
trap 'if [ -n "$build" ]; then rm -rf "$build"; fi' EXIT
for tool in "${want[@]}"; do
	version=${VERSIONS[$tool]:-}
	if [ -z "$version" ]; then
		echo "tools: unknown tool $tool; known: ${!VERSIONS[*]}" >&2
		exit 2
	fi
	if [ "$(installed_version "$tool")" != "$version" ]; then
		echo "tools: installing $tool $version into $TOOLS" >&2
		# One build folder for the tools of this run, so the dependencies they share (clap,
		# serde, syn, cargo_metadata, ...) compile once; never the workspace's target, which
		# a test build may hold. Without the tools' own release settings (cargo-deny's fat
		# LTO and one codegen unit, cargo-hack's LTO): those make small, fast binaries for
		# distribution and cost minutes of a cold CI run; these tools run for seconds.
		[ -n "$build" ] || build=$(mktemp -d)
		CARGO_TARGET_DIR="$build" CARGO_PROFILE_RELEASE_LTO=false \
			CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_OPT_LEVEL=1 \
			CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_INCREMENTAL=false \
			cargo install --locked --quiet --root "$TOOLS" "$tool@$version" >&2
	fi
done
echo "$TOOLS/bin"
