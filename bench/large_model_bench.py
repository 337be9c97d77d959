#!/usr/bin/env python3
"""A model past protobuf's 2 GiB limit: materialize streams it.

One synthetic model, ``--layers`` FLOAT MatMul weights of ``--dim`` x
``--dim`` (12 x 8192 x 8192 = 3 GiB) in one external data file, written
with numpy straight to the file (no ModelProto ever holds the weights).
For each target (onnxruntime-int4, -int8, -fp16):

* local: ``ctcachectl materialize --local`` (packs in that process): its
  wall time and peak RSS (``ru_maxrss`` of the waited child);
* daemon: a freshly started ``ctcached`` on an empty cache folder, answering
  before the clock starts; ``ctcachectl --socket S materialize`` (the daemon
  digests, packs, stores and writes): the command's wall time and the
  daemon's peak RSS (``VmHWM`` of /proc/PID/status, read before stopping it;
  the client's own peak is printed beside it);
* both outputs load in onnxruntime (``InferenceSession``) and one inference
  runs; the two give identical outputs;
* the anchor, onnxruntime's own tool for the target, in a child python
  process (its peak RSS is its own), bounded by ``--reference-timeout``:
  int4 ``onnx.load`` + ``MatMulNBitsQuantizer(bits=4, block_size=32,
  is_symmetric=True)`` + ``save_model_to_file(use_external_data_format=True)``;
  int8 ``quantize_dynamic(path, op_types_to_quantize=["MatMul"],
  use_external_data_format=True)``; fp16 ``convert_float_to_float16(path,
  keep_io_types=True)`` + ``onnx.save_model(save_as_external_data=True)``.
  A tool that fails or runs out of time is reported as "did not complete"
  with its last line of output.

Peak RSS counts the file pages a process maps and touches, as the kernel
does: the model file is in the page cache for every run (written just
before), so a process that maps the whole file shows it all. The target is
< 1024 MiB for every target and path.

Figures (RESULT lines for bench/all.sh, bench/results.py):
``materialize.large.{int4,int8,fp16}.{local,daemon}.{seconds,rss_mib}``;
the anchor of each is the reference tool's time or peak RSS in the same run
(none where it did not complete), the ratio anchor / value.

    python bench/large_model_bench.py [--bin-dir DIR] [--work DIR] [--layers 12] [--dim 8192]
                                      [--targets int4,int8,fp16] [--reference-timeout 900] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from materialize_bench import (BITS, BLOCK, SYMMETRIC, TOOLS, common_args, connect, drop_scratch, log,  # noqa: E402
                               make_model, mib, result, run_check, start_daemon, stop_daemon)

TARGETS = ("int4", "int8", "fp16")
RSS_TARGET_MIB = 1024
# Seconds a materialize may take before the bench gives up on it.
MATERIALIZE_TIMEOUT = 600


def reference_child(target: str, model: Path, out_dir: Path) -> int:
    """The reference tool for ``target`` on ``model``, writing into
    ``out_dir`` (run in a child process: ``--reference-child``)."""
    import logging

    import onnx

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    out = out_dir / "ref.onnx"
    if target == "int4":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        q = MatMulNBitsQuantizer(onnx.load(str(model)), bits=BITS, block_size=BLOCK, is_symmetric=SYMMETRIC)
        q.process()
        q.model.save_model_to_file(str(out), use_external_data_format=True)
    elif target == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(model, out, op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8,
                         use_external_data_format=True)
    else:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        m = convert_float_to_float16(str(model), keep_io_types=True)
        onnx.save_model(m, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="ref.onnx.data")
    size = sum(f.stat().st_size for f in out_dir.iterdir())
    print(f"wrote {out} ({mib(size)})", flush=True)
    return 0


# Runs its arguments as a child and writes the child's peak RSS (KiB) to
# $RSS_OUT. A child forked by this bench would report the bench's own peak:
# the kernel carries a process's peak across exec, and a fork starts from
# its parent's resident pages; forked from this small process, the figure's
# floor is this process's few MiB.
MEASURE = """import os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(os.environ["RSS_OUT"], "w") as f:
    f.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def run_measured(cmd: list[str], timeout: float, log_path: Path, env: dict | None = None) -> dict:
    """Runs ``cmd`` (through ``MEASURE``, in its own process group, output to
    ``log_path``) and waits for it: wall seconds, its peak RSS (MiB), exit
    status, and whether it ran past ``timeout`` (then it is killed)."""
    rss_out = log_path.with_suffix(".rss")
    env = dict(env or os.environ, RSS_OUT=str(rss_out))
    with open(log_path, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", MEASURE] + cmd, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            timed_out = True
        seconds = time.perf_counter() - t0
    rss = int(rss_out.read_text()) / 1024 if rss_out.exists() else float("nan")
    return {"seconds": seconds, "rss_mib": rss, "rc": proc.returncode, "timed_out": timed_out,
            "output": log_path.read_text(errors="replace")}


def last_line(text: str, width: int = 160) -> str:
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return (lines[-1] if lines else "no output")[:width]


def vm_hwm_mib(pid: int) -> float:
    """A process's peak resident set (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def check_output(model: Path, dim: int) -> tuple[np.ndarray, float]:
    """The output's result on one input (it loads in onnxruntime and runs),
    and the seconds the session took to open."""
    import onnxruntime as ort

    t = time.perf_counter()
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    opened = time.perf_counter() - t
    return run_check(sess, dim), opened


def materialize_cmd(bin_dir: Path, model: Path, out: Path, target: str, socket: Path | None) -> list[str]:
    cmd = [str(bin_dir / "ctcachectl"), "--json", "-q"]
    cmd += ["--socket", str(socket)] if socket else []
    cmd += ["materialize", str(model), "-o", str(out), "--target", f"onnxruntime-{target}"]
    return cmd + ([] if socket else ["--local"])


def materialized(run: dict, what: str) -> dict:
    """The JSON a materialize printed, or an error saying why there is none."""
    if run["rc"] != 0 or run["timed_out"]:
        raise RuntimeError(f"{what} failed (exit {run['rc']}): {last_line(run['output'], 400)}")
    return json.loads(run["output"][run["output"].index("{"):])


def through_local(a, model: Path, root: Path, target: str) -> dict:
    root.mkdir()
    out = root / "out" / "model.onnx"
    run = run_measured(materialize_cmd(a.bin_dir, model, out, target, None), MATERIALIZE_TIMEOUT,
                       root / "ctcachectl.log")
    run["json"] = materialized(run, f"ctcachectl materialize --local --target onnxruntime-{target}")
    run["y"], run["session"] = check_output(out, a.dim)
    return run


def through_daemon(a, model: Path, root: Path, target: str) -> dict:
    """A fresh daemon on an empty cache: one Materialize through it."""
    root.mkdir()
    proc, _cache, sock = start_daemon(a.bin_dir, root)
    try:
        if connect(proc, sock, root) is None:
            raise RuntimeError("ctcached did not start (its log is above)")
        started = vm_hwm_mib(proc.pid)
        out = root / "out" / "model.onnx"
        out.parent.mkdir()
        run = run_measured(materialize_cmd(a.bin_dir, model, out, target, sock), MATERIALIZE_TIMEOUT,
                           root / "ctcachectl.log")
        run["client_rss_mib"] = run["rss_mib"]
        run["rss_mib"] = vm_hwm_mib(proc.pid)
        run["started_rss_mib"] = started
    finally:
        stop_daemon(proc)
    run["json"] = materialized(run, f"ctcachectl materialize --target onnxruntime-{target} (daemon)")
    run["y"], run["session"] = check_output(out, a.dim)
    return run


def through_reference(a, model: Path, root: Path, target: str) -> dict:
    out_dir = root / "out"
    out_dir.mkdir(parents=True)
    env = dict(os.environ, TMPDIR=str(root))  # the tools' temp copies land in the scratch folder
    cmd = [sys.executable, __file__, "--reference-child", target, str(model), str(out_dir)]
    run = run_measured(cmd, a.reference_timeout, root / "reference.log", env)
    run["completed"] = run["rc"] == 0 and not run["timed_out"]
    if run["timed_out"]:
        run["why"] = f"timed out after {a.reference_timeout:g} s"
    elif run["rc"] < 0:
        run["why"] = f"killed by signal {-run['rc']} (out of memory?)"
    elif run["rc"] != 0:
        run["why"] = last_line(run["output"])
    return run


def one_target(a, model: Path, work: Path, target: str) -> dict:
    """The three ways for one target, each output removed once checked."""
    root = work / target
    root.mkdir()
    try:
        local = through_local(a, model, root / "local", target)
        log(f"  local:     {local['seconds']:7.2f} s, peak RSS {local['rss_mib']:7.0f} MiB "
            f"(packed {local['json']['packed']}, session opens in {local['session']:.2f} s)")
        daemon = through_daemon(a, model, root / "daemon", target)
        log(f"  daemon:    {daemon['seconds']:7.2f} s, daemon peak RSS {daemon['rss_mib']:7.0f} MiB "
            f"(at start {daemon['started_rss_mib']:.0f} MiB; the client's {daemon['client_rss_mib']:.0f} MiB; "
            f"packed {daemon['json']['packed']}, session opens in {daemon['session']:.2f} s)")
        if not np.array_equal(local["y"], daemon["y"]):
            raise RuntimeError(f"{target}: the local and daemon outputs give different results")
        if a.reference_timeout > 0:
            ref = through_reference(a, model, root / "reference", target)
        else:
            ref = {"completed": False, "why": "not run (--reference-timeout 0)"}
        if ref["completed"]:
            log(f"  reference: {ref['seconds']:7.2f} s, peak RSS {ref['rss_mib']:7.0f} MiB ({TOOLS[target]})")
        else:
            log(f"  reference: did not complete ({TOOLS[target]}): {ref['why']}")
        return {"local": local, "daemon": daemon, "reference": ref}
    finally:
        drop_scratch(root, a.keep)


def report(results: dict, layers: int, dim: int) -> None:
    """The summary table and one RESULT line per figure."""
    size = layers * dim * dim * 4
    what = (f"{size / (1 << 30):.1f} GiB" if size >= 1 << 30 else mib(size)) + \
        f" fp32 model ({layers} x {dim} x {dim} MatMuls, external data)"
    log("\n==== summary ====")
    log(f"{'target':6} {'way':10} {'seconds':>9} {'peak RSS MiB':>13}  {'RSS < 1 GiB':>11}")
    for target, r in results.items():
        ref = r["reference"]
        for way in ("local", "daemon"):
            m = r[way]
            log(f"{target:6} {way:10} {m['seconds']:9.2f} {m['rss_mib']:13.0f}  "
                f"{'PASS' if m['rss_mib'] < RSS_TARGET_MIB else 'MISS':>11}")
        if ref["completed"]:
            log(f"{target:6} {'reference':10} {ref['seconds']:9.2f} {ref['rss_mib']:13.0f}  ({TOOLS[target]})")
        else:
            log(f"{target:6} {'reference':10} did not complete ({TOOLS[target]}): {ref['why']}")
    for target, r in results.items():
        ref = r["reference"]
        tool = TOOLS[target] if ref["completed"] else f"{TOOLS[target]} (did not complete: {ref['why']})"
        for way, how in (("local", ("materialize --local, wall time", "materialize --local, its peak RSS")),
                         ("daemon", ("through a fresh ctcached, wall time",
                                     "through a fresh ctcached, the daemon's peak RSS"))):
            for fig, unit, limit, said in (("seconds", "s", "", how[0]),
                                           ("rss_mib", "MiB", f"value<{RSS_TARGET_MIB}", how[1])):
                value = r[way][fig]
                anchor = ref[fig] if ref["completed"] else None
                label = f"{what} to onnxruntime-{target}, {said}, vs {tool}".replace('"', "'")
                result(f"materialize.large.{target}.{way}.{fig}", label, value, unit, anchor,
                       None if anchor is None else anchor / value, limit)


def main() -> int:
    if sys.argv[1:2] == ["--reference-child"]:
        target, model, out_dir = sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
        return reference_child(target, model, out_dir)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(ap, layers=12, dim=8192)
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated, of int4, int8, fp16")
    ap.add_argument("--reference-timeout", type=float, default=900,
                    help="seconds each reference tool may take; 0: no reference")
    a = ap.parse_args()
    targets = [t for t in a.targets.split(",") if t]
    if not targets or any(t not in TARGETS for t in targets):
        ap.error(f"--targets takes a comma-separated list of {', '.join(TARGETS)}, not {a.targets!r}")
    for b in ("ctcached", "ctcachectl"):
        if not os.access(a.bin_dir / b, os.X_OK):
            log(f"{a.bin_dir / b} missing: cargo build --release -p ctcached -p ctcachectl")
            return 2
    # A SIGTERM (a timeout around the bench) still removes the scratch folder.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import onnxruntime as ort

    work = a.work or Path(tempfile.mkdtemp(prefix="ctclmb-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        (work / "model").mkdir()
        t = time.perf_counter()
        model = make_model(work / "model", a.layers, a.dim)
        log(f"model: {a.layers} x MatMul [{a.dim} x {a.dim}] FLOAT = {mib(a.layers * a.dim * a.dim * 4)} "
            f"external data ({model}, written in {time.perf_counter() - t:.1f} s); onnxruntime {ort.__version__}; "
            f"{os.cpu_count()} CPUs")
        results = {}
        for target in targets:
            log(f"\n{target}:")
            results[target] = one_target(a, model, work, target)
        report(results, a.layers, a.dim)
        return 0
    finally:
        drop_scratch(work, a.keep)


if __name__ == "__main__":
    sys.exit(main())
