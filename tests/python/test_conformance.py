"""The conformance table (docs/CONFORMANCE.md): every real-corpus model x
every materialize target x the reference tool's main options, as this run
finds it.

For each cell the Rust target (``ctcachectl materialize --local``) and the
reference tool (MatMulNBitsQuantizer, quantize_dynamic,
convert_float_to_float16) convert the model, and onnxruntime runs both
under its default session options on the same inputs. A cell reads:

* ``bit-identical``: the outputs are equal (``array_equal``);
* ``bit-identical with the optimizer off``: equal under
  ``ORT_DISABLE_ALL`` only;
* ``nothing to rewrite``: neither tool changes a node (a session opens the
  model as it is);
* ``refused: ...``: the target refuses, and the reference refuses too or
  onnxruntime refuses its model (its words follow). A refusal where the
  reference's model runs fails this test.

The table in the doc must be the one this test makes; run with
``CTCACHE_WRITE_CONFORMANCE=1`` to write it.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort

import ctl
import real_models
from real_models import CORPUS, RealModel

# The recognizers' outputs do not have the shapes their models declare;
# onnxruntime warns on every run.
ort.set_default_logger_severity(3)

DOC = Path(__file__).resolve().parents[2] / "docs" / "CONFORMANCE.md"
BEGIN, END = "<!-- conformance:begin -->", "<!-- conformance:end -->"


def _nbits(bits: int, block: int, sym: bool, level: int = 0):
    def convert(path: Path) -> onnx.ModelProto:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        q = MatMulNBitsQuantizer(onnx.load(str(path)), bits=bits, block_size=block, is_symmetric=sym,
                                 accuracy_level=level or None)
        q.process()
        return q.model.model
    return convert


def _dynamic(weight_type: str, per_channel: bool, reduce_range: bool, ops: list[str]):
    def convert(path: Path) -> onnx.ModelProto:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "q.onnx"
            quantize_dynamic(str(path), str(out), per_channel=per_channel, reduce_range=reduce_range,
                             weight_type={"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}[weight_type],
                             op_types_to_quantize=ops)
            return onnx.load(str(out))
    return convert


def _fp16(block: list[str] | None = None):
    def convert(path: Path) -> onnx.ModelProto:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        return convert_float_to_float16(str(path), keep_io_types=True, op_block_list=block)
    return convert


@dataclass(frozen=True)
class Config:
    target: str
    options: str
    flags: tuple[str, ...]
    reference: Callable[[Path], onnx.ModelProto]


CONFIGS = (
    Config("onnxruntime-int4", "4 bits, block 32, symmetric", (), _nbits(4, 32, True)),
    Config("onnxruntime-int4", "4 bits, block 128, asymmetric", ("--block-size", "128", "--asymmetric"),
           _nbits(4, 128, False)),
    Config("onnxruntime-int4", "8 bits, block 32, symmetric", ("--bits", "8"), _nbits(8, 32, True)),
    Config("onnxruntime-int4", "accuracy level 4", ("--accuracy-level", "4"), _nbits(4, 32, True, 4)),
    Config("onnxruntime-int8", "int8, per tensor, MatMul", (), _dynamic("int8", False, False, ["MatMul"])),
    Config("onnxruntime-int8", "uint8, per channel, reduce range, MatMul",
           ("--weight-type", "uint8", "--per-channel", "--reduce-range"), _dynamic("uint8", True, True, ["MatMul"])),
    Config("onnxruntime-int8", "int8, op types MatMul, Gather, Conv", ("--op-types", "MatMul,Gather,Conv"),
           _dynamic("int8", False, False, ["MatMul", "Gather", "Conv"])),
    Config("onnxruntime-fp16", "keep_io_types, default op block list", (), _fp16()),
    Config("onnxruntime-fp16", "keep_io_types, op block list Resize, Max", ("--op-block-list", "Resize,Max"),
           _fp16(["Resize", "Max"])),
    Config("onnxruntime-fp16", "keep_io_types, empty op block list", ("--op-block-list", ""), _fp16([])),
)


def _words(e: BaseException) -> str:
    """The first sentence-ish of an error, without run-specific paths."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    text = re.sub(r"/tmp/\S+", "<file>", text)
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "onnxruntime: ", text)
    return text[:220].rstrip()


def _run(model, optimize: bool, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(src, so).run(None, feeds)


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f") for x, y in zip(a, b))


def _ops(m: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in m.graph.node)


def cell(m: RealModel, c: Config, work: Path) -> str:
    out = work / f"{m.name}.{c.target}.{CONFIGS.index(c)}.onnx"
    ours = ctl.run("materialize", "--local", "--target", c.target, *c.flags, str(m.path), "-o", str(out))
    logging.disable(logging.INFO)
    try:
        ref, ref_error = c.reference(m.path), None
    except Exception as e:  # noqa: BLE001 -- the reference's refusal is a result here
        ref, ref_error = None, f"the reference refuses: {_words(e)}"
    finally:
        logging.disable(logging.NOTSET)
    feeds = real_models.feeds(m)
    if ref is not None:
        try:
            want = _run(ref, True, feeds)
        except Exception as e:  # noqa: BLE001 -- onnxruntime refusing the reference's model is a result
            ref_error = f"onnxruntime refuses the reference's model: {_words(e)}"
    said = (ours.stderr or ours.stdout).strip().removeprefix("ctcachectl: ")
    if ours.returncode != 0:
        if ref_error is not None:
            return f"refused: {said} ({ref_error})"
        source = onnx.load(str(m.path), load_external_data=False)
        assert "nothing to materialize" in said and _ops(ref) == _ops(source), (
            f"{m.name} {c.target} {c.options}: refused where the reference's model runs: {said}")
        return "nothing to rewrite"
    assert ref_error is None, f"{m.name} {c.options}: converted where {ref_error}"
    if _same(_run(out, True, feeds), want):
        return "bit-identical"
    if _same(_run(out, False, feeds), _run(ref, False, feeds)):
        return "bit-identical with the optimizer off (default options differ)"
    return "outputs differ"


# The longest table cell the docs allow (tests/docs_check.py).
CELL_MAX = 400


def table(rows: list[tuple[str, str, str, str]]) -> str:
    """The table; a result longer than a cell may be is a numbered note below
    it (the cell keeps its first word: ``refused: see note 1``), one note per
    distinct result."""
    lines = ["| model | target | options | result |", "|---|---|---|---|"]
    notes: dict[str, int] = {}
    for a, b, c, d in rows:
        d = d.replace("|", "/")
        if len(d) > CELL_MAX:
            d = f"{d.split(': ', 1)[0]}: see note {notes.setdefault(d, len(notes) + 1)}"
        lines.append(f"| {a} | {b} | {c} | {d} |")
    if notes:
        lines += [""] + [f"{n}. {d}" for d, n in notes.items()]
    return "\n".join(lines)


def test_the_conformance_table_is_what_this_run_finds(tmp_path):
    for m in CORPUS:
        real_models.fetch(m)
    rows = [(m.name, c.target, c.options, cell(m, c, tmp_path)) for m in CORPUS for c in CONFIGS]
    made = table(rows)
    doc = DOC.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    if os.environ.get("CTCACHE_WRITE_CONFORMANCE") == "1":
        DOC.write_text(doc[:start] + "\n" + made + "\n" + doc[end:])
        return
    assert doc[start:end].strip() == made, (
        "docs/CONFORMANCE.md is not what this run finds; rerun with CTCACHE_WRITE_CONFORMANCE=1 and review the "
        f"change:\n{made}")
