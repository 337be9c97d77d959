"""Generating the gRPC stubs from the repository's ``proto/`` folder.

Used by ``setup.py`` at build time and by ``ctcache._pb`` at import time when
the package runs from a source checkout. Standard library only (apart from
``grpc_tools``, imported when generating), so ``setup.py`` can load this file
by path before any dependency is installed.

The onnx messages are generated from a copy of ``proto/onnx/onnx.proto`` whose
protobuf package ``onnx`` is renamed to ``ctcache_onnx`` (file
``ctcache/_pb/onnx.proto``). The ``onnx`` Python package registers its own
``onnx.*`` messages in the same descriptor pool; ours are a superset with the
compiled-tensor extension, and identical full names would clash. The wire
format depends only on field numbers, so the rename changes nothing on the
wire; the service keeps its name ``ctcache.v1.CompiledTensorCache``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

# Bump when the staging rules below change (part of the lazy cache key).
STUB_LAYOUT = "2"

ONNX_SRC = "onnx/onnx.proto"
API_SRC = "ctcache/v1/ctcache.proto"
ONNX_DST = "ctcache/_pb/onnx.proto"
API_DST = "ctcache/_pb/ctcache_v1.proto"
MODULES = ("onnx_pb2", "ctcache_v1_pb2", "ctcache_v1_pb2_grpc", "wire_schema")
#: The package whose messages (and those they hold) the wire schema lists.
WIRE_PACKAGE = "ctcache.v1"

_TYPE_REF = re.compile(r"(?<![\w./\"])onnx\.(?=[A-Z_])")


def find_proto_root(start: Path | None = None) -> Path | None:
    """``$CTCACHE_PROTO_DIR``, else the first ``proto/`` above ``start`` that holds the API."""
    env = os.environ.get("CTCACHE_PROTO_DIR")
    if env:
        return Path(env)
    here = (start or Path(__file__)).resolve()
    for d in [here, *here.parents]:
        if (d / "proto" / API_SRC).is_file() and (d / "proto" / ONNX_SRC).is_file():
            return d / "proto"
    return None


def staged_sources(proto_root: Path) -> dict[str, str]:
    """The two .proto files as they are compiled: {relative path: text}."""
    onnx_text = (proto_root / ONNX_SRC).read_text(encoding="utf-8")
    api_text = (proto_root / API_SRC).read_text(encoding="utf-8")
    onnx_new, n = re.subn(r"(?m)^package\s+onnx\s*;", "package ctcache_onnx;", onnx_text)
    if n != 1:
        raise RuntimeError(f"{proto_root / ONNX_SRC}: expected one `package onnx;` line")
    onnx_new = _TYPE_REF.sub("ctcache_onnx.", onnx_new)
    api_new, n = re.subn(r'(?m)^import\s+"onnx/onnx\.proto"\s*;', f'import "{ONNX_DST}";', api_text)
    if n != 1:
        raise RuntimeError(f'{proto_root / API_SRC}: expected one `import "onnx/onnx.proto";` line')
    api_new = _TYPE_REF.sub("ctcache_onnx.", api_new)
    return {ONNX_DST: onnx_new, API_DST: api_new}


def cache_key(proto_root: Path) -> str:
    """Changes with the protos, the staging rules and the protoc in use."""
    h = hashlib.sha256(STUB_LAYOUT.encode())
    for rel, text in sorted(staged_sources(proto_root).items()):
        h.update(rel.encode() + b"\0" + text.encode() + b"\0")
    try:
        from importlib.metadata import version

        h.update(version("grpcio-tools").encode())
        h.update(version("protobuf").encode())
    except Exception:  # noqa: BLE001 - a key without versions is still a key
        pass
    return h.hexdigest()[:16]


def generate(proto_root: Path, out_root: Path) -> list[Path]:
    """Runs grpc_tools.protoc; writes ``out_root/ctcache/_pb/{onnx_pb2,ctcache_v1_pb2,ctcache_v1_pb2_grpc}.py``
    and ``wire_schema.py`` (the messages as :mod:`ctcache.wire` reads them)."""
    try:
        from grpc_tools import protoc
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "generating the ctcache gRPC stubs needs grpcio-tools (pip install grpcio-tools)"
        ) from e
    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    out_root = Path(out_root)
    with tempfile.TemporaryDirectory(prefix="ctcache-protos-") as staging:
        for rel, text in staged_sources(Path(proto_root)).items():
            p = Path(staging, rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        (out_root / "ctcache" / "_pb").mkdir(parents=True, exist_ok=True)
        args = [
            "grpc_tools.protoc",
            f"-I{staging}",
            f"-I{well_known}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            f"--descriptor_set_out={Path(staging, 'api.pb')}",
            "--include_imports",
            ONNX_DST,
            API_DST,
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc failed with status {rc} ({' '.join(args[1:])})")
        schema = wire_schema(Path(staging, "api.pb").read_bytes())
        (out_root / "ctcache" / "_pb" / "wire_schema.py").write_text(schema, encoding="utf-8")
    out = [out_root / "ctcache" / "_pb" / f"{m}.py" for m in MODULES]
    missing = [str(p) for p in out if not p.is_file()]
    if missing:
        raise RuntimeError(f"grpc_tools.protoc did not write {', '.join(missing)}")
    return out


def wire_schema(descriptor_set: bytes) -> str:
    """The source of ``wire_schema.py``: every message of :data:`WIRE_PACKAGE`
    and those its fields hold, as ``{full name: {number: (name, type, repeated,
    message type or "", oneof or "", has presence)}}`` (``type``:
    descriptor.proto's field type number; presence: a message, a oneof's
    member, an ``optional`` scalar, any proto2 scalar); a map field's type is its entry
    message, listed in ``MAPS``."""
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
    found: dict[str, tuple[descriptor_pb2.DescriptorProto, bool]] = {}

    def walk(prefix: str, messages, proto2: bool) -> None:
        for m in messages:
            found[f"{prefix}.{m.name}"] = (m, proto2)
            walk(f"{prefix}.{m.name}", m.nested_type, proto2)

    for f in fds.file:
        walk(f.package, f.message_type, f.syntax in ("", "proto2"))
    wanted = [name for name in found if name.startswith(WIRE_PACKAGE + ".")]
    schema, maps, seen = {}, [], set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        seen.add(name)
        m, proto2 = found[name]
        if m.options.map_entry:
            maps.append(name)
        fields = {}
        for f in m.field:
            held = f.type_name.lstrip(".")
            in_oneof = f.HasField("oneof_index") and not f.proto3_optional
            oneof = m.oneof_decl[f.oneof_index].name if in_oneof else ""
            repeated = f.label == f.LABEL_REPEATED
            presence = not repeated and (proto2 or f.type == f.TYPE_MESSAGE or in_oneof or f.proto3_optional)
            fields[f.number] = (f.name, f.type, repeated, held, oneof, presence)
            if held in found:
                wanted.append(held)
        schema[name] = dict(sorted(fields.items()))
    lines = ['"""Generated by ctcache._stubs from the API\'s protos: do not edit."""', "", "MESSAGES = {"]
    lines += [f"    {name!r}: {schema[name]!r}," for name in sorted(schema)]
    lines += ["}", f"MAPS = frozenset({sorted(maps)!r})", ""]
    return "\n".join(lines)


def ensure_cached(proto_root: Path) -> Path:
    """Generated stubs in the user's cache (created once per key); returns the folder holding the modules."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = Path(base, "ctcache", "python-stubs")
    key = cache_key(proto_root)
    final = root / key
    if all((final / f"{m}.py").is_file() for m in MODULES):
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    except OSError:
        # Read-only home: a private temporary folder for this process.
        tmp = Path(tempfile.mkdtemp(prefix="ctcache-stubs-"))
        generate(proto_root, tmp)
        return tmp / "ctcache" / "_pb"
    try:
        generate(proto_root, tmp)
        gen = tmp / "ctcache" / "_pb"
        try:
            os.rename(gen, final)
        except OSError:
            if not all((final / f"{m}.py").is_file() for m in MODULES):
                raise  # not a lost race with another process
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


if __name__ == "__main__":  # python -m ctcache._stubs OUT_DIR
    root = find_proto_root()
    if root is None:
        sys.exit("proto/ not found; set CTCACHE_PROTO_DIR")
    for p in generate(root, Path(sys.argv[1] if len(sys.argv) > 1 else ".")):
        print(p)
