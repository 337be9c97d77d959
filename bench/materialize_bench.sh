#!/usr/bin/env bash
# fp32 model -> 4-bit onnxruntime session: onnxruntime's quantizer vs ctcache materialize (cold; warm with --link auto and hard).
set -euo pipefail; cd "$(dirname "$0")/.." && export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"
cargo build --release -p ctcached -p ctcachectl -p ctcache-onnxruntime-worker && exec "${CTCACHE_VENV:-/var/tmp/ctcache-venv}/bin/python" bench/materialize_bench.py "$@"
