#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a warm one.
#
#   scripts/test.sh            # everything: builds what the tests need, then cargo test
#   scripts/test.sh -p mcs-core  # extra arguments go to `cargo test`
#
# Run it as root (the dataplane and image tests need it). It installs or builds what the
# integration tests need, only when missing:
#   - kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kube-proxy and kubectl,
#     built from Go modules into
#     ~/.cache/mcs-k8s (scripts/k8s-bins.sh; cold build ~20 min, warm: instant);
#   - kwok v0.8.0 (with its Stage objects) and CoreDNS v1.15.0, built the same way
#     (scripts/kwok-coredns-bins.sh; cold ~6 min, warm: instant), exported as
#     MCS_KWOK_BIN, MCS_KWOK_STAGES and MCS_COREDNS_BIN;
#   - helm 3 and helm 4, built from their Go modules into ~/.cache/mcs-helm
#     (scripts/helm-bins.sh; cold ~5 min, warm: instant), exported as MCS_HELM3 and
#     MCS_HELM4 for the chart tests;
#   - dig (Debian's bind9-dnsutils) for the DNS tests;
#   - nft and ip (Debian's nftables, iproute2) for the dataplane tests (kube-proxy in
#     nftables mode in network namespaces; they run as root);
#   - umoci, skopeo and runc (Debian's packages) for the image test (scripts/image.sh
#     builds the image from the test build's binaries; runc runs it, as root);
#   - containerd (with ctr), the CNI plugins (containernetworking-plugins), a static
#     busybox (busybox-static) and a static libc (libc6-dev) for the real-node tests:
#     kubelet (built with the other Kubernetes binaries) and containerd run Pods in the
#     lab's network namespaces, from images the harness builds (a static pause, busybox).
# Tests that need these fail loudly when they are missing; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/test-env.sh
. scripts/test-env.sh

cargo test --workspace --all-features "$@"
