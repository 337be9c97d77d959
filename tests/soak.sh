#!/usr/bin/env bash
# The promise under faults (docs/operations/troubleshoot.md, "What ctcache promises"):
# clients, a writer and a fault driver (SIGKILL + restart, a full cache file
# system, damaged payloads, tight gc) against a debug ctcached for
# --seconds N (default 60), on a fixed --seed. Prints the table and a last
# `soak:` line; exits non-zero on a lost entry, wrong bytes, an unexpected
# error or a restart slower than 2 s. The disk-full fault needs root (tmpfs).
#   tests/soak.sh [--seconds N] [--seed N] [--clients N]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"
cargo build -q -p ctcached
CTCACHE_BIN_DIR="$CARGO_TARGET_DIR/debug" \
  cargo bench -q --profile dev -p ctcache-client --bench soak -- "$@"
