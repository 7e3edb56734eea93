#!/usr/bin/env bash
# Everything a release ships, made from this checkout into dist/, and checked:
#
#   scripts/release.sh [--out DIR] [--bin-dir DIR]
#
# --bin-dir takes the programs from DIR instead of a release build: .ci/run passes the
# test build's binaries, to check everything this script makes without a second build
# (a release is made without it).
#
#   oci/, mcs-image-<version>.tar     the image (scripts/image.sh, release binaries)
#   mcs-<version>.tgz                 the chart (helm package)
#   kubectl-mcs-<version>-x86_64-linux-gnu   the kubectl plugin, for download
#   sbom/<crate>.cdx.json             CycloneDX SBOMs of the Rust dependencies of every
#                                     workspace crate (cargo-cyclonedx, scripts/tools.sh)
#   SHA256SUMS                        the SHA-256 of every file above (sha256sum -c reads it)
#
# Then it checks what it made: the image's user, entrypoint and labels, `helm lint
# --strict` and `helm template` of the packaged chart with Helm 3 and Helm 4
# (scripts/helm-bins.sh), that the plugin runs, that every SBOM lists the crates, and the
# sums. Any failure exits non-zero. .ci/run runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/mcs-target}"

out="dist"
bin=""
while [ $# -gt 0 ]; do
	case "$1" in
	--out) out="$2"; shift 2 ;;
	--bin-dir) bin="$2"; shift 2 ;;
	*) echo "release: unknown argument $1" >&2; exit 2 ;;
	esac
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
chart_version=$(sed -n 's/^version: //p' charts/mcs/Chart.yaml)
app_version=$(sed -n 's/^appVersion: "\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/mcs/Chart.yaml)
if [ "$app_version" != "$version" ]; then
	echo "release: charts/mcs/Chart.yaml appVersion $app_version is not the crates' version $version" >&2
	exit 1
fi
rm -rf "$out"
mkdir -p "$out/sbom"

if [ -z "$bin" ]; then
	echo "release: binaries (cargo build --release -p mcs-cli)"
	cargo build --release --locked -p mcs-cli --bins
	bin="$CARGO_TARGET_DIR/release"
fi

echo "release: image"
scripts/image.sh --bin-dir "$bin" --out "$out" --tag "$version" | tail -n 2

helms=$(scripts/helm-bins.sh | tail -n 2)
helm3=$(echo "$helms" | head -n 1)
helm4=$(echo "$helms" | tail -n 1)
helm_home=$(mktemp -d)
trap 'rm -rf "$helm_home"' EXIT
helm() {
	HELM_CACHE_HOME="$helm_home/cache" HELM_CONFIG_HOME="$helm_home/config" \
		HELM_DATA_HOME="$helm_home/data" KUBECONFIG=/nonexistent "$@"
}
echo "release: chart"
helm "$helm4" package charts/mcs --destination "$out" >/dev/null
chart="$out/mcs-$chart_version.tgz"
[ -f "$chart" ] || { echo "release: helm package made no $chart" >&2; exit 1; }

plugin="$out/kubectl-mcs-$version-x86_64-linux-gnu"
install -m 0755 --strip "$bin/kubectl-mcs" "$plugin"

TOOLS=$(scripts/tools.sh cargo-cyclonedx | tail -n 1)
echo "release: SBOMs ($("$TOOLS/cargo-cyclonedx" cyclonedx --version))"
# It writes <name>.cdx.json beside each crate's Cargo.toml: move them out at once.
PATH="$TOOLS:$PATH" cargo cyclonedx --format json --all-features \
	--override-filename mcs-release.cdx >/dev/null
for manifest in Cargo.toml */Cargo.toml; do
	dir=$(dirname "$manifest")
	[ -f "$dir/mcs-release.cdx.json" ] || continue
	name=$(sed -n 's/^name = "\(.*\)"/\1/p' "$manifest" | head -n 1)
	mv "$dir/mcs-release.cdx.json" "$out/sbom/$name.cdx.json"
done

(cd "$out" && find . -type f ! -name SHA256SUMS ! -path './oci/*' -printf '%P\n' | sort |
	xargs sha256sum >SHA256SUMS)

echo "release: checking"
python3 - "$out" "$version" <<'EOF'
import json, os, sys
out, version = sys.argv[1], sys.argv[2]
layout = os.path.join(out, "oci")
blob = lambda d: os.path.join(layout, "blobs", *d.split(":"))
index = json.load(open(os.path.join(layout, "index.json")))
[m] = [m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == version]
manifest = json.load(open(blob(m["digest"])))
config = json.load(open(blob(manifest["config"]["digest"])))
c = config["config"]
problems = []
if c.get("User") != "65532:65532": problems.append(f"user {c.get('User')}")
if c.get("Entrypoint") != ["/usr/local/bin/mcs-agent"]: problems.append(f"entrypoint {c.get('Entrypoint')}")
labels = c.get("Labels", {})
for key in ("version", "revision", "licenses", "created"):
    if not labels.get(f"org.opencontainers.image.{key}"): problems.append(f"no label {key}")
if labels.get("org.opencontainers.image.version") != version: problems.append("version label")
if config.get("architecture") != "amd64" or config.get("os") != "linux": problems.append("platform")
sboms = os.listdir(os.path.join(out, "sbom"))
for name in ("mcs-core.cdx.json", "mcs-client.cdx.json", "mcs-kube.cdx.json", "mcs-cli.cdx.json"):
    if name not in sboms:
        problems.append(f"no SBOM {name}")
        continue
    bom = json.load(open(os.path.join(out, "sbom", name)))
    if bom.get("bomFormat") != "CycloneDX" or len(bom.get("components", [])) < 10:
        problems.append(f"{name}: not a CycloneDX SBOM with the dependencies")
if problems:
    sys.exit("release: " + "; ".join(problems))
print(f"release: image user {c['User']}, entrypoint {c['Entrypoint'][0]}, revision {labels['org.opencontainers.image.revision']}; {len(sboms)} SBOMs")
EOF
for h in "$helm3" "$helm4"; do
	helm "$h" lint --strict "$chart" -f charts/mcs/ci/mesh-values.yaml >/dev/null
	helm "$h" template mcs "$chart" -f charts/mcs/ci/hub-values.yaml >/dev/null
done
"$plugin" --help >/dev/null
(cd "$out" && sha256sum --quiet -c SHA256SUMS)
echo "release: done in $out:"
(cd "$out" && cat SHA256SUMS)
