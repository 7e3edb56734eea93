#!/usr/bin/env bash
# Dependency policy (deny.toml): licenses, bans and sources, with cargo-deny.
#
#   scripts/deny.sh
#
# Installs cargo-deny into ~/.cache/mcs-tools the first time (a few minutes of compiling).
# Advisories are not checked here: the RustSec database lives on GitHub, which CI cannot
# reach. Where it can: `cargo deny check advisories`.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$HOME/.cache/mcs-tools"
export PATH="$TOOLS/bin:$PATH"
if ! command -v cargo-deny >/dev/null 2>&1; then
	echo "deny: installing cargo-deny into $TOOLS"
	cargo install --locked --quiet --root "$TOOLS" cargo-deny@0.20.2
fi
# Duplicate versions are warnings (deny.toml); print errors only.
cargo deny --log-level error check licenses bans sources
echo "deny: licenses, bans and sources ok"
