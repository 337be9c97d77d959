#!/usr/bin/env bash
# Digest throughput: `ctcachectl digest` on a model with 1 GiB of external-data
# initializers vs `b3sum` on the same data file, in the same run. Prints both
# throughputs (best of DIGEST_BENCH_REPS, default 5, alternating runs), the
# ratio (target >= 1.0), the same digest in a process that does nothing
# else (the floor of the command: what its start and command line cost),
# and ctcachectl's peak RSS (target:
# under 64 MiB plus mapped pages; RssAnon is the unmapped part), then the
# same as RESULT lines for bench/all.sh (bench/results.py). Then
# benches/digest_paths.rs on the same files: the digest against blake3 of the
# bytes already in memory (digest.memory: what the mapping costs) and the
# other ways to bring the pages in, each timed the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"
VENV="${CTCACHE_VENV:-/var/tmp/ctcache-venv}"
SIZE_MIB="${SIZE_MIB:-1024}"
WORK="${WORK:-$(mktemp -d /var/tmp/ctcache-digest-bench.XXXXXX)}"
trap 'rm -rf "$WORK"' EXIT

command -v b3sum >/dev/null || cargo install b3sum --locked -q
[ -x "$VENV/bin/python" ] || { python3 -m venv "$VENV"; "$VENV/bin/pip" install -q -r tests/python/requirements.txt; }
cargo build --release -q -p ctcachectl
cargo bench -q -p ctcache --bench digest_paths --no-run
CTL="$CARGO_TARGET_DIR/release/ctcachectl"

"$VENV/bin/python" - "$WORK" "$SIZE_MIB" <<'PY'
import os, sys
import numpy as np, onnx
from onnx import helper, TensorProto
work, size_mib = sys.argv[1], int(sys.argv[2])
n_tensors = 8
per = size_mib * (1 << 20) // n_tensors // 4  # floats per tensor
rows = 1024
cols = per // rows
rng = np.random.default_rng(0)
inits = []
with open(os.path.join(work, "weights.bin"), "wb") as f:
    for i in range(n_tensors):
        a = rng.standard_normal((rows, cols), dtype=np.float32)
        off = f.tell()
        f.write(a.tobytes())
        t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[rows, cols])
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "weights.bin"), ("offset", str(off)), ("length", str(a.nbytes))):
            e = t.external_data.add(); e.key, e.value = k, v
        inits.append(t)
g = helper.make_graph([], "bench", [], [helper.make_tensor_value_info("w0", TensorProto.FLOAT, None)], inits)
onnx.save(helper.make_model(g), os.path.join(work, "model.onnx"))
PY

DATA="$WORK/weights.bin"
BYTES=$(stat -c %s "$DATA")
# Both read from the page cache, with the file written back first (else the
# writeback of 1 GiB of dirty pages competes with whichever runs first).
sync "$DATA"
cat "$DATA" > /dev/null

# $EPOCHREALTIME, not date(1): the interval then holds only the command's
# own fork, exec and run.
elapsed() { local t0=$EPOCHREALTIME; "$@" > /dev/null; local t1=$EPOCHREALTIME; echo "$t1 - $t0" | bc -l; }
min() { printf '%s\n' "$@" | sort -g | head -1; }
# The process floor: a process that only opens the model and runs the same
# digest_all (digest_paths --once), without ctcachectl's command line and
# the start of its large binary.
FLOOR=$(cargo bench -p ctcache --bench digest_paths --no-run 2>&1 | sed -n 's/^ *Executable .*(\(.*\))$/\1/p' | tail -1)
[ -x "$FLOOR" ] || { echo "digest_bench: no digest_paths executable found" >&2; exit 1; }
# Best of REPS runs each, alternating, so that load changing during the run
# hits all alike.
REPS="${DIGEST_BENCH_REPS:-5}"
ct=() b3=() fl=()
for _ in $(seq "$REPS"); do
  ct+=("$(elapsed "$CTL" digest "$WORK/model.onnx" --json)")
  b3+=("$(elapsed b3sum "$DATA")")
  fl+=("$(elapsed "$FLOOR" --once "$WORK/model.onnx")")
done
T_CT=$(min "${ct[@]}")
T_B3=$(min "${b3[@]}")
T_FL=$(min "${fl[@]}")
# Peak anonymous (heap, stacks) vs file-backed (mapped data) memory, sampled.
"$CTL" digest "$WORK/model.onnx" > /dev/null & PID=$!
ANON=0; FILE=0
while [ -r /proc/$PID/status ]; do
  a=$(awk '/^RssAnon/ {print $2}' /proc/$PID/status 2>/dev/null || echo 0)
  f=$(awk '/^RssFile/ {print $2}' /proc/$PID/status 2>/dev/null || echo 0)
  [ "${a:-0}" -gt "$ANON" ] && ANON=$a; [ "${f:-0}" -gt "$FILE" ] && FILE=$f
  sleep 0.005
done
wait $PID
GBS() { echo "scale=2; $BYTES / $1 / 1000000000" | bc -l; }
echo "data: $((BYTES >> 20)) MiB in 8 external initializers"
echo "ctcachectl digest: $(GBS "$T_CT") GB/s (${T_CT}s)"
echo "b3sum:             $(GBS "$T_B3") GB/s (${T_B3}s)"
RATIO=$(echo "scale=3; $T_B3 / $T_CT" | bc -l)
echo "ratio ctcache/b3sum: $RATIO (target >= 1.0)"
echo "digest_all alone in a process (digest_paths --once): $(GBS "$T_FL") GB/s (${T_FL}s), $(echo "scale=3; $T_B3 / $T_FL" | bc -l)x b3sum; ctcachectl takes $(printf %.2f "$(echo "($T_CT - $T_FL) * 1000" | bc -l)") ms more"
echo "ctcachectl peak RSS: anonymous $ANON KiB (target < 64 MiB), file-backed mapped pages $((FILE / 1024)) MiB"
echo "RESULT name=digest.b3sum value=$(GBS "$T_CT") unit=GB/s anchor=$(GBS "$T_B3") ratio=$RATIO target=ratio>=1.0 label=\"ctcachectl digest of $((BYTES >> 20)) MiB external data vs b3sum of the file\""
echo "RESULT name=digest.rss_anon value=$(echo "scale=1; $ANON / 1024" | bc -l) unit=MiB target=value<64 label=\"ctcachectl digest peak anonymous RSS\""
cargo bench -q -p ctcache --bench digest_paths -- "$WORK/model.onnx" "$DATA"
