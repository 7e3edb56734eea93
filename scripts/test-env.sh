# What the integration tests need, made ready and exported (see scripts/test.sh, which
# sources it, for the list): sourced from the repository's root by scripts/test.sh and
# scripts/playground.sh.

if [ "$(id -u)" != 0 ]; then
	echo "test: the suite runs as root: the dataplane tests make network namespaces and" >&2
	echo "test: nftables rules, the image test runs runc. Run it as root (sudo -E $0), or one" >&2
	echo "test: package without those tests: cargo test -p mcs-core (see docs/testing.md)." >&2
	exit 1
fi

MCS_K8S_BIN=$(scripts/k8s-bins.sh | tail -n 1)
export MCS_K8S_BIN
echo "test: Kubernetes binaries in $MCS_K8S_BIN"

EXTRA_BIN=$(scripts/kwok-coredns-bins.sh | tail -n 1)
export MCS_KWOK_BIN="$EXTRA_BIN/kwok" MCS_KWOK_STAGES="$EXTRA_BIN/kwok-stages.yaml"
export MCS_COREDNS_BIN="$EXTRA_BIN/coredns"
echo "test: kwok, its stages and CoreDNS in $EXTRA_BIN"

HELMS=$(scripts/helm-bins.sh | tail -n 2)
MCS_HELM3=$(echo "$HELMS" | head -n 1)
MCS_HELM4=$(echo "$HELMS" | tail -n 1)
export MCS_HELM3 MCS_HELM4
echo "test: helm in $MCS_HELM3 and $MCS_HELM4"

# Debian's packages for the tools the tests run, installed when missing (a tool is a
# command, or a file when it has a slash).
need() {
	local tool=$1 package=$2 why=$3
	if { [ "${tool#*/}" = "$tool" ] && ! command -v "$tool" >/dev/null 2>&1; } ||
		{ [ "${tool#*/}" != "$tool" ] && [ ! -e "$tool" ]; }; then
		echo "test: installing $package ($why)"
		apt-get update -qq >/dev/null
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null
	fi
}
need dig bind9-dnsutils "dig, for the DNS tests"
need nft nftables "for kube-proxy in the dataplane tests"
need ip iproute2 "for the dataplane tests"
need umoci umoci "for the image test"
need skopeo skopeo "for the image test"
need runc runc "for the image test and the real nodes"
need containerd containerd "for the real nodes"
need /usr/lib/cni/bridge containernetworking-plugins "for the real nodes' Pod networks"
need /bin/busybox busybox-static "for the real nodes' test image"
need /usr/lib/x86_64-linux-gnu/libc.a libc6-dev "to build the real nodes' pause image"
