#!/usr/bin/env bash
# The checks a crates.io release needs, run by .ci/run:
#   1. `cargo package` of every published crate (mcs-core, mcs-client, mcs-kube, mcs): the
#      packaged sources build on their own, with their READMEs and license;
#   2. every feature combination of the library crates builds (cargo-hack), with the
#      minimum supported Rust version, `rust-version` in Cargo.toml (cargo-hack's
#      --rust-version: the toolchain is installed with rustup when missing).
# The downstream crates on other Kubernetes versions are scripts/downstream.sh.
# cargo-hack comes from scripts/tools.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/mcs-target}"
PUBLISHED=(mcs-core mcs-client mcs-kube mcs)

# The library crates enable no k8s-openapi version feature (the application picks one), so
# building them alone needs one named, the way k8s-openapi documents for libraries.
export K8S_OPENAPI_ENABLED_VERSION=1.35

# cargo package verifies each crate against the others through a local registry. Cargo
# takes a registry crate of a given version to be immutable: it extracts its sources once
# under $CARGO_HOME/registry/src and reuses what it compiled of it, so a second run at the
# same version would build against the first run's mcs-core. The packages build in a target
# directory of their own, and every run first removes our crates' extracted sources and
# build output there (their dependencies stay cached).
CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
PACKAGE_TARGET="${MCS_PACKAGE_TARGET:-$HOME/.cache/mcs-target-package}"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
for c in "${PUBLISHED[@]}"; do
	rm -rf "$CARGO_HOME"/registry/src/*/"$c-$version" "$CARGO_HOME"/registry/cache/*/"$c-$version.crate"
done
rm -rf "$PACKAGE_TARGET/package" "$PACKAGE_TARGET"/debug/.fingerprint/mcs-* \
	"$PACKAGE_TARGET"/debug/deps/libmcs_* "$PACKAGE_TARGET"/debug/deps/mcs_* "$PACKAGE_TARGET"/debug/build/mcs-*

echo "crate-checks: cargo package (${PUBLISHED[*]})"
args=()
for c in "${PUBLISHED[@]}"; do args+=(-p "$c"); done
CARGO_TARGET_DIR="$PACKAGE_TARGET" cargo package --locked --allow-dirty "${args[@]}"

TOOLS=$(scripts/tools.sh cargo-hack | tail -n 1)
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
	echo "crate-checks: installing Rust $msrv (the rust-version of Cargo.toml)"
	rustup toolchain install "$msrv" --profile minimal
fi
echo "crate-checks: every feature combination of ${PUBLISHED[*]} with Rust $msrv"
# No --no-dev-deps: it makes cargo-hack edit the manifests in place while it runs (and put
# them back at the end), which loses edits made meanwhile. It is not needed: `cargo check`
# without --all-targets builds no dev-dependency, and resolver 3 keeps their features
# (k8s-openapi's v1_35) out of the libraries' builds.
PATH="$TOOLS:$PATH" cargo hack check --rust-version --feature-powerset "${args[@]}"
