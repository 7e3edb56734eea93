#!/usr/bin/env bash
# Builds and tests the downstream check crates (downstream/README.md): projects outside
# the workspace that depend on mcs-core and mcs-kube with k8s-openapi's `v1_33` and
# `latest`, while the workspace builds with `v1_35`. A library crate of mcs that enabled a
# version feature itself would make these builds fail ("Both v1_35 and v1_33 features are
# enabled on the k8s-openapi crate").
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/mcs-target}"
# A version named in the environment would be a second one for these builds.
unset K8S_OPENAPI_ENABLED_VERSION

for crate in downstream/k8s-1-33 downstream/k8s-latest; do
	echo "downstream: cargo test in $crate"
	# The workspace's lock file is the starting point: the same versions as the workspace
	# (so the two crates reuse each other's compiled dependencies where the features agree),
	# and no second lock file to keep in step. Cargo drops the packages these crates do not use.
	cp Cargo.lock "$crate/Cargo.lock"
	cargo test --manifest-path "$crate/Cargo.toml"
done
