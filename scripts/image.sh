#!/usr/bin/env bash
# Builds the mcs container image without a container daemon or a base image to pull:
#
#   scripts/image.sh [--bin-dir DIR] [--out DIR] [--tag TAG]
#
# One image, `mcs:<version>`, holds the three programs a cluster runs: mcs-agent (the
# entrypoint), mcs-dns and kubectl-mcs, in /usr/local/bin; the chart picks the command per
# Deployment. Inside is exactly:
#   - the binaries (release builds of mcs-cli, or those in --bin-dir);
#   - the shared libraries `ldd` says they load (glibc, libm, libgcc_s and the dynamic
#     loader; since glibc 2.34 the `files` and `dns` NSS modules live in libc itself), so
#     that host names in kubeconfigs and /etc/hosts resolve as on any glibc system;
#   - /etc/passwd and /etc/group naming the non-root user 65532 (`nonroot`) the image runs
#     as, and /etc/nsswitch.conf (`hosts: files dns`).
# No shell, no package manager, no CA bundle: the programs trust only the CAs their
# kubeconfigs or the ServiceAccount give them.
#
# Written with umoci (Debian's `umoci`, installed when missing): it makes an OCI image
# layout from a directory with one command per step and needs neither a daemon nor root
# storage drivers, which buildah needs. skopeo (Debian's `skopeo`) copies the layout to a
# docker-archive, the form `ctr images import` and `docker load` take.
#
# Output in --out (default dist/): oci/ (an OCI image layout, tag <version>), and
# mcs-image-<version>.tar (a docker-archive named mcs:<version>). The image config carries
# the OCI labels org.opencontainers.image.{title,description,version,revision,licenses}, and
# .source when MCS_IMAGE_SOURCE names the repository (there is no public one yet).
# amd64 only: an arm64 image needs aarch64 binaries (a cross build with the
# aarch64-unknown-linux-gnu target and its glibc, or a native build) and their libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/mcs-target}"

bin_dir=""
out="dist"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
tag="$version"
while [ $# -gt 0 ]; do
	case "$1" in
	--bin-dir) bin_dir="$2"; shift 2 ;;
	--out) out="$2"; shift 2 ;;
	--tag) tag="$2"; shift 2 ;;
	*) echo "image: unknown argument $1" >&2; exit 2 ;;
	esac
done
PROGRAMS=(mcs-agent mcs-dns kubectl-mcs)

need() {
	command -v "$1" >/dev/null 2>&1 && return
	echo "image: installing $2 (Debian's package)"
	if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
	$SUDO apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$2" >/dev/null
}
need umoci umoci
need skopeo skopeo

if [ -z "$bin_dir" ]; then
	echo "image: cargo build --release -p mcs-cli"
	cargo build --release --locked -p mcs-cli --bins
	bin_dir="$CARGO_TARGET_DIR/release"
fi
for p in "${PROGRAMS[@]}"; do
	[ -x "$bin_dir/$p" ] || { echo "image: $bin_dir/$p is missing" >&2; exit 1; }
done

layout="$out/oci"
rm -rf "$layout"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# An empty image unpacked into a bundle; its rootfs gets the files, and `umoci repack`
# makes them one layer. (`umoci insert` of umoci 0.4.7 writes layers without the tar
# end-of-archive blocks, which GNU tar refuses; repack writes whole archives.)
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack --image "$layout:$tag" "$work/bundle" >/dev/null
root="$work/bundle/rootfs"
mkdir -p "$root/usr/local/bin" "$root/etc"
for p in "${PROGRAMS[@]}"; do
	# Symbols and debug information stripped: nothing a running program needs.
	install -m 0755 --strip "$bin_dir/$p" "$root/usr/local/bin/$p"
done
# Every library the binaries load, at the path the loader looks for it (the dynamic
# loader at the absolute path in the ELF header).
libs=$(for p in "${PROGRAMS[@]}"; do ldd "$bin_dir/$p"; done |
	awk '/=> \// { print $3 } /^\t\// { print $1 }' | sort -u)
for lib in $libs; do
	mkdir -p "$root$(dirname "$lib")"
	cp -L "$lib" "$root$lib"
done
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/:/sbin/nologin
nonroot:x:65532:65532:nonroot:/:/sbin/nologin
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
echo 'hosts: files dns' >"$root/etc/nsswitch.conf"

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD 2>/dev/null; then revision="$revision-dirty"; fi
created=$(git log -1 --format=%cI 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)
labels=(
	"org.opencontainers.image.title=mcs"
	"org.opencontainers.image.description=Kubernetes Multi-Cluster Services: mcs-agent, mcs-dns and kubectl-mcs"
	"org.opencontainers.image.version=$version"
	"org.opencontainers.image.revision=$revision"
	"org.opencontainers.image.licenses=Apache-2.0"
	"org.opencontainers.image.created=$created"
)
if [ -n "${MCS_IMAGE_SOURCE:-}" ]; then
	labels+=("org.opencontainers.image.source=$MCS_IMAGE_SOURCE")
fi

# Files owned by root, read-only to the user: nothing in the image is writable by it.
umoci repack --image "$layout:$tag" --history.created "$created" \
	--history.comment "mcs binaries, their shared libraries, passwd, group, nsswitch" "$work/bundle"
config_args=(
	--image "$layout:$tag"
	--os linux --architecture amd64
	--config.user 65532:65532
	--config.entrypoint /usr/local/bin/mcs-agent
	--config.workingdir /
	--config.env PATH=/usr/local/bin
	--created "$created"
	--history.created "$created" --history.comment "user, entrypoint, labels"
)
for l in "${labels[@]}"; do
	config_args+=(--config.label "$l" --manifest.annotation "$l")
done
umoci config "${config_args[@]}"
umoci gc --layout "$layout"

archive="$out/mcs-image-$tag.tar"
rm -f "$archive"
skopeo copy --quiet "oci:$layout:$tag" "docker-archive:$archive:mcs:$tag"
size=$(du -sh "$layout" | cut -f1)
echo "image: mcs:$tag (revision $revision), layout $layout ($size), archive $archive"
echo "$layout:$tag"
