#!/usr/bin/env bash
# A fresh host's time from a model appearing in its watched folder to all
# entries ready (eight 4096 x 4096 fp32 MatMul weights), fetched from the
# fleet tier (Garage 2.5: three nodes on loopback, replication factor 3) vs
# packed locally, per format (ort.matmul_nbits, gemm.pack_b.f32), with
# fetch = always, never (the anchor) and auto (which path the cost rule chose),
# and the bytes moved; then runtime forms of real models fetched vs compiled;
# see bench/fleet_bench.py (its flags pass through: --layers, --dim, --reps,
# --formats, --forms, --no-forms, --no-packs, --no-drop-caches). Drops the page cache
# before each timed run (needs root).
#
# Needs a garage binary: $CTCACHE_GARAGE, else $GARAGE_ROOT/bin/garage
# (default /var/tmp/garage-2.5.0-release). Without one the bench says so and exits 0
# with no figures: it does not build garage (tests/garage_e2e.sh does, once:
# a release build, which the test command keeps).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"
GARAGE=${CTCACHE_GARAGE:-${GARAGE_ROOT:-/var/tmp/garage-2.5.0-release}/bin/garage}
if [[ ! -x $GARAGE ]]; then
  echo "fleet_bench: skipped, no figures: no garage binary at $GARAGE" \
    "(tests/garage_e2e.sh builds garage 2.5.0 once, ~10 min; or set CTCACHE_GARAGE)"
  exit 0
fi
cargo build --release -q -p ctcached -p ctcachectl -p ctcache-onnxruntime-worker -p ctcache-openvino-worker
exec "${CTCACHE_VENV:-/var/tmp/ctcache-venv}/bin/python" bench/fleet_bench.py --garage "$GARAGE" \
  --bin-dir "$CARGO_TARGET_DIR/release" "$@"
