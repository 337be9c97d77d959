#!/usr/bin/env bash
# The fleet tier end to end on Garage 2.5 (three nodes on loopback,
# replication factor 3; tests/python/test_garage.py). Builds garage once
# (cargo install, a release build, as a server runs: about 10 minutes on 2
# cores, as long as a debug build; kept under /var/tmp, later runs skip the
# build) and the ctcache binaries, then runs the test.
#
#   tests/garage_e2e.sh            build what is missing, run
#   tests/garage_e2e.sh --no-build skip (exit 0, say so) when garage is not built yet
#
# Env: GARAGE_ROOT (default /var/tmp/garage-2.5.0-release), CARGO_TARGET_DIR, CARGO, PYTHON
# (default /var/tmp/ctcache-venv/bin/python, with pytest, boto3, onnx, numpy).
set -euo pipefail
cd "$(dirname "$0")/.."

GARAGE_VERSION=2.5.0
GARAGE_ROOT=${GARAGE_ROOT:-/var/tmp/garage-$GARAGE_VERSION-release}
GARAGE=$GARAGE_ROOT/bin/garage
PYTHON=${PYTHON:-/var/tmp/ctcache-venv/bin/python}
TARGET=$(realpath -m "${CARGO_TARGET_DIR:-target}")
CARGO=${CARGO:-cargo}  # xcargo where builds are serialized

if [[ ! -x $GARAGE ]]; then
    if [[ ${1:-} == --no-build ]]; then
        echo "garage_e2e: skipped: $GARAGE is not built (run without --no-build to build it once)"
        exit 0
    fi
    echo "garage_e2e: building garage $GARAGE_VERSION into $GARAGE_ROOT (once; this takes a while)"
    start=$(date +%s)
    cargo install garage --version "$GARAGE_VERSION" --locked --no-default-features \
        --features bundled-libs,sqlite --root "$GARAGE_ROOT"
    echo "garage_e2e: garage built in $(( $(date +%s) - start )) s"
fi
"$GARAGE" --version

"$CARGO" build -p ctcached -p ctcachectl --bins
export CTCACHE_GARAGE=$GARAGE
export CTCACHECTL=$TARGET/debug/ctcachectl CTCACHE_BIN_DIR=$TARGET/debug
cd tests/python
exec "$PYTHON" -m pytest -q -rs test_garage.py
