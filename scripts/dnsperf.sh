#!/usr/bin/env bash
# DNS throughput and latency, mcs-dns against CoreDNS (multicluster option; cache off,
# then cache on), side by side on this machine with dnsperf: one real API server with 100
# imports, the same query file and dnsperf parameters, the servers alternated in each
# round. See mcs-kube/benches/dns_perf.rs for what is measured and how.
#
#   scripts/dnsperf.sh
#   MCS_DNSPERF_SECONDS=20 MCS_DNSPERF_ROUNDS=5 MCS_DNSPERF_QPS=5000 scripts/dnsperf.sh
#
# It installs or builds what it needs, only when missing: dnsperf (Debian's dnsperf),
# the Kubernetes binaries (scripts/k8s-bins.sh) and CoreDNS (scripts/kwok-coredns-bins.sh).
# mcs-dns is built with the bench profile (optimised). The last lines printed are the
# summary table (medians over the rounds) with the qps ratio.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v dnsperf >/dev/null 2>&1; then
	echo "dnsperf: installing dnsperf"
	if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
	$SUDO apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dnsperf >/dev/null
fi

MCS_K8S_BIN=$(scripts/k8s-bins.sh | tail -n 1)
export MCS_K8S_BIN
EXTRA_BIN=$(scripts/kwok-coredns-bins.sh | tail -n 1)
export MCS_COREDNS_BIN="$EXTRA_BIN/coredns"
echo "dnsperf: Kubernetes binaries in $MCS_K8S_BIN, CoreDNS in $EXTRA_BIN"

exec cargo bench -p mcs-kube --bench dns_perf
