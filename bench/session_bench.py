#!/usr/bin/env python3
"""A fresh process to a ready onnxruntime session, on real models.

What a user waits for: a new Python process that imports what it needs and
returns from its session call. Timed from the parent's spawn to the child's
return (the child prints the wall clock when its session is ready), one
process alone and four at once (the slowest of the four), median of
``--runs`` (default 5), on two models of the real-model corpus
(``tests/python/real_models.py``): the MiniLM encoder and ddddocr's conv
net. Four ways, one run:

* ``floor``: Python and ``import onnxruntime``, no session: what no way
  can go below;
* ``plain``: ``onnxruntime.InferenceSession`` on the fp32 model;
* ``reference``: onnxruntime's own tool, then the session on its model
  (``MatMulNBitsQuantizer``, 4 bits, block 32, symmetric: what the default
  target of ``inference_session`` replaces);
* ``warm``: ``ctcache.ort.inference_session`` with its default target,
  entries already in the cache of a fresh daemon (release build) that one
  call packed; for the conv net, which has nothing to rewrite, the session
  opens the model as it is;
* ``own``: onnxruntime's own cache, as a user keeps it by hand: the
  optimized model saved once (``optimized_model_filepath`` at the level
  below), each session opened from it with the optimizer off;
* ``form``: ``ctcache.ort.inference_session(target=None, optimize=level)``,
  the daemon's form made already (runtime forms, D15); ``form_cold``: the
  same with the store emptied before each run, so that the daemon's worker
  compiles it (the runtime's own compile plus ctcache's publish).

And OpenVINO's four, for its CPU plugin: ``ov_plain``
(``Core().compile_model(model, "CPU")``), ``ov_cache`` (the same with
OpenVINO's own ``CACHE_DIR``, warm), ``ov_form``
(``ctcache.openvino.compile_model``, the daemon's form made already) and
``ov_form_cold`` (the store emptied first: the worker compiles it).

The level is the model's: ``all`` for the conv net (its NCHWc layouts),
``extended`` for the encoder, where ``all`` adds nothing a saved model can
keep and loads slower than the default session.

The children import the Python client pip-installed into the bench's
work folder, as users run it.

Each figure is a RESULT line (``bench/results.py``): ``session.<model>.warm.p1``
and ``.p4`` against the plain session, ``session.<model>.reference.p1``
against warm, ``session.<model>.floor.p1`` with warm's ratio to it (the
goal: warm within 1.2x of the floor); ``session.<model>.form.p1`` and
``.p4`` against the plain session (never slower; at most half of it on
the conv net), ``session.<model>.own.p1`` against the form (the form at
least as fast as the runtime's own cache), ``session.<model>.form_cold.p1``
against the plain session; ``session.<model>.ov_form.p1`` and ``.p4``
against ``ov_plain`` (never slower; at most half of it on the conv net),
``session.<model>.ov_cache.p1`` against ``ov_form`` (the form at least as
fast as OpenVINO's own cache), ``session.<model>.ov_form_cold.p1`` against
``ov_plain``; ``session.<model>.form.rss_mib`` and ``.ov_form.rss_mib``:
a lone process's peak RSS against the plain session's and compile_model's.

    python bench/session_bench.py [--bin-dir DIR] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "client" / "python"))

import onnxruntime  # noqa: E402
import real_models  # noqa: E402
from materialize_bench import connect, start_daemon, stop_daemon  # noqa: E402

MODELS = {"minilm": "minilm-l3", "conv": "ddddocr-det"}
#: The level each model's form is made at (see the module's doc).
LEVELS = {"minilm": "extended", "conv": "all"}
PROVIDERS = '["CPUExecutionProvider"]'

# The child: its imports and its session are what is timed.
CHILD = r"""
import sys, time, logging, warnings
logging.disable(logging.CRITICAL)
warnings.simplefilter("ignore")
mode, model, socket, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
if mode == "floor":
    import onnxruntime
elif mode == "plain":
    import onnxruntime
    onnxruntime.InferenceSession(model, providers=%(p)s)
elif mode == "reference":
    import onnx, onnxruntime
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    q = MatMulNBitsQuantizer(onnx.load(model), bits=4, block_size=32, is_symmetric=True)
    q.process()
    onnxruntime.InferenceSession(q.model.model.SerializeToString(), providers=%(p)s)
elif mode == "warm":
    import ctcache.ort
    s = ctcache.ort.inference_session(model, socket=socket, fallback=False, providers=%(p)s)
elif mode == "own":
    import onnxruntime
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    onnxruntime.InferenceSession(extra, so, providers=%(p)s)
elif mode in ("form", "form_cold"):
    import ctcache.ort
    s = ctcache.ort.inference_session(model, target=None, optimize=extra, socket=socket)
    if s.ctcache_report.source != "daemon":
        raise SystemExit(f"no form: {s.ctcache_report.why}")
elif mode == "ov_plain":
    import openvino
    openvino.Core().compile_model(model, "CPU")
elif mode == "ov_cache":
    import openvino
    core = openvino.Core()
    core.set_property({"CACHE_DIR": extra})
    core.compile_model(model, "CPU")
elif mode in ("ov_form", "ov_form_cold"):
    import ctcache.openvino
    c = ctcache.openvino.compile_model(model, socket=socket)
    if c.ctcache_report.source != "daemon":
        raise SystemExit(f"no form: {c.ctcache_report.why}")
# This process's own peak RSS (VmHWM: getrusage's maxrss carries the
# forking parent's over exec), kB.
hwm = next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(time.time(), hwm, flush=True)
""" % {"p": PROVIDERS}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


#: The peak RSS (MiB) of the last child each mode ran alone.
PEAK_RSS: dict[str, float] = {}


def ready_after(mode: str, model: Path, socket: Path, procs: int, env: dict, extra: str = "") -> float:
    """Seconds from spawning `procs` children at once until the slowest is
    ready; alone, its peak RSS is kept in PEAK_RSS."""
    start = time.time()
    children = [subprocess.Popen([sys.executable, "-c", CHILD, mode, str(model), str(socket), extra],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                for _ in range(procs)]
    ends = []
    for c in children:
        out, err = c.communicate(timeout=600)
        if c.returncode != 0:
            raise SystemExit(f"{mode} on {model.name} failed:\n{err[-3000:]}")
        end, rss_kib = out.strip().splitlines()[-1].split()
        ends.append(float(end))
        if procs == 1:
            PEAK_RSS[mode] = int(rss_kib) / 1024
    return max(ends) - start


def install_client(work: Path) -> Path:
    """The Python client pip-installed into `work` (its stubs generated at
    build time), as users run it: a source checkout regenerates its stub
    key at each import."""
    repo = work / "repo"
    shutil.copytree(REPO / "proto", repo / "proto", ignore=shutil.ignore_patterns("src", "*.rs", "*.toml"))
    shutil.copytree(REPO / "client" / "python", repo / "client" / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*_pb2*.py*"))
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "--target", str(site), str(repo / "client" / "python")],
                   check=True, capture_output=True, timeout=300)
    return site


def save_optimized(model: Path, out: Path, level: str) -> None:
    """onnxruntime's own optimized model at `level`, as a user saves it."""
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = {"extended": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   "all": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3
    onnxruntime.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])


def empty_store(bin_dir: Path, sock: Path) -> None:
    """Every entry gone: the next form is compiled."""
    subprocess.run([str(bin_dir / "ctcachectl"), "--socket", str(sock), "gc", "--all", "--yes", "-q"],
                   check=True, capture_output=True, timeout=120)


def result(name: str, value: float, anchor: float, ratio: float, label: str, target: str = "") -> None:
    t = f" target={target}" if target else ""
    print(f'RESULT name={name} value={value:.6g} unit=s anchor={anchor:.6g} ratio={ratio:.6g}{t} label="{label}"',
          flush=True)


def rss_result(short: str, mode: str, anchor: str, label: str) -> None:
    """The peak RSS of `mode`'s last lone child against `anchor`'s (ratio: the anchor's over it)."""
    value, base = PEAK_RSS[mode], PEAK_RSS[anchor]
    print(f'RESULT name=session.{short}.{mode}.rss_mib value={value:.6g} unit=MiB anchor={base:.6g} '
          f'ratio={base / value:.6g} label="{label}"', flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", type=Path,
                    default=Path(os.environ.get("CARGO_TARGET_DIR", "/var/tmp/ctcache-target")) / "release")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    corpus = {m.name: m for m in real_models.CORPUS}
    work = Path(tempfile.mkdtemp(prefix="ctcache-session-bench-", dir="/var/tmp"))
    env = dict(os.environ, PYTHONPATH=str(install_client(work)))
    ort_library = next((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))
    import openvino

    ov_library = next((Path(openvino.__file__).parent / "libs").glob("libopenvino_c.so*"))
    proc, _, sock = start_daemon(a.bin_dir, work, ["--ort-library", str(ort_library),
                                                   "--openvino-library", str(ov_library)])
    try:
        client = connect(proc, sock, work)
        if client is None:
            raise SystemExit("ctcached did not answer (its log is above)")
        client.close()
        for short, name in MODELS.items():
            model = work / f"{short}.onnx"
            shutil.copyfile(corpus[name].path, model)
            level = LEVELS[short]
            own = work / f"{short}.{level}.onnx"
            save_optimized(model, own, level)
            # One call packs what the default target reads, one compiles the
            # form: warm from here on.
            ready_after("warm", model, sock, 1, env)
            ready_after("form", model, sock, 1, env, level)
            ov_cache = work / f"{short}.ov-cache"
            ready_after("ov_cache", model, sock, 1, env, str(ov_cache))
            ready_after("ov_form", model, sock, 1, env)
            times: dict[tuple[str, int], float] = {}
            extra = {"own": str(own), "form": level, "form_cold": level, "ov_cache": str(ov_cache)}
            for procs in (1, 4):
                for mode in ("floor", "plain", "reference", "warm", "own", "form", "form_cold", "ov_plain",
                             "ov_cache", "ov_form", "ov_form_cold"):
                    if procs == 4 and mode not in ("plain", "warm", "form", "ov_plain", "ov_form"):
                        continue
                    runs = []
                    for _ in range(a.runs):
                        if mode in ("form_cold", "ov_form_cold"):
                            empty_store(a.bin_dir, sock)
                        runs.append(ready_after(mode, model, sock, procs, env, extra.get(mode, "")))
                    runs.sort()
                    times[(mode, procs)] = statistics.median(runs)
                    log(f"{short:7} {mode:9} x{procs}: {times[(mode, procs)]:.3f} s (runs {', '.join(f'{r:.3f}' for r in runs)})")
            warm, plain = times[("warm", 1)], times[("plain", 1)]
            what = f"{corpus[name].about}: a fresh process to a ready session"
            result(f"session.{short}.warm.p1", warm, plain, plain / warm,
                   f"{what}, ctcache warm vs the plain fp32 session, one process")
            result(f"session.{short}.warm.p4", times[("warm", 4)], times[("plain", 4)],
                   times[("plain", 4)] / times[("warm", 4)],
                   f"{what}, ctcache warm vs the plain fp32 session, four processes at once")
            ref = times[("reference", 1)]
            result(f"session.{short}.reference.p1", ref, warm, ref / warm,
                   f"{what}, onnxruntime's quantizer then its session vs ctcache warm")
            floor = times[("floor", 1)]
            result(f"session.{short}.floor.p1", floor, warm, warm / floor,
                   f"{what}: Python and import onnxruntime, and warm's ratio to it", "ratio<=1.2")
            form = times[("form", 1)]
            result(f"session.{short}.form.p1", form, plain, plain / form,
                   f"{what}, ctcache's onnxruntime form at {level} vs the plain session, one process",
                   "ratio>=2" if short == "conv" else "ratio>=1")
            result(f"session.{short}.form.p4", times[("form", 4)], times[("plain", 4)],
                   times[("plain", 4)] / times[("form", 4)],
                   f"{what}, ctcache's onnxruntime form at {level} vs the plain session, four processes at once")
            result(f"session.{short}.own.p1", times[("own", 1)], form, times[("own", 1)] / form,
                   f"{what}, onnxruntime's own optimized model at {level}, saved by hand, vs ctcache's form",
                   "ratio>=1")
            rss_result(short, "form", "plain", f"{corpus[name].about}: a fresh process's peak RSS with a ready session, "
                       f"ctcache's onnxruntime form at {level} vs the plain session")
            cold = times[("form_cold", 1)]
            result(f"session.{short}.form_cold.p1", cold, plain, plain / cold,
                   f"{what}, ctcache's form at {level} compiled for this session vs the plain session")
            what = f"{corpus[name].about}: a fresh process to a ready OpenVINO compiled model (CPU)"
            ov_plain, ov_form = times[("ov_plain", 1)], times[("ov_form", 1)]
            result(f"session.{short}.ov_form.p1", ov_form, ov_plain, ov_plain / ov_form,
                   f"{what}, ctcache's OpenVINO form vs compile_model, one process",
                   "ratio>=2" if short == "conv" else "ratio>=1")
            result(f"session.{short}.ov_form.p4", times[("ov_form", 4)], times[("ov_plain", 4)],
                   times[("ov_plain", 4)] / times[("ov_form", 4)],
                   f"{what}, ctcache's OpenVINO form vs compile_model, four processes at once")
            result(f"session.{short}.ov_cache.p1", times[("ov_cache", 1)], ov_form, times[("ov_cache", 1)] / ov_form,
                   f"{what}, OpenVINO's own CACHE_DIR, warm, vs ctcache's form", "ratio>=1")
            rss_result(short, "ov_form", "ov_plain", f"{corpus[name].about}: a fresh process's peak RSS with a "
                       "ready OpenVINO compiled model, ctcache's form vs compile_model")
            ov_cold = times[("ov_form_cold", 1)]
            result(f"session.{short}.ov_form_cold.p1", ov_cold, ov_plain, ov_plain / ov_cold,
                   f"{what}, ctcache's OpenVINO form compiled for this call vs compile_model")
    finally:
        stop_daemon(proc)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
