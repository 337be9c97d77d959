#!/usr/bin/env bash
# ctcached under load within its bounds: 32 clients on their own
# connections doing ResolveModel, Lookup, AcquireLease + map + ReleaseLease
# and ReadPayload for LOAD_BENCH_SECS (default 20) on a temp cache dir,
# while models land in the watched folder and gc runs with a 4 MiB budget.
# Fails on any error but RESOURCE_EXHAUSTED and NOT_FOUND of a collected
# entry, on wrong bytes, on an entry served after gc removed it, and on
# daemon RSS growing; prints p50/p99 per RPC.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"
cargo build --release -q -p ctcached
CTCACHE_BIN_DIR="$CARGO_TARGET_DIR/release" cargo bench -q -p ctcache-client --bench load_bench
