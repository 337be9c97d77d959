"""Checks of the D3 reference itself (no ctcachectl needed).

* d3.py agrees with onnx: every type x shape x storage decodes (onnx.numpy_helper) back to
  the array it was built from and re-digests to the same value; onnx's own raw encoding
  equals d3's canonical content; the hand-written wire encodings (packed and unpacked
  repeated scalars) parse with onnx into the same tensors.
* the committed vectors.md / vectors.json are what make_vectors.py generates now.

Run:  /var/tmp/ctcache-venv/bin/python -m pytest tests/python/test_d3_reference.py
"""

from __future__ import annotations

import json
import os

import d3
import make_vectors

HERE = os.path.dirname(os.path.abspath(__file__))


def test_known_answers():
    d3._selftest_known_answers()


def test_onnx_agreement(tmp_path):
    assert d3._selftest_onnx_agreement(str(tmp_path)) > 26 * 20


def test_wire_encodings(tmp_path):
    d3._selftest_wire(str(tmp_path))


def test_vectors_up_to_date():
    md, records = make_vectors.build()
    assert len(records) >= 10
    with open(os.path.join(HERE, "vectors.md"), encoding="utf-8") as f:
        assert f.read() == md, "vectors.md is stale: run make_vectors.py --write"
    with open(os.path.join(HERE, "vectors.json"), encoding="utf-8") as f:
        assert json.load(f) == {"version": 1, "vectors": records}, "vectors.json is stale"
