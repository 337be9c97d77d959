#!/usr/bin/env bash
# A 3 GiB fp32 model (external data, past protobuf's 2 GiB) to each onnxruntime target: time and peak RSS of materialize (--local and through a fresh ctcached) vs onnxruntime's own tools.
set -euo pipefail; cd "$(dirname "$0")/.." && export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"
cargo build --release -p ctcached -p ctcachectl && exec "${CTCACHE_VENV:-/var/tmp/ctcache-venv}/bin/python" bench/large_model_bench.py "$@"
