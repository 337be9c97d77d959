#!/usr/bin/env bash
# A fresh process to a ready onnxruntime session on real models (the MiniLM encoder, a conv net): ctcache warm vs the plain fp32 session vs onnxruntime's quantizer then session, and ctcache's runtime form vs onnxruntime's own saved optimized model, one process and four at once.
set -euo pipefail; cd "$(dirname "$0")/.." && export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"
cargo build --release -q -p ctcached -p ctcache-onnxruntime-worker -p ctcache-openvino-worker -p ctcachectl && exec "${CTCACHE_VENV:-/var/tmp/ctcache-venv}/bin/python" bench/session_bench.py "$@"
