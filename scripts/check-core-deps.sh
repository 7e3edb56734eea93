#!/usr/bin/env bash
# mcs-core stays pure: its normal dependency tree has no runtime, HTTP, Kubernetes client
# or DNS crate (DESIGN.md, dependency rule).
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
