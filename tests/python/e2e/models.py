"""Deterministic test models for the end-to-end suite, built with the onnx package.

* :func:`transformer` -- a 2-layer pre-LN transformer block stack (multi-head
  attention with MatMul q/k/v/o, an MLP up/down, LayerNormalization, Softmax,
  an LM head), MatMul weights 1024..4096 wide, saved with external data in one
  ``weights.bin`` (over 100 MB).
* :func:`convnet` -- Conv/Relu/GlobalAveragePool/Flatten, a Gemm with
  ``transB=1`` (2-D weight of 65,536 elements) and a MatMul weight.
* :func:`f16_mlp` -- MatMuls over FLOAT16 inputs and weights.

Every builder returns a :class:`Built` describing the initializers the default
policy of ctcached selects (2-D FLOAT MatMul/Gemm-B weights of at least
65,536 elements; a weight read transposed gets only ort.matmul_nbits, with
transposed=true).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 9
POLICY_FORMATS = ("ort.matmul_nbits",)
POLICY_MIN_ELEMENTS = 65536


@dataclass
class Built:
    path: Path
    inputs: dict[str, tuple[list[int], np.dtype]]
    # initializer name -> formats the default policy wants for it
    wanted: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # initializer name -> why the policy does not want it (for the notes)
    not_wanted: dict[str, str] = field(default_factory=dict)
    data_file: Path | None = None

    def random_inputs(self, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {n: rng.standard_normal(shape).astype(dt) for n, (shape, dt) in self.inputs.items()}


def _model(nodes, name, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ctcache-e2e")
    m.ir_version = IR_VERSION
    return m


# ---- the transformer ----

TRANSFORMER = dict(d=1024, ffn=4096, heads=8, layers=2, vocab=2048, seq=8)


def transformer_weights(seed: int = 20240601, **dims) -> dict[str, np.ndarray]:
    """Every initializer of :func:`transformer`, in graph order (deterministic)."""
    c = {**TRANSFORMER, **dims}
    d, ffn, heads = c["d"], c["ffn"], c["heads"]
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}

    def mat(name, k, n):
        # float32 from the start: standard_normal(dtype=float32) is half the memory traffic.
        w = rng.standard_normal((k, n), dtype=np.float32)
        w *= np.float32(1.0 / math.sqrt(k))
        out[name] = w

    def vec(name, n, base=0.0, scale=0.02):
        out[name] = (base + scale * rng.standard_normal(n)).astype(np.float32)

    for i in range(c["layers"]):
        p = f"layers.{i}."
        vec(p + "ln1.gamma", d, 1.0)
        vec(p + "ln1.beta", d)
        for w in ("q", "k", "v", "o"):
            mat(p + f"attn.{w}.weight", d, d)
        vec(p + "ln2.gamma", d, 1.0)
        vec(p + "ln2.beta", d)
        mat(p + "mlp.up.weight", d, ffn)
        vec(p + "mlp.up.bias", ffn)
        mat(p + "mlp.down.weight", ffn, d)
        vec(p + "mlp.down.bias", d)
    vec("final_ln.gamma", d, 1.0)
    vec("final_ln.beta", d)
    mat("lm_head.weight", d, c["vocab"])
    out["attn.head_shape"] = np.array([1, c["seq"], heads, d // heads], dtype=np.int64)
    out["attn.model_shape"] = np.array([1, c["seq"], d], dtype=np.int64)
    out["attn.scale"] = np.array(1.0 / math.sqrt(d // heads), dtype=np.float32)
    return out


def transformer_graph(weights: dict[str, np.ndarray], **dims) -> onnx.ModelProto:
    c = {**TRANSFORMER, **dims}
    d, seq = c["d"], c["seq"]
    nodes = []

    def n(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    x = "input"
    for i in range(c["layers"]):
        p = f"layers.{i}."
        h = n("LayerNormalization", [x, p + "ln1.gamma", p + "ln1.beta"], p + "ln1", axis=-1, epsilon=1e-5)
        heads = {}
        for w in ("q", "k", "v"):
            proj = n("MatMul", [h, p + f"attn.{w}.weight"], p + f"attn.{w}")
            r = n("Reshape", [proj, "attn.head_shape"], p + f"attn.{w}.heads")
            heads[w] = n("Transpose", [r], p + f"attn.{w}.t", perm=[0, 2, 1, 3])  # [1, H, S, Dh]
        kt = n("Transpose", [heads["k"]], p + "attn.kT", perm=[0, 1, 3, 2])
        s = n("MatMul", [heads["q"], kt], p + "attn.scores")
        s = n("Mul", [s, "attn.scale"], p + "attn.scaled")
        a = n("Softmax", [s], p + "attn.probs", axis=-1)
        ctx = n("MatMul", [a, heads["v"]], p + "attn.ctx")
        ctx = n("Transpose", [ctx], p + "attn.ctx.t", perm=[0, 2, 1, 3])
        ctx = n("Reshape", [ctx, "attn.model_shape"], p + "attn.ctx.merged")
        o = n("MatMul", [ctx, p + "attn.o.weight"], p + "attn.out")
        x = n("Add", [x, o], p + "resid1")
        h = n("LayerNormalization", [x, p + "ln2.gamma", p + "ln2.beta"], p + "ln2", axis=-1, epsilon=1e-5)
        u = n("MatMul", [h, p + "mlp.up.weight"], p + "mlp.up")
        u = n("Add", [u, p + "mlp.up.bias"], p + "mlp.up.biased")
        sg = n("Sigmoid", [u], p + "mlp.sigmoid")
        u = n("Mul", [u, sg], p + "mlp.silu")
        dn = n("MatMul", [u, p + "mlp.down.weight"], p + "mlp.down")
        dn = n("Add", [dn, p + "mlp.down.bias"], p + "mlp.down.biased")
        x = n("Add", [x, dn], p + "resid2")
    h = n("LayerNormalization", [x, "final_ln.gamma", "final_ln.beta"], "final_ln", axis=-1, epsilon=1e-5)
    n("MatMul", [h, "lm_head.weight"], "logits")
    inits = [numpy_helper.from_array(w, name) for name, w in weights.items()]
    return _model(
        nodes, "tiny-transformer",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, seq, d])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, c["vocab"]])],
        inits,
    )


def policy_wanted(weights: dict[str, np.ndarray], matmul_b: set[str]) -> dict[str, tuple[str, ...]]:
    return {
        name: POLICY_FORMATS
        for name, w in weights.items()
        if name in matmul_b and w.dtype == np.float32 and w.ndim == 2 and w.size >= POLICY_MIN_ELEMENTS
    }


def save_external(model: onnx.ModelProto, path: Path, location: str = "weights.bin") -> None:
    """Saves with every initializer of >= 1 KiB in one external file beside ``path``."""
    data = path.parent / location
    if data.exists():
        data.unlink()  # onnx appends to an existing file
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=1024)


def transformer(folder: Path, seed: int = 20240601, name: str = "transformer.onnx",
                weights: dict[str, np.ndarray] | None = None) -> Built:
    """Writes ``folder/name`` + ``folder/weights.bin``."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = transformer_weights(seed) if weights is None else weights
    m = transformer_graph(weights)
    path = folder / name
    save_external(m, path)
    matmul_b = {nd.input[1] for nd in m.graph.node if nd.op_type == "MatMul"}
    return Built(
        path=path,
        inputs={"input": ([1, TRANSFORMER["seq"], TRANSFORMER["d"]], np.dtype(np.float32))},
        wanted=policy_wanted(weights, matmul_b),
        data_file=folder / "weights.bin",
    )


# ---- the conv net ----


def convnet(folder: Path, seed: int = 7, name: str = "convnet.onnx") -> Built:
    rng = np.random.default_rng(seed)
    f = lambda *s: (rng.standard_normal(s) * 0.1).astype(np.float32)  # noqa: E731
    w = {
        "conv1.weight": f(32, 3, 3, 3), "conv1.bias": f(32),
        "conv2.weight": f(128, 32, 3, 3), "conv2.bias": f(128),
        "fc1.weight": f(512, 128),  # Gemm transB=1: B is [N, K]; 65,536 elements
        "fc1.bias": f(512),
        "fc2.weight": f(512, 256),  # MatMul B [K, N]: 131,072 elements
    }
    nodes = [
        helper.make_node("Conv", ["image", "conv1.weight", "conv1.bias"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "conv2.weight", "conv2.bias"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["fc1"], transB=1),
        helper.make_node("Relu", ["fc1"], ["r3"]),
        helper.make_node("MatMul", ["r3", "fc2.weight"], ["scores"]),
    ]
    m = _model(
        nodes, "convnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [2, 3, 32, 32])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [2, 256])],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    onnx.save_model(m, str(path))
    return Built(
        path=path,
        inputs={"image": ([2, 3, 32, 32], np.dtype(np.float32))},
        # fc1 is read transposed (Gemm transB=1): ort.matmul_nbits packs it
        # with transposed=true.
        wanted={"fc2.weight": POLICY_FORMATS, "fc1.weight": ("ort.matmul_nbits",)},
        not_wanted={"conv1.weight": "rank 4", "conv2.weight": "rank 4"},
    )


# ---- FLOAT16 ----


def f16_mlp(folder: Path, seed: int = 16, name: str = "mlp_f16.onnx") -> Built:
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((512, 256)) / 16).astype(np.float16)
    w2 = (rng.standard_normal((256, 512)) / 16).astype(np.float16)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    m = _model(
        nodes, "mlp-f16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 512])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    onnx.save_model(m, str(path))
    return Built(path=path, inputs={"x": ([4, 512], np.dtype(np.float16))},
                 not_wanted={"w1": "FLOAT16", "w2": "FLOAT16"})


def external_bytes(path: Path) -> int:
    return os.path.getsize(path)
