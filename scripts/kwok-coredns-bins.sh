#!/usr/bin/env bash
# Build kwok (Kubernetes WithOut Kubelet) and CoreDNS (with the kubernetes plugin's
# `multicluster` option) from Go modules (through the Go module proxy) into the same
# per-user cache as scripts/k8s-bins.sh, only when they are missing.
#
#   dir=$(scripts/kwok-coredns-bins.sh | tail -1)
#   export MCS_KWOK_BIN=$dir/kwok MCS_KWOK_STAGES=$dir/kwok-stages.yaml
#   export MCS_COREDNS_BIN=$dir/coredns
#
# The last line on stdout is always the bin directory,
# $MCS_K8S_CACHE/kwok-v<V>-coredns-v<V>/bin, which holds:
#   kwok               sigs.k8s.io/kwok/cmd/kwok
#   coredns            github.com/coredns/coredns, built from a generated wrapper module
#                      (src/coredns/main.go) with only the plugins reload, ready,
#                      health, prometheus, errors, log, loadbalance, cache, kubernetes,
#                      loop and forward (those of kubeadm's default Corefile, of
#                      deploy/dns/clusterset.server and of the tests' Corefiles); a binary that lacks one is rebuilt
#   kwok-stages.yaml   kwok's Stage objects from its module zip (kustomize/stage/...):
#                      node-initialize, node-heartbeat-with-lease, pod-ready,
#                      pod-complete, pod-delete. Standalone kwok refuses to start
#                      without Stages; pass this file with `kwok -c`.
# Everything else (progress, timings) also goes to stdout, prefixed with
# "kwok-coredns-bins:"; Go's own output goes to stderr. Any failure exits non-zero.
#
# Environment:
#   MCS_K8S_CACHE        cache root (default: $HOME/.cache/mcs-k8s)
#   MCS_KWOK_VERSION     sigs.k8s.io/kwok version without the "v" (default 0.8.0)
#   MCS_COREDNS_VERSION  github.com/coredns/coredns version without the "v" (default 1.15.0)
# Both need Go >= 1.26.0 (their go.mod says so); GOTOOLCHAIN=local means no download.
set -euo pipefail

export GOTOOLCHAIN=local CGO_ENABLED=0
# -buildvcs=false: the wrapper module is not a VCS checkout.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false"

CACHE="${MCS_K8S_CACHE:-$HOME/.cache/mcs-k8s}"
KWOK_V="${MCS_KWOK_VERSION:-0.8.0}"
KWOK_V="${KWOK_V#v}"
COREDNS_V="${MCS_COREDNS_VERSION:-1.15.0}"
COREDNS_V="${COREDNS_V#v}"
FILES=(kwok coredns kwok-stages.yaml)

# The stage files, relative to the kwok module root, in the order they are concatenated.
STAGES=(
	kustomize/stage/node/fast/node-initialize.yaml
	kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
	kustomize/stage/pod/fast/pod-ready.yaml
	kustomize/stage/pod/fast/pod-complete.yaml
	kustomize/stage/pod/fast/pod-delete.yaml
)

# CoreDNS plugins in execution order: the order of the same names in CoreDNS's
# plugin.cfg (checked against the module below). Corefile directives that are not listed
# here are rejected at startup.
PLUGINS=(reload ready health prometheus errors log loadbalance cache kubernetes loop forward)
declare -A PLUGIN_PKG=(
	[reload]=reload [ready]=ready [health]=health [prometheus]=metrics [errors]=errors
	[log]=log [loadbalance]=loadbalance [cache]=cache [kubernetes]=kubernetes [loop]=loop
	[forward]=forward
)

log() { echo "kwok-coredns-bins: $*"; }
die() { echo "kwok-coredns-bins: ERROR: $*" >&2; exit 1; }

W="$CACHE/kwok-v$KWOK_V-coredns-v$COREDNS_V"
BIN="$W/bin"

# VERSIONS is written last, after the smoke checks: without it the run is redone (what
# is already built is kept). It names CoreDNS's plugins, so a changed list rebuilds it.
have_all() {
	[ -x "$BIN/kwok" ] && [ -x "$BIN/coredns" ] && [ -s "$BIN/kwok-stages.yaml" ] &&
		grep -Fqx "coredns v$COREDNS_V (plugins: ${PLUGINS[*]})" "$W/VERSIONS" 2>/dev/null
}

# Whether the CoreDNS binary registers every plugin of PLUGINS.
coredns_complete() {
	local plugins p
	plugins=$("$BIN/coredns" -plugins 2>/dev/null | tr -d ' \t') || return 1
	for p in "${PLUGINS[@]}"; do
		grep -Fxq "$p" <<<"$plugins" || return 1
	done
}

# Fast path: everything is already built.
if have_all; then
	log "kwok v$KWOK_V and coredns v$COREDNS_V already present in $BIN (nothing to do)"
	echo "$BIN"
	exit 0
fi

command -v go >/dev/null || die "go not found in PATH (need Go >= 1.26, GOTOOLCHAIN=local)"
log "using $(go version), GOTOOLCHAIN=$GOTOOLCHAIN CGO_ENABLED=$CGO_ENABLED"

mkdir -p "$W/src" "$BIN"
# Serialise concurrent runs (for example two test jobs on one machine).
exec 9>"$W/.lock"
if ! flock -n 9; then
	log "another kwok-coredns-bins.sh is building in $W; waiting for it"
	flock 9
fi
if have_all; then
	log "kwok v$KWOK_V and coredns v$COREDNS_V were built by a concurrent run"
	echo "$BIN"
	exit 0
fi

START=$(date +%s)

module_dir() { # $1 = module@version; prints the extracted module directory
	local json dir
	json=$(cd / && go mod download -json "$1" 2>&1) ||
		die "cannot download $1 from $(go env GOPROXY): $(printf '%s\n' "$json" | tail -3 | tr '\n' ' ')"
	dir=$(printf '%s\n' "$json" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[ -n "$dir" ] && [ -d "$dir" ] || die "go mod download $1 reported no module directory"
	echo "$dir"
}

finish() { # $1 = name, $2 = temp file, $3 = start time
	mv -f "$2" "$BIN/$1"
	log "built $1 ($(du -h "$BIN/$1" | cut -f1)) in $(($(date +%s) - $3)) s"
}

# 1. kwok: a plain `go install` of the command; it needs no replace lines. Its version
#    string is a constant in the source, so no -X flags are needed.
log "downloading sigs.k8s.io/kwok@v$KWOK_V"
KWOK_DIR=$(module_dir "sigs.k8s.io/kwok@v$KWOK_V")
if [ -s "$BIN/kwok-stages.yaml" ]; then
	log "kwok-stages.yaml already extracted"
else
	tmp="$BIN/.kwok-stages.yaml.tmp"
	: >"$tmp"
	for s in "${STAGES[@]}"; do
		[ -f "$KWOK_DIR/$s" ] || die "sigs.k8s.io/kwok@v$KWOK_V has no $s"
		{ echo "---"; cat "$KWOK_DIR/$s"; } >>"$tmp"
	done
	mv -f "$tmp" "$BIN/kwok-stages.yaml"
	log "extracted ${#STAGES[@]} stage files into $BIN/kwok-stages.yaml"
fi
if [ -x "$BIN/kwok" ]; then
	log "kwok already built"
else
	t0=$(date +%s)
	log "building kwok from sigs.k8s.io/kwok/cmd/kwok@v$KWOK_V"
	rm -rf "$BIN/.kwok.tmpdir"
	(cd / && GOBIN="$BIN/.kwok.tmpdir" go install -trimpath -ldflags "-s -w" \
		"sigs.k8s.io/kwok/cmd/kwok@v$KWOK_V") >&2
	finish kwok "$BIN/.kwok.tmpdir/kwok" "$t0"
	rmdir "$BIN/.kwok.tmpdir"
fi

# 2. CoreDNS: a generated wrapper module, because the upstream main package imports every
#    plugin (and with them cloud SDKs) and the plugin list is compiled in.
if [ -x "$BIN/coredns" ] && coredns_complete; then
	log "coredns already built"
else
	t0=$(date +%s)
	log "downloading github.com/coredns/coredns@v$COREDNS_V"
	COREDNS_DIR=$(module_dir "github.com/coredns/coredns@v$COREDNS_V")
	# Check that PLUGINS is in plugin.cfg order, so the generated Directives are too.
	order=$(grep -v '^#' "$COREDNS_DIR/plugin.cfg" | cut -d: -f1 | grep -Fxf <(printf '%s\n' "${PLUGINS[@]}") | tr '\n' ' ')
	[ "$order" = "${PLUGINS[*]} " ] ||
		die "coredns v$COREDNS_V plugin.cfg orders the plugins as '$order', not '${PLUGINS[*]}'"

	S="$W/src/coredns"
	mkdir -p "$S"
	{
		echo "// Code generated by scripts/kwok-coredns-bins.sh; DO NOT EDIT."
		echo
		echo "// Command coredns is CoreDNS v$COREDNS_V with only the plugins the mcs tests use."
		echo "package main"
		echo
		echo "import ("
		echo "	\"github.com/coredns/coredns/core/dnsserver\""
		echo "	\"github.com/coredns/coredns/coremain\""
		for p in "${PLUGINS[@]}"; do
			echo "	_ \"github.com/coredns/coredns/plugin/${PLUGIN_PKG[$p]}\""
		done
		echo ")"
		echo
		echo "func init() {"
		echo "	// Execution order, as in CoreDNS's plugin.cfg."
		echo "	dnsserver.Directives = []string{"
		for p in "${PLUGINS[@]}"; do echo "		\"$p\","; done
		echo "	}"
		echo "}"
		echo
		echo "func main() { coremain.Run() }"
	} >"$S/main.go"
	cd "$S"
	if [ ! -f go.mod ]; then
		log "creating wrapper module in $S"
		go mod init example.local/mcs-coredns >&2
	fi
	log "resolving github.com/coredns/coredns@v$COREDNS_V"
	go get "github.com/coredns/coredns@v$COREDNS_V" >&2
	go mod tidy >&2
	CV=$(go list -m -f '{{.Version}}' github.com/coredns/coredns)
	[ "$CV" = "v$COREDNS_V" ] || die "resolving moved github.com/coredns/coredns to $CV (want v$COREDNS_V)"
	log "building coredns"
	go build -trimpath -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=v$COREDNS_V" \
		-o "$BIN/.coredns.tmp" . >&2
	finish coredns "$BIN/.coredns.tmp" "$t0"
fi

# 3. smoke-check what we built.
"$BIN/kwok" --version || die "$BIN/kwok does not run; delete it to rebuild"
"$BIN/coredns" -version || die "$BIN/coredns does not run; delete it to rebuild"
# -plugins lists every registered plugin, also those the wanted ones import (metadata,
# transfer, ...); those are not in Directives, so a Corefile cannot use them.
plugins=$("$BIN/coredns" -plugins | tr -d ' \t')
for p in "${PLUGINS[@]}"; do
	grep -Fxq "$p" <<<"$plugins" || die "coredns lacks plugin $p (it has: $(echo $plugins))"
done
cat >"$W/VERSIONS" <<EOF
kwok v$KWOK_V
coredns v$COREDNS_V (plugins: ${PLUGINS[*]})
go $(go env GOVERSION)
built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(($(date +%s) - START)) s
EOF
log "done in $(($(date +%s) - START)) s"
echo "$BIN"
