#!/usr/bin/env bash
# Packing throughput: each GPU-capable packer (ort.matmul_nbits, ggml.q8_0,
# ggml.q4_0, cast.f16) on the CPU and on wgpu, on a 4096 x 4096 FLOAT weight,
# next to onnxruntime / gguf / the half crate / memcpy on the same data, with
# the ratios against their targets (>= 4x ORT, >= 5x gguf, >= 0.8x half), and
# the peak RSS of `ctcachectl pack` (target <= source + output + 64 MiB).
# Then the CPU packers of onnxruntime's Python tools (ort.quantize_dynamic per
# tensor and per channel, ort.float16) against that numpy code on the same
# weight, bytes compared, target >= 10x (PACK_BENCH_ONLY=reference: only those).
# Without a GPU, wgpu uses a software adapter if installed (mesa lavapipe:
# apt-get install mesa-vulkan-drivers) or is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"
export CTCACHE_VENV="${CTCACHE_VENV:-/var/tmp/ctcache-venv}"
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"; chmod 700 "$XDG_RUNTIME_DIR"; export XDG_RUNTIME_DIR
fi
[ -x "$CTCACHE_VENV/bin/python" ] || { python3 -m venv "$CTCACHE_VENV"; "$CTCACHE_VENV/bin/pip" install -q -r tests/python/requirements.txt; }
cargo build --release -q -p ctcachectl
cargo bench -q -p ctcache-kernels --bench pack_bench
