#!/usr/bin/env bash
# A ClusterSet on this machine to try mcs by hand, or to debug it: east, west and north, each
# an API server with a real node (kubelet and containerd in a network namespace), mcs
# installed in each with its chart from this checkout's images, and the seed's
# loyalty-accrual running and exported in east (3 Pods) and west (4); in hub mode a fourth
# API server, the hub. It is what the test clusterset_pods starts from.
#
#   scripts/playground.sh          # mesh: each agent reads the other members
#   scripts/playground.sh hub      # hub: each agent reads and writes only the hub
#
# Run as root, like scripts/test.sh (whose setup and build it shares: scripts/test-env.sh,
# the same features). It prints the kubeconfig (contexts east, west, north, hub), the network
# namespace the API servers listen in and commands to try, and keeps everything running
# until Ctrl-C (or SIGTERM), then tears everything down: processes, network namespaces,
# mounts. Its state and log are in ${MCS_PLAYGROUND_DIR:-~/.cache/mcs-playground}; if this
# script itself is killed, `touch <that folder>/stop` stops the clusters.
set -euo pipefail
cd "$(dirname "$0")/.."

topology=${1:-mesh}
case "$topology" in
mesh | hub) ;;
*)
	echo "usage: $0 [mesh|hub]" >&2
	exit 2
	;;
esac

# shellcheck source=scripts/test-env.sh
. scripts/test-env.sh

dir=${MCS_PLAYGROUND_DIR:-$HOME/.cache/mcs-playground}
rm -rf "$dir"
mkdir -p "$dir"
export MCS_PLAYGROUND_DIR="$dir" MCS_PLAYGROUND_TOPOLOGY="$topology"

echo "playground: building (the seed's programs, mcs-agent, kubectl-mcs, the test)"
cargo build --workspace --all-features --bins
# The test runs in a session of its own, so that Ctrl-C reaches only this script, which
# asks the test to stop (the file stop) and waits while it tears everything down.
trap 'touch "$dir/stop"; echo "playground: tearing down"' INT TERM
setsid cargo test -p mcs-cli --all-features --test clusterset_pods -- --ignored --exact playground \
	--nocapture >"$dir/log" 2>&1 &
test_pid=$!
echo "playground: bringing up the clusters ($topology; a minute or two; log: $dir/log)"
while [ ! -e "$dir/ready" ]; do
	if ! kill -0 "$test_pid" 2>/dev/null; then
		tail -n 40 "$dir/log" >&2
		echo "playground: failed before it was ready; the log: $dir/log" >&2
		exit 1
	fi
	sleep 1
done
grep '^playground:' "$dir/log" || true
netns=$(cat "$dir/netns")
cat <<TEXT

The API servers listen inside the lab's network namespace $netns. In another terminal:

  sudo ip netns exec $netns env KUBECONFIG=$dir/kubeconfig \\
    PATH=$MCS_K8S_BIN:${CARGO_TARGET_DIR:-$PWD/target}/debug:\$PATH bash
  kubectl --context north get serviceimports -n loyalty
  kubectl --context north get endpointslices -n loyalty -l multicluster.kubernetes.io/service-name=loyalty-accrual
  kubectl mcs check --context east --context west --context north

Ctrl-C here tears it all down.
TEXT
rc=0
while kill -0 "$test_pid" 2>/dev/null; do
	wait "$test_pid" || rc=$?
done
if [ ! -e "$dir/stop" ]; then
	tail -n 40 "$dir/log" >&2
	echo "playground: stopped by itself (exit $rc); the log: $dir/log" >&2
	exit 1
fi
echo "playground: done"
