#!/usr/bin/env bash
# Digest throughput: `ctcachectl digest` on a model with 1 GiB of external-data
# initializers vs `b3sum` on the same data file, in the same run. Prints both
# throughputs, the ratio (target >= 0.9) and ctcachectl's peak RSS (target:
# under 64 MiB plus mapped pages; RssAnon is the unmapped part).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}"
VENV="${CTCACHE_VENV:-/var/tmp/ctcache-venv}"
SIZE_MIB="${SIZE_MIB:-1024}"
WORK="${WORK:-$(mktemp -d /var/tmp/ctcache-digest-bench.XXXXXX)}"

command -v b3sum >/dev/null || cargo install b3sum --locked -q
[ -x "$VENV/bin/python" ] || { python3 -m venv "$VENV"; "$VENV/bin/pip" install -q -r tests/python/requirements.txt; }
cargo build --release -q -p ctcachectl
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
cat "$DATA" > /dev/null  # both runs read from the page cache

now() { date +%s.%N; }
best_of() { # best wall time of 3 runs of "$@"
  local best=999999 t0 t1 d
  for _ in 1 2 3; do
    t0=$(now); "$@" > /dev/null; t1=$(now)
    d=$(echo "$t1 - $t0" | bc -l); if (( $(echo "$d < $best" | bc -l) )); then best=$d; fi
  done
  echo "$best"
}
T_CT=$(best_of "$CTL" digest "$WORK/model.onnx" --json)
T_B3=$(best_of b3sum "$DATA")
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
echo "ratio ctcache/b3sum: $(echo "scale=3; $T_B3 / $T_CT" | bc -l) (target >= 0.9)"
echo "ctcachectl peak RSS: anonymous $ANON KiB (target < 64 MiB), file-backed mapped pages $((FILE / 1024)) MiB"
rm -rf "$WORK"
