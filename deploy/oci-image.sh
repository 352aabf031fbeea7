#!/usr/bin/env bash
# Writes a proxy-wasm module as a Wasm OCI image into an OCI image layout, tagged VERSION.
#
# Format: the "compat" variant of the Wasm image spec: one application/vnd.oci.image.layer.v1.tar+gzip
# layer whose tar holds `plugin.wasm`, and the manifest annotation module.wasm.image/variant=compat.
# Istio (WasmPlugin) and Envoy Gateway (EnvoyExtensionPolicy) both take it; they read the other
# variant only with exactly two layers (module + runtime config), which single-file pushes lack.
#
# Byte-reproducible: the same module gives the same manifest digest. The layer's one file has
# mode 0644, owner 0:0 and mtime SOURCE_DATE_EPOCH (default 0), the config's `created` is that
# time too, there is no history, and os/architecture are fixed (linux/amd64: the module itself
# runs on any CPU, and a host-dependent value would change the digest).
#
# Usage: deploy/oci-image.sh MODULE.wasm VERSION LAYOUT_DIR   (LAYOUT_DIR is replaced)
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 MODULE.wasm VERSION LAYOUT_DIR" >&2; exit 2; }
module=$1 version=$2 layout=${3%/}
[ -f "$module" ] || { echo "$0: $module is missing: run make build" >&2; exit 1; }
[ -n "$version" ] || { echo "$0: empty VERSION" >&2; exit 2; }
command -v umoci >/dev/null || { echo "$0: umoci is missing: run make setup-oci" >&2; exit 1; }

epoch=${SOURCE_DATE_EPOCH:-0}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

# Built beside LAYOUT_DIR (same filesystem) and moved into place at the end, so a failed build
# never leaves half a layout behind.
mkdir -p "$(dirname "$layout")"
work=$(mktemp -d "$layout.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
image="$work/layout:$version"
# umoci warns about each step without a history entry; warnings are noise here.
umoci() { command umoci --log error "$@"; }

umoci init --layout "$work/layout"
umoci new --image "$image"
# unpack + repack (rather than `umoci insert`, whose layer tar lacks its end-of-archive blocks
# in umoci 0.4.7). --rootless: the files are owned by the caller, written as 0:0.
umoci unpack --rootless --image "$image" "$work/bundle"
install -m 0644 "$module" "$work/bundle/rootfs/plugin.wasm"
# The root folder's mtime too: it is in the layer if it differs from the unpacked one.
touch -d "@$epoch" "$work/bundle/rootfs/plugin.wasm" "$work/bundle/rootfs"
umoci repack --no-history --image "$image" "$work/bundle"
umoci config --no-history --image "$image" \
  --created "$created" --os linux --architecture amd64 \
  --manifest.annotation module.wasm.image/variant=compat \
  --manifest.annotation "org.opencontainers.image.version=$version"
# The blobs of the intermediate manifests and configs go.
umoci gc --layout "$work/layout"

rm -rf "$layout"
mv "$work/layout" "$layout"
