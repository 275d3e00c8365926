#!/usr/bin/env bash
# Idempotent fresh-machine setup: nightly rust-src, bpf-linker (against the nightly
# toolchain's own LLVM), and the few Debian packages the tests use.
# Fast when everything is already present.
# `--run` (cargo xtask run, cargo xtask install): only what building and running
# the tracker needs, the nightly toolchain's rust-src and bpf-linker; none of the
# tests' packages, peers or virtual environments.
# `--pip` (cargo xtask pip-install): that, and maturin in its own small venv
# (target/maturin), which builds the Python package's wheel.
set -euo pipefail
run_only=0
pip_only=0
[ "${1:-}" = "--run" ] && run_only=1
[ "${1:-}" = "--pip" ] && run_only=1 && pip_only=1

log() { echo "setup: $*" >&2; }

# --- Debian packages (tests: sudo for the user-drop test, jq for output checks,
# prometheus and podman for the node agent, chromium for the report) ---
need_apt=()
if [ "$run_only" = 0 ]; then
command -v sudo >/dev/null 2>&1 || need_apt+=(sudo)
command -v jq >/dev/null 2>&1 || need_apt+=(jq)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# A real Prometheus and promtool for the node agent's endpoint tests.
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# The node agent's image is built and run under podman (runc: crun refuses a hybrid
# cgroup hierarchy); objcopy strips the test build's binary for it.
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
command -v objcopy >/dev/null 2>&1 || need_apt+=(binutils)
# Headless Chromium opens the HTML reports in the report tests.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# A real sudoers rule for the binary, made and removed by the root-safety tests.
command -v sudo >/dev/null 2>&1 || need_apt+=(sudo)
# stress-ng's stressors are real workloads of `cargo xtask bench --only-real`.
command -v stress-ng >/dev/null 2>&1 || need_apt+=(stress-ng)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || log "apt-get update failed (continuing)"
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    log "missing ${need_apt[*]} and cannot apt-get install them (not root?)"
  fi
fi

# --- the kernel matrix (cargo xtask kernels, which sets TRACKER_SETUP_KERNELS=1): qemu under TCG, busybox and cpio for
# the guests' initramfs, lz4/zstd/xz to unpack Debian's kernels. bookworm's
# qemu-system-x86 would replace the newer qemu-utils an image may carry: take it from
# bookworm-backports (a source added for that; its packages are never preferred
# unless asked for with -t). ---
need_kvm=()
if [ "${TRACKER_SETUP_KERNELS:-}" = 1 ]; then
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_kvm+=(qemu-system-x86)
[ -x /bin/busybox ] || need_kvm+=(busybox-static)
command -v cpio >/dev/null 2>&1 || need_kvm+=(cpio)
command -v lz4 >/dev/null 2>&1 || need_kvm+=(lz4)
command -v zstd >/dev/null 2>&1 || need_kvm+=(zstd)
command -v xz >/dev/null 2>&1 || need_kvm+=(xz-utils)
fi
if [ ${#need_kvm[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    target=()
    if grep -qs 'bookworm' /etc/os-release; then
      if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        log "adding bookworm-backports for qemu-system-x86"
        printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
          > /etc/apt/sources.list.d/bookworm-backports.sources
      fi
      target=(-t bookworm-backports)
    fi
    log "installing ${need_kvm[*]}"
    apt-get update -qq >/dev/null || log "apt-get update failed (continuing)"
    apt-get install -y -qq --no-install-recommends "${target[@]}" "${need_kvm[@]}" >/dev/null
  else
    log "missing ${need_kvm[*]} and cannot apt-get install them (not root?)"
  fi
fi

# --- nightly toolchain with rust-src (aya-build runs `rustup run nightly cargo build -Z build-std`) ---
if ! rustup toolchain list | grep -q '^nightly'; then
  log "installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  log "adding rust-src to nightly"
  rustup component add rust-src --toolchain nightly
fi

# --- bpf-linker 0.13.0 built against nightly's libLLVM (the default features want LLVM 23) ---
sysroot=$(rustc +nightly --print sysroot)
llvm_so=$(ls "$sysroot"/lib/libLLVM.so.*-rust-* 2>/dev/null | head -n1 || true)
if [ -z "$llvm_so" ]; then
  echo "setup: no libLLVM.so.*-rust-* in $sysroot/lib; cannot build bpf-linker" >&2
  exit 1
fi
llvm_dir="${CARGO_HOME:-$HOME/.cargo}/bpf-linker-llvm"
stamp="$llvm_dir/.built-for"
mkdir -p "$llvm_dir/lib"
ln -sf "$llvm_so" "$llvm_dir/lib/libLLVM.so"
ln -sf "$llvm_so" "$llvm_dir/lib/$(basename "$llvm_so")"
want="bpf-linker 0.13.0 $(basename "$llvm_so")"
if command -v bpf-linker >/dev/null 2>&1 && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  :
else
  log "building bpf-linker 0.13.0 against $(basename "$llvm_so") (1-2 min)"
  LLVM_PREFIX="$llvm_dir" cargo install bpf-linker --version 0.13.0 --locked \
    --no-default-features --features llvm-22 --force
  echo "$want" > "$stamp"
fi
if [ "$pip_only" = 1 ]; then
  mat_venv="$(cd "$(dirname "$0")/.." && pwd)/target/maturin"
  want_mat="maturin==1.16.0"
  if ! { [ -x "$mat_venv/bin/maturin" ] && [ "$(cat "$mat_venv/.installed" 2>/dev/null)" = "$want_mat" ]; }; then
    log "creating $mat_venv with $want_mat"
    rm -rf "$mat_venv"
    python3 -m venv "$mat_venv"
    "$mat_venv/bin/pip" install -q --disable-pip-version-check "$want_mat"
    echo "$want_mat" > "$mat_venv/.installed"
  fi
  log "ok (what building the wheel needs: rust-src for nightly, bpf-linker, maturin)"
  exit 0
fi
if [ "$run_only" = 1 ]; then
  log "ok (what running needs: rust-src for nightly, bpf-linker)"
  exit 0
fi
# --- Python peers in their own virtual environment (side-by-side tests, benchmarks) ---
repo=$(cd "$(dirname "$0")/.." && pwd)
# Its sdist's own tests (tests/test_tracker.py) run on our package too, with only the
# import renamed (tests/tests/python_package.rs), by this venv's pytest.
venv="$repo/target/py-peers"
peer_pkgs=("resource-tracker==0.5.0" "pytest==9.2.0")
want_py="${peer_pkgs[*]} +sdist"
if [ -x "$venv/bin/python" ] && [ -f "$venv/.installed" ] && [ "$(cat "$venv/.installed")" = "$want_py" ]; then
  :
else
  log "creating $venv with $want_py"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "${peer_pkgs[@]}"
  "$venv/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$venv/sdist" "${peer_pkgs[0]}"
  tar -xzf "$venv"/sdist/resource_tracker-0.5.0.tar.gz -C "$venv/sdist"
  test -f "$venv/sdist/resource_tracker-0.5.0/tests/test_tracker.py"
  echo "$want_py" > "$venv/.installed"
fi
# --- moto (S3/IAM/STS server, SigV4 enforced) for the Sentinel streaming tests ---
# tests/src/sentinel.rs starts target/moto/bin/moto_server; tests/fixtures/moto_ctl.py
# drives it with boto3 (a dependency of moto). moto's iam/sts extras are empty in
# 5.2.5 (pulled in for clarity); server mode needs flask and flask-cors. The OTLP
# tests decode with the official opentelemetry-proto (tests/fixtures/otlp_receiver.py).
moto_venv="$repo/target/moto"
moto_pkgs=("moto[s3,iam,sts]==5.2.5" flask flask-cors "opentelemetry-proto==1.45.2")
want_moto="${moto_pkgs[*]}"
if [ -x "$moto_venv/bin/moto_server" ] && [ -f "$moto_venv/.installed" ] \
  && [ "$(cat "$moto_venv/.installed")" = "$want_moto" ] \
  && "$moto_venv/bin/python" -c 'import moto' 2>/dev/null; then
  :
else
  log "creating $moto_venv with $want_moto"
  rm -rf "$moto_venv"
  if ! python3 -m venv "$moto_venv"; then
    # Debian's python3 needs python3-venv for ensurepip.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      log "python3 -m venv failed: installing python3-venv"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >/dev/null || log "apt-get update failed (continuing)"
      apt-get install -y -qq python3-venv >/dev/null
      rm -rf "$moto_venv"
      python3 -m venv "$moto_venv"
    else
      log "python3 -m venv failed and cannot apt-get install python3-venv (not root?)"
      exit 1
    fi
  fi
  "$moto_venv/bin/pip" install -q --disable-pip-version-check "${moto_pkgs[@]}"
  "$moto_venv/bin/python" -c 'import moto.server, boto3, flask, flask_cors'
  echo "$want_moto" > "$moto_venv/.installed"
fi
# --- maturin, Metaflow, pandas and pytest for the Python package (python/): the wheel is
# built with this maturin, and the API and Metaflow tests install it beside Metaflow
# and pandas into fresh virtual environments made from this one's python. ---
pybuild_venv="$repo/target/py-build"
pybuild_pkgs=("maturin==1.16.0" "metaflow==2.19.39" "pandas==3.1.1" "pytest==9.2.0")
want_pybuild="${pybuild_pkgs[*]}"
if [ -x "$pybuild_venv/bin/maturin" ] && [ -f "$pybuild_venv/.installed" ] \
  && [ "$(cat "$pybuild_venv/.installed")" = "$want_pybuild" ]; then
  :
else
  log "creating $pybuild_venv with $want_pybuild"
  rm -rf "$pybuild_venv"
  python3 -m venv "$pybuild_venv"
  "$pybuild_venv/bin/pip" install -q --disable-pip-version-check "${pybuild_pkgs[@]}"
  "$pybuild_venv/bin/python" -c 'import metaflow, pandas'
  echo "$want_pybuild" > "$pybuild_venv/.installed"
fi
# The non-root Python test runs a venv of Debian's python3 as another user (a
# python3 under /root cannot be executed by them): it needs ensurepip.
if [ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c 'import ensurepip' 2>/dev/null \
  && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  log "installing python3-venv for /usr/bin/python3"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || log "apt-get update failed (continuing)"
  apt-get install -y -qq python3-venv >/dev/null
fi
# --- the Rust sibling 0.1.18 (the drop-in test runs it beside ours; the peers
# benchmark uses the same copy) ---
rs_root="$repo/target/peers/rs"
want_rs="resource-tracker 0.1.18"
if [ -x "$rs_root/bin/resource-tracker" ] && [ "$("$rs_root/bin/resource-tracker" --version 2>/dev/null)" = "$want_rs" ]; then
  :
else
  log "installing $want_rs into $rs_root (2-3 min)"
  cargo install --locked resource-tracker --version 0.1.18 --root "$rs_root" --quiet
fi
# --- release builds (`cargo xtask wheel --release`, `bash scripts/setup.sh --release`):
# the aarch64 standard library, and maturin with zig (PyPI's ziglang) in
# target/py-release, which links both architectures against glibc 2.17. Not for
# the tests, so only on request. ---
if [ "${1:-}" = "--release" ]; then
  if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    log "adding the aarch64-unknown-linux-gnu target"
    rustup target add aarch64-unknown-linux-gnu
  fi
  rel_venv="$repo/target/py-release"
  rel_pkgs=("maturin==1.16.0" "ziglang==0.17.0")
  want_rel="${rel_pkgs[*]}"
  if [ -x "$rel_venv/bin/maturin" ] && [ -f "$rel_venv/.installed" ] \
    && [ "$(cat "$rel_venv/.installed")" = "$want_rel" ]; then
    :
  else
    log "creating $rel_venv with $want_rel"
    rm -rf "$rel_venv"
    python3 -m venv "$rel_venv"
    "$rel_venv/bin/pip" install -q --disable-pip-version-check "${rel_pkgs[@]}"
    "$rel_venv/bin/python" -m ziglang version >/dev/null
    echo "$want_rel" > "$rel_venv/.installed"
  fi
  command -v dpkg-deb >/dev/null 2>&1 || { log "dpkg-deb missing (Debian's dpkg)"; exit 1; }
fi
log "ok"
