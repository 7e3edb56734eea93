#!/usr/bin/env bash
# The checks a crates.io release needs, run by .ci/run:
#   1. `cargo package` of every published crate (mcs-core, mcs-client, mcs-kube, mcs), with
#      their READMEs and license;
#   2. the packaged crates, as crates.io would serve them, compile on their own: unpacked
#      into a workspace of their own (each depending on the others' packaged sources, not
#      on the repository's), every feature combination (cargo-hack) is checked with the
#      minimum supported Rust version, `rust-version` in Cargo.toml (cargo-hack's
#      --rust-version: the toolchain is installed with rustup when missing).
# Step 2 is `cargo package`'s own verification (which is turned off), made wider: every
# feature combination rather than the default features, on the oldest supported Rust rather
# than the current one, type-checked rather than compiled to machine code. Code generation
# was the expensive part (about 13 minutes of dependencies built in debug mode, cold) and
# finds nothing that type-checking misses in these crates, which have no build script.
# The downstream crates on other Kubernetes versions are scripts/downstream.sh.
# cargo-hack comes from scripts/tools.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/mcs-target}"
PUBLISHED=(mcs-core mcs-client mcs-kube mcs)

# The library crates enable no k8s-openapi version feature (the application picks one), so
# compiling them alone needs one named, the way k8s-openapi documents for libraries.
export K8S_OPENAPI_ENABLED_VERSION=1.35

PACKAGE_TARGET="${MCS_PACKAGE_TARGET:-$HOME/.cache/mcs-target-package}"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
rm -rf "$PACKAGE_TARGET/package"

echo "crate-checks: cargo package (${PUBLISHED[*]})"
args=()
for c in "${PUBLISHED[@]}"; do args+=(-p "$c"); done
CARGO_TARGET_DIR="$PACKAGE_TARGET" cargo package --locked --allow-dirty --no-verify "${args[@]}"

# The packaged crates as a workspace: each one's dependency on another published crate
# (`version = "0.1.0"` in the packaged manifest) is patched to that crate's packaged
# sources. The path stays the same from run to run, so the dependencies' check output in
# $CARGO_TARGET_DIR is reused.
unpacked="$PACKAGE_TARGET/unpacked"
rm -rf "$unpacked"
mkdir -p "$unpacked"
members="" patches=""
for c in "${PUBLISHED[@]}"; do
	tar -xzf "$PACKAGE_TARGET/package/$c-$version.crate" -C "$unpacked"
	# Cargo ignores a dependency's [profile] sections (the root crate has some), and warns
	# about them in a workspace: drop them, as a user's build does.
	sed -i '/^\[profile\./,$d' "$unpacked/$c-$version/Cargo.toml"
	members+="\"$c-$version\", "
	patches+="$c = { path = \"$c-$version\" }"$'\n'
done
cat >"$unpacked/Cargo.toml" <<TOML
[workspace]
resolver = "3"
members = [${members%, }]

[patch.crates-io]
$patches
TOML
# The repository's versions of every dependency; cargo drops what these crates do not use.
cp Cargo.lock "$unpacked/Cargo.lock"

TOOLS=$(scripts/tools.sh cargo-hack | tail -n 1)
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
	echo "crate-checks: installing Rust $msrv (the rust-version of Cargo.toml)"
	rustup toolchain install "$msrv" --profile minimal
fi
echo "crate-checks: every feature combination of the packaged ${PUBLISHED[*]} with Rust $msrv"
# No --no-dev-deps: `cargo check` without --all-targets builds no dev-dependency, and
# resolver 3 keeps their features (k8s-openapi's v1_35) out of the libraries' builds.
(cd "$unpacked" && PATH="$TOOLS:$PATH" cargo hack check --rust-version --feature-powerset --workspace)
