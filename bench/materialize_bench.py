#!/usr/bin/env python3
"""fp32 model on disk -> onnxruntime session with 4-bit MatMulNBits weights.

``--target int8`` and ``--target fp16`` compare the other two onnxruntime
targets with onnxruntime's own tool for each (``quantize_dynamic`` on the
MatMul weights, QInt8; ``convert_float_to_float16`` with keep_io_types), in
place of MatMulNBitsQuantizer; their figures are named
``materialize.int8.*`` and ``materialize.fp16.*`` (the same targets).

Three ways, one run, on a model of eight 4096 x 4096 FLOAT MatMul weights
(512 MiB fp32, stored as external data next to the model, as big models are):

* anchor: onnxruntime alone -- onnx.load (external data included),
  MatMulNBitsQuantizer(bits=4, block_size=32, is_symmetric=True).process(),
  InferenceSession on the serialized quantized model (bytes in memory: the
  fastest path, nothing written to disk);
* ctcache cold: a fresh ctcached (release build) on an empty cache dir:
  Materialize (digest, pack, place the files with the default --link auto)
  + InferenceSession on the output; and ``cold.memory``, another fresh
  daemon on another empty cache dir, the zero-write session below (what
  ``ctcache.ort.inference_session`` does by default on a first run);
* ctcache warm, three ways: the entries stored and the daemon's digest memo
  warm: Materialize to a new output path + InferenceSession, with
  ``link="auto"`` (reflinks where the filesystem has them, copies on ext4 /
  tmpfs -- the scratch folder's filesystem decides) and with
  ``link="hard"`` (hard links: no payload byte written, but onnx >= 1.21
  refuses such files; onnxruntime loads them); and ``memory``, the
  zero-write session ``ctcache.ort.inference_session`` opens by default
  (an in-memory Materialize, then a session on the answer's bytes, whose
  external data are the leased payload files, mapped by onnxruntime).

The daemon is started (and answering) before the clock starts for the cold
run. The fp32 model is freshly written, so every way reads it from the page
cache. The same session options (onnxruntime defaults) everywhere.

Targets: anchor / warm >= 20x, anchor / cold >= 3x, bytes written by the warm
materialize (model_bytes + bytes_copied) < 1% of the payload bytes. A copy
writes every payload byte, so ``auto`` meets the last two only where it
reflinks; the summary prints every mode and which method placed the files. Each
figure is also printed as a RESULT line for bench/all.sh (bench/results.py).

With ``--shape minilm`` the model is a MiniLM-shaped encoder instead (a
30522 x 384 embedding table read by Gather, six layers of 384/1536 MatMuls,
90 MB inline, as exported), a real transformer's mix: the table is no
MatMul weight, so materialize places it beside the model like the packed
weights (its cached identity payload) rather than writing it again; its
figures are named ``materialize.minilm.*``.

    python bench/materialize_bench.py [--bin-dir DIR] [--work DIR] [--layers 8] [--dim 4096] [--warm-runs 3]
                                      [--shape matmuls|minilm]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))

BITS, BLOCK, SYMMETRIC = 4, 32, True


def log(msg: str) -> None:
    print(msg, flush=True)


def make_model(folder: Path, layers: int, dim: int, seed: int = 0) -> Path:
    """X[1, dim] -> MatMul W0 -> ... -> MatMul W{layers-1}; weights in one external data file."""
    import onnx
    from onnx import TensorProto, helper

    model_path = folder / "model.onnx"
    data_name = "model.onnx.data"
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    offset = 0
    with open(folder / data_name, "wb") as f:
        for i in range(layers):
            w = rng.standard_normal((dim, dim), dtype=np.float32)
            w *= np.float32(1.0 / np.sqrt(dim))
            raw = w.tobytes()
            f.write(raw)
            t = TensorProto(name=f"layers.{i}.weight", data_type=TensorProto.FLOAT, dims=[dim, dim])
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
                e = t.external_data.add()
                e.key, e.value = k, v
            offset += len(raw)
            inits.append(t)
            nodes.append(helper.make_node("MatMul", ["X" if i == 0 else f"h{i}", t.name],
                                          [f"h{i + 1}" if i + 1 < layers else "Y"], name=f"mm{i}"))
    g = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, dim])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, dim])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save_model(m, str(model_path))  # weights already external: a few hundred bytes
    return model_path


# A MiniLM-shaped encoder (sentence-transformers' all-MiniLM-L6 and
# paraphrase-MiniLM-L6): a 30522 x 384 word embedding, six layers of q, k,
# v, o (384 x 384), up (384 x 1536) and down (1536 x 384); 90 MB of fp32
# weights inline in the model file, as exported.
MINILM = {"vocab": 30522, "dim": 384, "layers": 6, "ffn": 1536}


def make_minilm(folder: Path, seed: int = 0) -> Path:
    """X[1, 384] -> each layer's q, k, v, o, up, down MatMuls in a chain -> Y;
    the embedding table is read by a Gather of three ids (a second output)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    v, d, f = MINILM["vocab"], MINILM["dim"], MINILM["ffn"]
    rng = np.random.default_rng(seed)

    def w(k: int, n: int) -> np.ndarray:
        return (rng.standard_normal((k, n), dtype=np.float32) * np.float32(1.0 / np.sqrt(k)))

    inits = [numpy_helper.from_array(w(v, d), "embeddings.word_embeddings.weight"),
             numpy_helper.from_array(np.array([101, 2023, 102], np.int64), "ids")]
    nodes = [helper.make_node("Gather", ["embeddings.word_embeddings.weight", "ids"], ["E"], name="embed")]
    h = "X"
    for i in range(MINILM["layers"]):
        for part, (k, n) in (("q", (d, d)), ("k", (d, d)), ("v", (d, d)), ("o", (d, d)),
                             ("up", (d, f)), ("down", (f, d))):
            name = f"layers.{i}.{part}.weight"
            inits.append(numpy_helper.from_array(w(k, n), name))
            out = f"h{i}.{part}"
            nodes.append(helper.make_node("MatMul", [h, name], [out], name=f"mm{i}.{part}"))
            h = out
    nodes.append(helper.make_node("Identity", [h], ["Y"], name="out"))
    g = helper.make_graph(nodes, "minilm", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, d])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, d]),
                           helper.make_tensor_value_info("E", TensorProto.FLOAT, [3, d])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    model_path = folder / "minilm.onnx"
    onnx.save_model(m, str(model_path))
    return model_path


def write_model(folder: Path, layers: int, dim: int, shape: str) -> Path:
    """``make_model`` (or ``make_minilm``), saying what it wrote and how long that took."""
    t = time.perf_counter()
    if shape == "minilm":
        model = make_minilm(folder)
        log(f"model: MiniLM-shaped, {mib(model.stat().st_size)} inline ({model}, "
            f"written in {time.perf_counter() - t:.1f} s)")
        return model
    model = make_model(folder, layers, dim)
    log(f"model: {layers} x MatMul [{dim} x {dim}] FLOAT = {mib(layers * dim * dim * 4)} external data "
        f"({model}, written in {time.perf_counter() - t:.1f} s)")
    return model


def start_daemon(bin_dir: Path, root: Path, args: list[str] = ()) -> tuple[subprocess.Popen, Path, Path]:
    cache, sock = root / "cache", root / "s.sock"
    config = root / "ctcached.toml"
    # Empty unless the caller wrote one: built-in defaults (the default
    # policy), whatever ~/.config says.
    config.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTCACHE_")}
    if not env.get("XDG_RUNTIME_DIR"):
        xdg = root / "xdg"
        xdg.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(xdg)
    log_file = open(root / "ctcached.log", "wb")
    proc = subprocess.Popen([str(bin_dir / "ctcached"), "--config", str(config), "--cache-dir", str(cache),
                             "--socket", str(sock), "--log-format", "human", *args],
                            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    return proc, cache, sock


def connect(proc: subprocess.Popen, sock: Path, root: Path, timeout: float = 60):
    """A client of the daemon ``start_daemon`` started in ``root`` once it
    answers; None (its log printed) when it exits or does not answer in time."""
    import ctcache

    deadline = time.monotonic() + timeout
    while True:
        try:
            client = ctcache.connect(sock, timeout=1)
            client.status()
            return client
        except ctcache.DaemonNotRunning:
            if proc.poll() is not None or time.monotonic() > deadline:
                log((root / "ctcached.log").read_text(errors="replace")[-3000:])
                return None
            time.sleep(0.05)


def drop_scratch(work: Path, keep: bool) -> None:
    """Removes the scratch folder, or says where it stays."""
    if keep:
        log(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def stop_daemon(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_check(sess, dim: int) -> np.ndarray:
    """Every output on one input, as one flat array."""
    x = np.random.default_rng(1).standard_normal((1, dim)).astype(np.float32)
    return np.concatenate([o.ravel() for o in sess.run(None, {"X": x})])


# What each target is compared with: onnxruntime's own tool for it.
TOOLS = {
    "int4": "MatMulNBitsQuantizer",
    "int8": "quantize_dynamic (MatMul, QInt8)",
    "fp16": "convert_float_to_float16 (keep_io_types)",
}


def reference(target: str, m, folder: Path):
    """onnxruntime's tool for ``target`` on the loaded model: the converted
    ModelProto, or the path it saved it to (``quantize_dynamic`` writes a
    file)."""
    if target == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        path = folder / "q.onnx"
        quantize_dynamic(m, path, op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8)
        return path
    if target == "fp16":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        return convert_float_to_float16(m, keep_io_types=True)
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(m, bits=BITS, block_size=BLOCK, is_symmetric=SYMMETRIC)
    q.process()
    return q.model.model


def anchor(model: Path, dim: int, target: str):
    """onnx.load + the reference tool + a session (from bytes where the tool
    keeps the model in memory); ``save``: the converted model saved to a
    file, outside the total (``quantize_dynamic`` saves inside it)."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(dir=model.parent) as d:
        t0 = time.perf_counter()
        m = onnx.load(str(model))
        t1 = time.perf_counter()
        out = reference(target, m, Path(d))
        t2 = time.perf_counter()
        if isinstance(out, Path):
            size = out.stat().st_size
            sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        else:
            data = out.SerializeToString()
            size = len(data)
            sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        t3 = time.perf_counter()
        y = run_check(sess, dim)
        save = 0.0
        if not isinstance(out, Path):
            t4 = time.perf_counter()
            onnx.save_model(out, str(Path(d) / "q.onnx"))
            os.sync()
            save = time.perf_counter() - t4
    return {"total": t3 - t0, "load": t1 - t0, "quantize": t2 - t1, "session": t3 - t2,
            "save": save, "model_bytes": size}, y


def through_daemon(client, model: Path, out: Path, dim: int, link: str = "auto", target: str = "int4"):
    import onnxruntime as ort

    out.parent.mkdir(parents=True, exist_ok=True)  # the daemon writes into an existing folder only
    settings = {"bits": BITS, "block_size": BLOCK, "symmetric": SYMMETRIC} if target == "int4" else {}
    t0 = time.perf_counter()
    r = client.materialize(model, out, link=link, target=f"onnxruntime-{target}", **settings)
    t1 = time.perf_counter()
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    t2 = time.perf_counter()
    y = run_check(sess, dim)
    return {"total": t2 - t0, "rpc": t1 - t0, "session": t2 - t1, "resp": r}, y


def from_form(sock: Path, model: Path, dim: int, target: str):
    """The session from the daemon's onnxruntime form (at ``all``, the
    level onnxruntime's default session runs) of the target's model:
    ``ctcache.ort.inference_session(target=..., optimize="all")``."""
    import ctcache.ort as cort

    t0 = time.perf_counter()
    sess = cort.inference_session(model, target=f"onnxruntime-{target}", optimize="all", socket=str(sock))
    t1 = time.perf_counter()
    if sess.ctcache_report.source != "daemon":
        raise SystemExit(f"no form: {sess.ctcache_report.why}")
    return {"total": t1 - t0, "compiled": sess.ctcache_report.packed}, run_check(sess, dim)


def in_memory(client, model: Path, dim: int, target: str = "int4"):
    """The zero-write session (``ctcache.ort.inference_session``'s default):
    the in-memory Materialize, then the session on its bytes, whose external
    data are the leased payload files."""
    import ctcache.ort as cort

    settings = {"bits": BITS, "block_size": BLOCK, "symmetric": SYMMETRIC} if target == "int4" else {}
    t0 = time.perf_counter()
    r, holder = client.materialize(model, None, in_memory=True, hold=True, target=f"onnxruntime-{target}",
                                   **settings)
    t1 = time.perf_counter()
    sess = cort._session_in_memory(client, r, holder, None, ["CPUExecutionProvider"], 30.0)
    t2 = time.perf_counter()
    y = run_check(sess, dim)
    return {"total": t2 - t0, "rpc": t1 - t0, "session": t2 - t1, "resp": r}, y


def result(name: str, label: str, value: float, unit: str, anchor: float | None = None,
           ratio: float | None = None, target: str = "") -> None:
    """A figure as a RESULT line (the format of ctcache_testkit::Figure)."""
    line = f"RESULT name={name} value={value:.6g} unit={unit}"
    if anchor is not None:
        line += f" anchor={anchor:.6g} ratio={ratio:.6g}"
    if target:
        line += f" target={target}"
    log(line + f' label="{label}"')


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def placed(r) -> str:
    """How the response's files were placed: "8 reflink", "8 copy, 1 ...", ..."""
    from ctcache.client import PLACE_METHODS

    counts: dict[str, int] = {}
    for f in r.files:
        name = PLACE_METHODS.get(f.method, "?")
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n} {m}" for m, n in sorted(counts.items())) or "no files"


def common_args(ap: argparse.ArgumentParser, layers: int, dim: int) -> None:
    """The options of every materialize bench: binaries, scratch folder, model size."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or "/var/tmp/ctcache-target")
    ap.add_argument("--bin-dir", type=Path, default=target / "release")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir under /var/tmp)")
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--dim", type=int, default=dim)
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(ap, layers=8, dim=4096)
    ap.add_argument("--warm-runs", type=int, default=3)
    ap.add_argument("--target", choices=list(TOOLS), default="int4",
                    help="the materialize target, against onnxruntime's tool for it")
    ap.add_argument("--shape", choices=["matmuls", "minilm"], default="matmuls",
                    help="the model: --layers x --dim MatMuls in external data, or a MiniLM-shaped encoder")
    a = ap.parse_args()
    if a.shape == "minilm":
        a.dim = MINILM["dim"]
    # Figures of the MiniLM shape are named materialize.minilm.*, of the
    # int8 and fp16 targets materialize.int8.* and materialize.fp16.*.
    prefix = "materialize" + ("" if a.target == "int4" else f".{a.target}") + \
        (".minilm" if a.shape == "minilm" else "")
    cold_target = 3

    for b in ("ctcached", "ctcachectl"):
        if not os.access(a.bin_dir / b, os.X_OK):
            log(f"{a.bin_dir / b} missing: cargo build --release -p ctcached -p ctcachectl")
            return 2

    import logging

    import onnxruntime as ort

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)

    work = a.work or Path(tempfile.mkdtemp(prefix="ctcmb-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    models = work / "models"
    models.mkdir(exist_ok=True)
    proc = None
    try:
        model = write_model(models, a.layers, a.dim, a.shape)
        setting = (f"{BITS} bits, block {BLOCK}, {'symmetric' if SYMMETRIC else 'asymmetric'}"
                   if a.target == "int4" else f"onnxruntime-{a.target} defaults")
        log(f"settings: {setting}; "
            f"onnxruntime {ort.__version__}; {os.cpu_count()} CPUs; daemon {a.bin_dir / 'ctcached'}")

        # ---- anchor
        an, y_anchor = anchor(model, a.dim, a.target)
        log(f"\nanchor (onnx.load + {TOOLS[a.target]} + InferenceSession): {an['total']:.3f} s")
        log(f"  onnx.load {an['load']:.3f} s, quantize {an['quantize']:.3f} s, "
            f"serialize + session {an['session']:.3f} s (quantized model {mib(an['model_bytes'])})")

        # ---- daemon
        # fp16: also the session from the target's onnxruntime form, whose
        # optimized model holds the FLOAT weights onnxruntime's CPU session
        # would cast at its start.
        ort_args = []
        if a.target == "fp16":
            import onnxruntime

            lib = next((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))
            ort_args = ["--ort-library", str(lib)]
        proc, cache, sock = start_daemon(a.bin_dir, work, ort_args)
        client = connect(proc, sock, work)
        if client is None:
            return 1

        cold, y_cold = through_daemon(client, model, work / "out-cold" / "model.q.onnx", a.dim,
                                    target=a.target)
        r = cold["resp"]
        log(f"\nctcache cold (empty cache: digest + pack + place the files, then session): {cold['total']:.3f} s")
        log(f"  materialize RPC {cold['rpc']:.3f} s (packed {r.packed}, cached {r.cached}, "
            f"files: {placed(r)}), session {cold['session']:.3f} s")
        assert np.array_equal(y_cold, y_anchor), "cold outputs differ from the anchor's"

        warm = {}
        for link in ("auto", "hard", "memory"):
            runs = []
            for i in range(a.warm_runs):
                if link == "memory":
                    w, y_warm = in_memory(client, model, a.dim, a.target)
                else:
                    w, y_warm = through_daemon(client, model, work / f"out-{link}{i}" / "model.q.onnx", a.dim,
                                              link, a.target)
                runs.append(w)
                r = w["resp"]
                log(f"ctcache warm --link {link} #{i + 1}: {w['total']:.3f} s = materialize RPC {w['rpc']:.3f} s "
                    f"+ session {w['session']:.3f} s (packed {r.packed}, cached {r.cached}, files: {placed(r)})")
                assert np.array_equal(y_warm, y_anchor), "warm outputs differ from the anchor's"
            warm[link] = runs
        forms = []
        if a.target == "fp16":
            from_form(sock, model, a.dim, a.target)  # compiled once: warm from here on
            for i in range(a.warm_runs):
                w, y_form = from_form(sock, model, a.dim, a.target)
                log(f"ctcache warm, the session from the target's form at all #{i + 1}: {w['total']:.3f} s")
                assert np.array_equal(y_form, y_anchor), "the form's outputs differ from the anchor's"
                forms.append(w["total"])
        # ---- cold again, zero-write: a fresh daemon on another empty cache
        stop_daemon(proc)
        (work / "cold-memory").mkdir()
        proc, _, sock = start_daemon(a.bin_dir, work / "cold-memory")
        client = connect(proc, sock, work / "cold-memory")
        if client is None:
            return 1
        cold_mem, y_cold = in_memory(client, model, a.dim, a.target)
        r = cold_mem["resp"]
        log(f"ctcache cold --link memory (another empty cache): {cold_mem['total']:.3f} s = materialize RPC "
            f"{cold_mem['rpc']:.3f} s + session {cold_mem['session']:.3f} s (packed {r.packed}, cached {r.cached})")
        assert np.array_equal(y_cold, y_anchor), "cold (memory) outputs differ from the anchor's"
        log("outputs: anchor, cold and warm sessions give bit-identical results")

        def verdict(ok: bool) -> str:
            return "PASS" if ok else "MISS"

        ratio_cold = an["total"] / cold["total"]
        log("\n==== summary ====")
        log(f"anchor                 {an['total']:8.3f} s")
        log(f"ctcache cold (auto)    {cold['total']:8.3f} s   anchor/cold = {ratio_cold:6.1f}x  (target >= {cold_target}x)   "
            f"{verdict(ratio_cold >= cold_target)}")
        session = {"int4": "4-bit", "int8": "int8", "fp16": "fp16"}[a.target]
        tool = {"int4": "onnxruntime's quantizer", "int8": "onnxruntime's quantize_dynamic",
                "fp16": "onnxruntime's float16 converter"}[a.target]
        what = (f"{a.layers} x {a.dim} x {a.dim} fp32 model" if a.shape == "matmuls"
                else "MiniLM-shaped encoder (90 MB inline fp32)") + f" to a {session} onnxruntime session"
        result(f"{prefix}.cold", f"{what}, empty cache, --link auto (files: {placed(cold['resp'])}), vs {tool}",
               cold["total"], "s", an["total"], ratio_cold, f"ratio>={cold_target}")
        ratio_cold_mem = an["total"] / cold_mem["total"]
        log(f"ctcache cold (memory)  {cold_mem['total']:8.3f} s   anchor/cold = {ratio_cold_mem:6.1f}x  "
            f"(target >= {cold_target}x)   {verdict(ratio_cold_mem >= cold_target)}")
        result(f"{prefix}.cold.memory", f"{what}, empty cache, --link memory (no files), vs {tool}",
               cold_mem["total"], "s", an["total"], ratio_cold_mem, f"ratio>={cold_target}")
        for link, runs in warm.items():
            w = sorted(runs, key=lambda x: x["total"])[len(runs) // 2]  # the median run
            r = w["resp"]
            # An in-memory materialize writes nothing (model_bytes is the answer's).
            written = 0 if link == "memory" else r.model_bytes + r.bytes_copied
            warm_total = statistics.median(x["total"] for x in runs)
            ratio_warm = an["total"] / warm_total
            bytes_pct = 100.0 * written / r.payload_bytes
            log(f"ctcache warm ({link:4})    {warm_total:8.3f} s   anchor/warm = {ratio_warm:6.1f}x  "
                f"(target >= 20x)  {verdict(ratio_warm >= 20)}   [median of {len(runs)}; files: {placed(r)}]")
            log(f"  split: materialize RPC {w['rpc'] * 1000:.1f} ms ({100 * w['rpc'] / w['total']:.0f}%), "
                f"InferenceSession {w['session'] * 1000:.1f} ms ({100 * w['session'] / w['total']:.0f}%)")
            log(f"  bytes written {written} B (model {0 if link == 'memory' else r.model_bytes} + copied {r.bytes_copied}) "
                f"vs payload {mib(r.payload_bytes)} = {bytes_pct:.4f}%  (target < 1%)   {verdict(bytes_pct < 1)}")
            result(f"{prefix}.warm.{link}",
                   f"{what}, warm cache, --link {link} (files: {placed(r)}), vs {tool}",
                   warm_total, "s", an["total"], ratio_warm, "ratio>=20")
            to_file = an["load"] + an["quantize"] + an["save"]
            rpc = statistics.median(x["rpc"] for x in runs)
            log(f"  materialize alone {rpc * 1000:.1f} ms vs onnx.load + quantizer + save {to_file:.3f} s = "
                f"{to_file / rpc:.1f}x  (target >= 10x)   {verdict(to_file / rpc >= 10)}")
            result(f"{prefix}.warm_rpc.{link}",
                   f"the warm materialize alone, --link {link}, vs onnx.load + {tool} + save",
                   rpc, "s", to_file, to_file / rpc, "ratio>=10")
            result(f"{prefix}.warm_bytes.{link}",
                   f"bytes a warm materialize --link {link} writes, % of the payload bytes",
                   bytes_pct, "%", target="value<1")
        if forms:
            form = statistics.median(forms)
            log(f"ctcache warm (form)    {form:8.3f} s   anchor/warm = {an['total'] / form:6.1f}x  (target >= 20x)  "
                f"{verdict(an['total'] / form >= 20)}")
            result(f"{prefix}.warm.form",
                   f"{what}, warm cache, the session from the target's onnxruntime form at all "
                   f"(inference_session optimize='all'), vs {tool}",
                   form, "s", an["total"], an["total"] / form, "ratio>=20")
        return 0
    finally:
        if proc is not None:
            stop_daemon(proc)
        drop_scratch(work, a.keep)


if __name__ == "__main__":
    sys.exit(main())
