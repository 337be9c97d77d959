#!/usr/bin/env bash
# open_payload of a 256 MiB entry (gemm.pack_b.f32 of an 8192 x 8192 FLOAT
# weight, prepacked by a ctcached on a temp cache dir) vs reading the same
# payload file directly, page cache warm: time to first byte, full-read
# throughput (target >= 0.95x direct), and the total PSS of 8 processes
# mapping the entry (target <= 1.2x one payload), and the first serve after
# a daemon start (the payload file is hashed once) against a read() of the
# file. Medians of OPEN_PAYLOAD_BENCH_REPS (default 21) runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"
cargo build --release -q -p ctcached
CTCACHE_BIN_DIR="$CARGO_TARGET_DIR/release" cargo bench -q -p ctcache-client --bench open_payload_bench
