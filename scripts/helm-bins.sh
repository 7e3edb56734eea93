#!/usr/bin/env bash
# Build helm 3 and helm 4 from their Go modules (through the Go module proxy) into a
# per-user cache, only when they are missing.
#
#   out=$(scripts/helm-bins.sh)
#   HELM3=$(echo "$out" | tail -2 | head -1)   # .../v3.21.4/helm
#   HELM4=$(echo "$out" | tail -1)             # .../v4.3.2/helm
#
# The last two lines on stdout are always the two binaries, helm 3 first. Everything else
# (progress, timings) also goes to stdout, prefixed with "helm-bins:"; Go's own output goes
# to stderr. Any failure exits non-zero.
#
# Environment:
#   MCS_HELM_CACHE  cache root (default: $HOME/.cache/mcs-helm)
#   MCS_HELM3_VERSION  helm.sh/helm/v3 version (default: 3.21.4; not 3.22.0)
#   MCS_HELM4_VERSION  helm.sh/helm/v4 version (default: 4.3.2)
#
# (MCS_HELM3 and MCS_HELM4 are the binaries' paths, which scripts/test.sh exports for the
# tests; this script does not read them, so running it with them exported is harmless.)
#
# Each version is built in a wrapper module of its own (`go mod init` + `go get
# helm.sh/helm/vN/cmd/helm@vX`), so the dependencies are exactly the ones helm's go.mod
# requires. The ldflags are the ones helm's Makefile sets for a tagged release:
# internal/version.version (what `helm version` prints) and, for helm 3 only, the default
# Kubernetes version of `helm template`/`helm lint` (pkg/chartutil and pkg/lint/rules
# k8sVersionMajor/Minor, from the k8s.io/client-go it is built with; without them helm 3
# assumes Kubernetes v1.20 and refuses charts with kubeVersion >= 1.21). Helm 4 reads that
# version from the build info itself.
set -euo pipefail

export GOTOOLCHAIN=local CGO_ENABLED=0
# -buildvcs=false: the wrapper module is not a VCS checkout.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false"

CACHE="${MCS_HELM_CACHE:-$HOME/.cache/mcs-helm}"
V3="${MCS_HELM3_VERSION:-3.21.4}" && V3="v${V3#v}"
V4="${MCS_HELM4_VERSION:-4.3.2}" && V4="v${V4#v}"

log() { echo "helm-bins: $*"; }
die() { echo "helm-bins: ERROR: $*" >&2; exit 1; }

[ "$V3" != v3.22.0 ] || die "helm v3.22.0 is not supported here; use v3.21.4"

# Fast path: both already built.
if [ -x "$CACHE/$V3/helm" ] && [ -x "$CACHE/$V4/helm" ]; then
	log "helm $V3 and $V4 already present in $CACHE (nothing to do)"
	echo "$CACHE/$V3/helm"
	echo "$CACHE/$V4/helm"
	exit 0
fi

command -v go >/dev/null || die "go not found in PATH (need Go >= 1.26, GOTOOLCHAIN=local)"
log "using $(go version), GOTOOLCHAIN=$GOTOOLCHAIN CGO_ENABLED=$CGO_ENABLED"

build() { # $1 = version (vX.Y.Z); the major version picks the module
	local v=$1 major=${1%%.*}
	local mod="helm.sh/helm/$major" dir="$CACHE/$v"
	[ -x "$dir/helm" ] && { log "helm $v already built"; return; }
	mkdir -p "$dir/src"
	# Serialise concurrent runs (for example two test jobs on one machine).
	exec 9>"$dir/.lock"
	if ! flock -n 9; then
		log "another helm-bins.sh is building helm $v; waiting for it"
		flock 9
	fi
	if [ -x "$dir/helm" ]; then
		log "helm $v was built by a concurrent run"
		exec 9>&-
		return
	fi
	local t0
	t0=$(date +%s)
	(
		cd "$dir/src"
		if [ ! -f go.mod ]; then
			log "creating wrapper module in $dir/src"
			go mod init example.local/mcs-helm-bins >&2
		fi
		log "resolving $mod/cmd/helm@$v"
		go get "$mod/cmd/helm@$v" >&2
		local got
		got=$(go list -m -f '{{.Version}}' "$mod")
		[ "$got" = "$v" ] || die "resolved $mod at $got (want $v)"
		local ldf="-s -w -X $mod/internal/version.version=$v"
		ldf+=" -X $mod/internal/version.metadata= -X $mod/internal/version.gitTreeState=clean"
		if [ "$major" = v3 ]; then
			# As helm's Makefile: client-go v0.M.N means Kubernetes v1.M.
			local cg maj min
			cg=$(go list -m -f '{{.Version}}' k8s.io/client-go)
			cg=${cg#v}
			maj=$((${cg%%.*} + 1))
			min=$(echo "$cg" | cut -d. -f2)
			log "helm $v is built with k8s.io/client-go v$cg: default Kubernetes v$maj.$min"
			ldf+=" -X $mod/pkg/lint/rules.k8sVersionMajor=$maj -X $mod/pkg/lint/rules.k8sVersionMinor=$min"
			ldf+=" -X $mod/pkg/chartutil.k8sVersionMajor=$maj -X $mod/pkg/chartutil.k8sVersionMinor=$min"
		fi
		log "building helm $v"
		go build -trimpath -ldflags "$ldf" -o "$dir/.helm.tmp" "$mod/cmd/helm" >&2
	)
	mv -f "$dir/.helm.tmp" "$dir/helm"
	local out
	out=$("$dir/helm" version --short)
	case "$out" in
	"$v"*) ;;
	*) die "$dir/helm version says '$out' (want $v)" ;;
	esac
	cat >"$dir/VERSION" <<EOF
helm $out
go $(go env GOVERSION)
built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(($(date +%s) - t0)) s
EOF
	log "built helm $v ($(du -h "$dir/helm" | cut -f1)) in $(($(date +%s) - t0)) s: $out"
	exec 9>&-
}

START=$(date +%s)
build "$V3"
build "$V4"
log "done in $(($(date +%s) - START)) s"
echo "$CACHE/$V3/helm"
echo "$CACHE/$V4/helm"
