#!/usr/bin/env bash
# Build kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kube-proxy, kubelet
# and kubectl from Go modules (through
# the Go module proxy) into a per-user cache, only when they are missing.
#
#   export MCS_K8S_BIN=$(scripts/k8s-bins.sh | tail -1)
#
# The last line on stdout is always the bin directory. Everything else (progress,
# timings) also goes to stdout, prefixed with "k8s-bins:"; Go's own output goes to
# stderr. Any failure exits non-zero.
#
# Environment:
#   MCS_K8S_CACHE    cache root (default: $HOME/.cache/mcs-k8s)
#   MCS_K8S_VERSION  k8s.io/kubernetes version without the leading "v". Default:
#                    1.35.4, falling back to 1.34.4 if the proxy does not serve it.
#
# See docs/testing.md for the versions, measured build times and sizes. A wrapper module
# is needed because k8s.io/kubernetes requires its staging modules at v0.0.0, which only a
# replace block of our own can satisfy.
set -euo pipefail

export GOTOOLCHAIN=local CGO_ENABLED=0
# -buildvcs=false: the wrapper module is not a VCS checkout.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false"

CACHE="${MCS_K8S_CACHE:-$HOME/.cache/mcs-k8s}"
DEFAULT_VERSIONS=(1.35.4 1.34.4)
BINS=(kube-apiserver etcd kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)

log() { echo "k8s-bins: $*"; }
die() { echo "k8s-bins: ERROR: $*" >&2; exit 1; }

have_bins() { # $1 = bin dir
	local b
	for b in "${BINS[@]}"; do
		[ -x "$1/$b" ] || return 1
	done
}

if [ -n "${MCS_K8S_VERSION:-}" ]; then
	VERSIONS=("${MCS_K8S_VERSION#v}")
else
	VERSIONS=("${DEFAULT_VERSIONS[@]}")
fi

# Fast path: the preferred version is already built.
if have_bins "$CACHE/v${VERSIONS[0]}/bin"; then
	log "binaries for v${VERSIONS[0]} already present in $CACHE/v${VERSIONS[0]}/bin (nothing to do)"
	echo "$CACHE/v${VERSIONS[0]}/bin"
	exit 0
fi

command -v go >/dev/null || die "go not found in PATH (need Go >= 1.25, GOTOOLCHAIN=local)"
log "using $(go version), GOTOOLCHAIN=$GOTOOLCHAIN CGO_ENABLED=$CGO_ENABLED"

# Pick the first version whose k8s.io/kubernetes module the proxy serves.
V=""
GOMOD=""
for cand in "${VERSIONS[@]}"; do
	log "checking that the module proxy serves k8s.io/kubernetes@v$cand"
	if json=$(cd / && go mod download -json "k8s.io/kubernetes@v$cand" 2>&1); then
		GOMOD=$(printf '%s\n' "$json" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
		if [ -n "$GOMOD" ] && [ -f "$GOMOD" ]; then
			V=$cand
			break
		fi
	fi
	log "k8s.io/kubernetes@v$cand is not available: $(printf '%s\n' "$json" | tail -3 | tr '\n' ' ')"
	if have_bins "$CACHE/v$cand/bin"; then
		V=$cand
		break
	fi
done
[ -n "$V" ] || die "none of k8s.io/kubernetes ${VERSIONS[*]} could be downloaded from $(go env GOPROXY)"

W="$CACHE/v$V"
BIN="$W/bin"
if have_bins "$BIN"; then
	log "binaries for v$V already present in $BIN (nothing to do)"
	echo "$BIN"
	exit 0
fi

mkdir -p "$W/src" "$BIN"
# Serialise concurrent runs (for example two test jobs on one machine).
exec 9>"$W/.lock"
if ! flock -n 9; then
	log "another k8s-bins.sh is building v$V; waiting for it"
	flock 9
fi
if have_bins "$BIN"; then
	log "binaries for v$V were built by a concurrent run"
	echo "$BIN"
	exit 0
fi

START=$(date +%s)
MINOR=$(echo "$V" | cut -d. -f2)
STAGING="v0.${V#1.}"   # kubernetes v1.35.4 goes with staging modules v0.35.4

cd "$W/src"
if [ ! -f go.mod ]; then
	log "creating wrapper module in $W/src"
	go mod init example.local/mcs-k8s-bins >&2
fi

# 1. replace every staging module that kubernetes requires at v0.0.0.
log "replacing staging modules k8s.io/* v0.0.0 => $STAGING"
mods=$(grep -E '^[[:space:]]+k8s\.io/[a-z0-9-]+ v0\.0\.0([[:space:]]|$)' "$GOMOD" | awk '{print $1}' | sort -u)
[ -n "$mods" ] || die "found no k8s.io/* v0.0.0 requirements in $GOMOD"
args=()
for m in $mods; do args+=("-replace=$m=$m@$STAGING"); done
go mod edit "${args[@]}"
log "replaced $(echo "$mods" | wc -l) staging modules"

# 2. resolve the module graph for the commands we build.
log "resolving k8s.io/kubernetes@v$V (kube-apiserver, kube-controller-manager)"
go get "k8s.io/kubernetes@v$V" \
	"k8s.io/kubernetes/cmd/kube-apiserver@v$V" \
	"k8s.io/kubernetes/cmd/kube-controller-manager@v$V" \
	"k8s.io/kubernetes/cmd/kube-scheduler@v$V" \
	"k8s.io/kubernetes/cmd/kube-proxy@v$V" \
	"k8s.io/kubernetes/cmd/kubelet@v$V" \
	"k8s.io/kubernetes/cmd/kubectl@v$V" >&2

# 3. etcd at exactly the version that kubernetes pins.
ETCD=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3 2>/dev/null || true)
if [ -z "$ETCD" ]; then
	ETCD=v3.6.5
	log "kubernetes does not pin go.etcd.io/etcd/server/v3; using $ETCD"
else
	log "kubernetes v$V pins etcd $ETCD"
fi
go get "go.etcd.io/etcd/server/v3@$ETCD" >&2
KV=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
[ "$KV" = "v$V" ] || die "resolving etcd moved k8s.io/kubernetes to $KV (want v$V)"

LDF="-s -w -X k8s.io/component-base/version.gitVersion=v$V"
LDF+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR"
LDF+=" -X k8s.io/client-go/pkg/version.gitVersion=v$V"
LDF+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$MINOR"

build() { # $1 = output name, $2 = package, $3 = ldflags
	local t0=$(date +%s)
	if [ -x "$BIN/$1" ]; then
		log "$1 already built"
		return
	fi
	log "building $1 from $2"
	go build -trimpath -ldflags "$3" -o "$BIN/.$1.tmp" "$2" >&2
	mv -f "$BIN/.$1.tmp" "$BIN/$1"
	log "built $1 ($(du -h "$BIN/$1" | cut -f1)) in $(($(date +%s) - t0)) s"
}

# 4. build. etcd first: smallest, and it warms the shared etcd client packages.
build etcd go.etcd.io/etcd/server/v3 "-s -w"
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$LDF"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$LDF"
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$LDF"
build kube-proxy k8s.io/kubernetes/cmd/kube-proxy "$LDF"
build kubelet k8s.io/kubernetes/cmd/kubelet "$LDF"
build kubectl k8s.io/kubernetes/cmd/kubectl "$LDF"

# 5. smoke-check what we built. (Not `| head -1`: under pipefail, etcd writing its later
# lines after head has gone is a SIGPIPE, and the whole script would fail, at random, the
# first time it runs on a machine.)
"$BIN/etcd" --version
"$BIN/kube-apiserver" --version
"$BIN/kube-controller-manager" --version
"$BIN/kube-scheduler" --version
"$BIN/kube-proxy" --version
"$BIN/kubelet" --version
"$BIN/kubectl" version --client
cat >"$W/VERSIONS" <<EOF
kubernetes v$V
etcd $ETCD
go $(go env GOVERSION)
built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(($(date +%s) - START)) s
EOF
log "done in $(($(date +%s) - START)) s"
echo "$BIN"
