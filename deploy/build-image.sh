#!/usr/bin/env bash
# Builds the node agent's image offline from a release binary that is already built
# (cargo build --release -p tracker-agent): stages the binary, exactly the shared
# libraries ldd lists for it, and the CA bundle, then runs podman build on a FROM
# scratch recipe with no network.
#
#   deploy/build-image.sh [TAG]        (default localhost/resource-tracker:dev)
#   BIN=path/to/resource-tracker deploy/build-image.sh
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
tag=${1:-localhost/resource-tracker:dev}
bin=${BIN:-${CARGO_TARGET_DIR:-$root/target}/release/resource-tracker}
stage=${STAGE:-$root/target/deploy-image}

[[ -x $bin ]] || { echo "build-image.sh: no release binary at $bin (cargo build --release -p tracker-agent)" >&2; exit 1; }
command -v podman >/dev/null || { echo "build-image.sh: podman is missing (apt-get install -y podman runc)" >&2; exit 1; }

rm -rf "$stage"
mkdir -p "$stage/rootfs/usr/local/bin"
install -m 0755 "$bin" "$stage/rootfs/usr/local/bin/resource-tracker"

# ldd's two line forms: "libc.so.6 => /lib/.../libc.so.6 (0x...)" and the loader's
# "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vdso has no file. Each library is copied
# at the path the binary asks for (cp -L: the file, not the distribution's symlink).
libs=$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
[[ -n $libs ]] || { echo "build-image.sh: ldd lists no libraries for $bin" >&2; exit 1; }
for lib in $libs; do
    mkdir -p "$stage/rootfs$(dirname "$lib")"
    cp -L "$lib" "$stage/rootfs$lib"
done

ca=/etc/ssl/certs/ca-certificates.crt
if [[ -r $ca ]]; then
    mkdir -p "$stage/rootfs/etc/ssl/certs"
    cp -L "$ca" "$stage/rootfs$ca"
fi
# /tmp for the files the tracker keeps when an output fails (the DaemonSet mounts an
# emptyDir there; the root file system stays read-only).
mkdir -p "$stage/rootfs/tmp"
chmod 1777 "$stage/rootfs/tmp"

cp "$here/Containerfile" "$stage/Containerfile"
echo "build-image.sh: staged $(cd "$stage/rootfs" && find . -type f | sort | tr '\n' ' ')" >&2

# A scratch build runs no container, so it needs neither a runtime nor a registry;
# --network=none and --pull=never make that certain.
podman build --network=none --pull=never -f "$stage/Containerfile" -t "$tag" "$stage"
