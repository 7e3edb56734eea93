#!/usr/bin/env bash
# Dependency policy (deny.toml): licenses, bans and sources, with cargo-deny.
#
#   scripts/deny.sh
#
# cargo-deny comes from scripts/tools.sh (a few minutes of compiling the first time).
# Advisories are not checked here: the RustSec database lives on GitHub, which CI cannot
# reach. Where it can: `cargo deny check advisories`.
set -euo pipefail
cd "$(dirname "$0")/.."
PATH="$(scripts/tools.sh cargo-deny | tail -n 1):$PATH"
export PATH
# Duplicate versions are warnings (deny.toml); print errors only.
cargo deny --log-level error check licenses bans sources
echo "deny: licenses, bans and sources ok"
