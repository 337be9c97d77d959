#!/usr/bin/env bash
# Runs README.md's "Five-minute walkthrough" shell block as written, on a
# fresh HOME (so a fresh cache and the default socket under it), with
# XDG_RUNTIME_DIR unset as for root and services, against the binaries in
# $CARGO_TARGET_DIR/debug (or $CTCACHE_BIN_DIR) and a small model written by
# onnx: model.onnx, X[1, 512] -> MatMul W[512, 256] -> Relu -> MatMul W2 -> Y.
#
# The block's two set-up commands (cargo build, export PATH) must read
# exactly as below; they are replaced by a PATH to the built binaries. After
# the line that starts the daemon in the background the script waits until it
# answers, as a reader typing the next command would. Fails when a command
# fails, when an output line is an error ("error: ..."), when `strip` does not give back
# model.onnx byte for byte (the block's comment says it does), or when the
# materialized model is inside the watched folder or does not open in onnx
# (load + check_model by path) and onnxruntime.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

BIN="${CTCACHE_BIN_DIR:-${CARGO_TARGET_DIR:-/var/tmp/ctcache-target}/debug}"
PY="${CTCACHE_VENV:-/var/tmp/ctcache-venv}/bin/python"
for b in ctcached ctcachectl; do
  [ -x "$BIN/$b" ] || { echo "readme walkthrough: $BIN/$b not built" >&2; exit 1; }
done

SETUP_1='cargo build --release'
SETUP_2='export PATH="$PWD/target/release:$PATH"   # or $CARGO_TARGET_DIR/release'

# wait_until SECONDS WHAT COMMAND...: runs COMMAND (quietly) until it succeeds;
# after SECONDS, says WHAT it waited for and fails. The script's one wait,
# also written into the walkthrough's script below.
wait_until() {
  local limit="$1" what="$2"
  local deadline=$((SECONDS + limit))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      echo "readme walkthrough: $what: not within $limit s" >&2
      return 1
    fi
    sleep 0.1
  done
}
gone() { ! kill -0 "$1"; }

work="$(mktemp -d /tmp/ctcache-readme.XXXXXX)"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill "$daemon_pid" 2>/dev/null || true
    # Not this shell's child (the walkthrough's shell started it): wait for
    # it to be gone, or rm races its last writes.
    wait_until 30 "ctcached (pid $daemon_pid) gone" gone "$daemon_pid" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The block under the walkthrough heading.
awk '/^## Five-minute walkthrough/ { in_section = 1; next }
     in_section && /^```sh$/ { in_block = 1; next }
     in_block && /^```$/ { exit }
     in_block { print }' README.md >"$work/block.sh"
[ -s "$work/block.sh" ] || { echo "readme walkthrough: no sh block under '## Five-minute walkthrough'" >&2; exit 1; }
mapfile -t lines <"$work/block.sh"
if [ "${lines[0]}" != "$SETUP_1" ] || [ "${lines[1]}" != "$SETUP_2" ]; then
  printf 'readme walkthrough: the set-up commands changed; expected\n  %s\n  %s\ngot\n  %s\n  %s\n' \
    "$SETUP_1" "$SETUP_2" "${lines[0]}" "${lines[1]}" >&2
  exit 1
fi

# The script to run: the block after its set-up, a readiness wait after the
# background daemon line, the daemon's pid kept for the cleanup.
{
  echo 'set -euo pipefail'
  echo "export PATH=\"$BIN:\$PATH\""
  declare -f wait_until
  for line in "${lines[@]:2}"; do
    printf '%s\n' "$line"
    if [[ "$line" =~ ^ctcached\ .*\&[[:space:]]*(#.*)?$ ]]; then
      echo 'echo $! >"$WALK_DAEMON_PID"'
      echo 'wait_until 60 "ctcached answering" ctcachectl status'
    fi
  done
} >"$work/run.sh"

mkdir -p "$work/home" "$work/cwd"
"$PY" - "$work/cwd/model.onnx" <<'EOF'
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(7)
w = (rng.standard_normal((512, 256)) / 16).astype(np.float32)   # 131072 elements: the policy packs it
w2 = (rng.standard_normal((256, 64)) / 16).astype(np.float32)   # too small for the policy
g = helper.make_graph(
    [helper.make_node("MatMul", ["X", "W"], ["h"], name="fc1"),
     helper.make_node("Relu", ["h"], ["a"], name="relu"),
     helper.make_node("MatMul", ["a", "W2"], ["Y"], name="fc2")],
    "readme", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 512])],
    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 64])],
    [numpy_helper.from_array(w, "W"), numpy_helper.from_array(w2, "W2")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="readme-walkthrough")
m.ir_version = 9
onnx.checker.check_model(m)
onnx.save(m, sys.argv[1])
EOF

echo "running the README walkthrough (HOME=$work/home, XDG_RUNTIME_DIR unset)"
status=0
(
  cd "$work/cwd"
  env -u XDG_RUNTIME_DIR -u XDG_CACHE_HOME -u XDG_CONFIG_HOME -u XDG_DATA_HOME \
    $(env | awk -F= '/^CTCACHE_/ { printf "-u %s ", $1 }') \
    HOME="$work/home" WALK_DAEMON_PID="$work/daemon.pid" RUST_LOG=info \
    bash -x "$work/run.sh"
) >"$work/out.log" 2>&1 || status=$?
[ -s "$work/daemon.pid" ] && daemon_pid="$(cat "$work/daemon.pid")"

fail() {
  echo "---- output ----" >&2
  cat "$work/out.log" >&2
  echo "readme walkthrough: $*" >&2
  exit 1
}
[ "$status" = 0 ] || fail "a command failed (exit $status)"
# An error message ("error: ...", "Error: ...") or an ERROR log line; bash -x
# traces ("+ command") are the commands themselves, not output.
error_lines="$(grep -v '^+' "$work/out.log" | grep -E '(^|[^[:alnum:]_])(error|Error|ERROR):|[[:space:]]ERROR[[:space:]]' || true)"
[ -z "$error_lines" ] || fail "output says error: $(head -3 <<<"$error_lines")"
cmp -s "$work/cwd/plain.onnx" "$work/cwd/model.onnx" || fail "strip did not give back model.onnx"
[ -n "$daemon_pid" ] || fail "no background ctcached line in the block"
out="$(sed -n 's/^ctcachectl materialize .* -o \([^ ]*\).*/\1/p' "$work/block.sh" | tail -1)"
out="${out/#\~/$work/home}"
[ -f "$out" ] || fail "materialize wrote no $out"
case "$out" in
  "$work/home/models/"*) fail "materialize writes into the watched folder ~/models" ;;
esac
"$PY" - "$out" <<'EOF'
import sys

import numpy as np
import onnx
import onnxruntime as ort

onnx.checker.check_model(sys.argv[1])  # by path: external data checked, as onnx >= 1.21 does
onnx.load(sys.argv[1])
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
y = sess.run(None, {"X": np.ones((1, 512), np.float32)})[0]
assert y.shape == (1, 64) and np.isfinite(y).all()
EOF
cat "$work/out.log"
echo "readme walkthrough: ok ($(grep -c '^+ ctcache' "$work/out.log") commands)"
