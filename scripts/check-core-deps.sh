#!/usr/bin/env bash
# mcs-core stays pure: its normal dependency tree has no runtime, HTTP, Kubernetes client
# or DNS crate (mcs-core stays pure: no runtime, sockets or clock).
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(cargo tree -p mcs-core -e normal --prefix none --format '{p}')
bad=$(printf '%s\n' "$tree" | awk '{print $1}' | grep -E '^(tokio|hyper|hyper-util|kube-client|kube|kube-runtime|hickory-.*|tonic|reqwest)$' | sort -u || true)
if [ -n "$bad" ]; then
	echo "check-core-deps: mcs-core depends on forbidden crates:" >&2
	printf '  %s\n' $bad >&2
	exit 1
fi
echo "check-core-deps: mcs-core's normal dependencies are pure ($(printf '%s\n' "$tree" | sort -u | wc -l) crates)"

# The libraries leave command lines and global logging to the binaries (crate mcs-cli).
for lib in mcs-core mcs-kube mcs-client; do
	bad=$(cargo tree -p "$lib" -e normal --prefix none --format '{p}' | awk '{print $1}' | grep -E '^(clap|tracing-subscriber)$' | sort -u || true)
	if [ -n "$bad" ]; then
		echo "check-core-deps: the library $lib depends on crates for binaries (they belong in mcs-cli):" >&2
		printf '  %s\n' $bad >&2
		exit 1
	fi
done
echo "check-core-deps: no library depends on clap or tracing-subscriber"

# mcs-client balances HTTP without the Kubernetes API types (mcs-core without `api`).
bad=$(cargo tree -p mcs-client --all-features -e normal --prefix none --format '{p}' | awk '{print $1}' | grep -E '^(k8s-openapi|kube-core|kube)$' | sort -u || true)
if [ -n "$bad" ]; then
	echo "check-core-deps: mcs-client depends on Kubernetes API crates:" >&2
	printf '  %s\n' $bad >&2
	exit 1
fi
echo "check-core-deps: mcs-client has no Kubernetes API crates"

# Only the application picks a k8s-openapi version feature: no library crate enables one
# (scripts/downstream.sh builds the libraries with other versions as well).
features=$(cargo tree -p mcs -p mcs-core -p mcs-kube -p mcs-client --all-features -e normal,features \
	-i k8s-openapi --prefix none | sed -n 's/^k8s-openapi feature "\(.*\)"$/\1/p' | sort -u)
if printf '%s\n' "$features" | grep -qE '^(v1_[0-9]+|latest|earliest)$'; then
	echo "check-core-deps: a library crate enables a k8s-openapi version feature:" $features >&2
	exit 1
fi
echo "check-core-deps: no library enables a k8s-openapi version feature ($(echo $features))"
