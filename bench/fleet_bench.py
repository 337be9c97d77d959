#!/usr/bin/env python3
"""A fresh host's time from a model appearing in its watched folder to all
of its entries ready: fetched from the fleet tier (Garage 2.5, three nodes
on loopback, replication factor 3) vs packed locally, per format, in one run.

The model: eight 4096 x 4096 FLOAT MatMul weights (512 MiB fp32 as external
data; ``--layers``/``--dim`` change it). Host A (a ctcached, release build,
empty cache, uploads signed with its key) packs every format and uploads it;
the bench waits until A's upload queue is drained (``remote status``). Then,
per format, three fresh hosts B (a new ctcached, an empty cache, the same
bucket, trusting A's key, a policy of that one format, watching an empty
folder), one per ``fetch`` mode:

* ``never``: packs locally (the anchor);
* ``always``: fetches every entry from the remote;
* ``auto``: the cost rule decides per entry; its choices are read back from
  ``remote status`` (``chose_fetch``, ``chose_pack``).

Each B is timed from the rename of the model (its external data first) into
its watched folder to the moment a Lookup of every weight's digest finds an
entry of the format (polled every 10 ms); the watcher's stability wait
(``stable_secs``, 0.3 s) is inside that time for every mode. Before each
timed run the page cache is dropped (``sync; echo 3 >
/proc/sys/vm/drop_caches``, as root; ``--no-drop-caches`` keeps it), so the
model and the Garage nodes' blocks are read from disk, as on a host that
has just received the model. Every B's entries are checked against A's
(payload blake3), so a fast wrong answer cannot pass. Each format and mode
runs ``--reps`` times (default 3; the median counts), the order of the modes
rotated from one round to the next.

Runtime forms the same way, on real models of the corpus
(tests/python/real_models.py): host A (both runtimes' libraries from the
venv's wheels) compiles the encoder's and the conv net's onnxruntime forms
and the encoder's OpenVINO form, and uploads them; a fresh host B, trusting
A's key for forms, is timed from ``ctcachectl compile`` (a fresh process)
to its answer, the form fetched (``fetch = "always"``) vs compiled by B's
own worker (``fetch = "never"``, the anchor); B's form has A's bytes.

Figures (RESULT lines for bench/all.sh, bench/results.py), per format F:
``fleet.F.remote`` (fetch=always, anchor: fetch=never, ratio = local /
remote: above 1 the fetch wins), ``fleet.F.auto`` (the cost rule, same
anchor; the label says what it chose) and ``fleet.F.bytes`` (payload bytes
the fetch moved); per form, ``fleet.form.{minilm,conv}.ort`` and
``fleet.form.minilm.ov`` (fetched, anchor: compiled here).

    python bench/fleet_bench.py --garage PATH [--bin-dir DIR] [--layers 8] [--dim 4096] [--reps 3]
                                [--formats F,...] [--no-packs] [--no-forms] [--work DIR] [--keep]
                                [--no-drop-caches]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "client" / "python"), str(REPO / "tests" / "python")]

import ctcache  # noqa: E402
import real_models  # noqa: E402
from garage_cluster import REGION, Cluster, GarageError, remote_section  # noqa: E402
from materialize_bench import (connect, drop_scratch, log, mib, result, start_daemon, stop_daemon,  # noqa: E402
                               write_model)

BUCKET = "ctc-bench"
PREFIX = "fleet"
# Both formats with the default policy's parameters, written out so that A
# and each single-format B ask for exactly the same entries.
FORMATS = {
    "ort.matmul_nbits": {"bits": "4", "block_size": "32", "symmetric": "true"},
    "gemm.pack_b.f32": {},
}
MODES = ("never", "always", "auto")
# Forms: (figure, corpus model, runtime, onnxruntime's level).
FORMS = (
    ("minilm.ort", "minilm-l3", "onnxruntime", "extended"),
    ("conv.ort", "ddddocr-det", "onnxruntime", "all"),
    ("minilm.ov", "minilm-l3", "openvino", None),
)
POLL_S = 0.01
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


class BenchError(RuntimeError):
    pass


def policy_toml(formats: list[str]) -> str:
    out = []
    for f in formats:
        out += ["[[policy]]", f'format = "{f}"']
        if FORMATS[f]:
            out.append("params = {" + ", ".join(f'{k} = "{v}"' for k, v in FORMATS[f].items()) + "}")
    return "\n".join(out)


def remote_toml(garage: Cluster, extra: tuple[str, ...] = (), **options) -> str:
    """The ``[remote]`` table for ``garage``'s bucket (``options``: see
    :func:`garage_cluster.remote_section`; ``extra``: more of its lines)."""
    return remote_section(f"s3://{BUCKET}/{PREFIX}", garage.endpoint, extra=[f'region = "{REGION}"', *extra],
                          **options)


class Host:
    """One ctcached (release) on its own folder, config and empty cache
    (``args``: more of its command line)."""

    def __init__(self, bin_dir: Path, root: Path, config: str, args: tuple[str, ...] = ()):
        self.bin_dir, self.root = bin_dir, root
        root.mkdir(parents=True)
        (root / "ctcached.toml").write_text(config + "\n")
        self.proc, self.cache, self.sock = start_daemon(bin_dir, root, list(args))
        self.client = connect(self.proc, self.sock, root)
        if self.client is None:
            raise BenchError(f"ctcached in {root} did not start")

    def ctl_json(self, *args: str) -> dict:
        r = subprocess.run([str(self.bin_dir / "ctcachectl"), "--socket", str(self.sock), *args, "--json"],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise BenchError(f"ctcachectl {' '.join(args)}: exit {r.returncode}\n{r.stderr}")
        return json.loads(r.stdout)

    def remote_status(self) -> dict:
        return self.ctl_json("remote", "status")

    def stop(self) -> None:
        self.client.close()
        stop_daemon(self.proc)

    def log_tail(self) -> str:
        return (self.root / "ctcached.log").read_text(errors="replace")[-3000:]


def drop_caches(enabled: bool) -> None:
    if enabled:
        os.sync()
        DROP_CACHES.write_text("3\n")


def keygen(bin_dir: Path, name: str, folder: Path) -> tuple[Path, str]:
    """A key pair in ``folder``: the secret key file and the public key line."""
    r = subprocess.run([str(bin_dir / "ctcachectl"), "remote", "keygen", name, "--dir", str(folder)],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise BenchError(f"ctcachectl remote keygen: {r.stderr}")
    return folder / f"{name}.secret", (folder / f"{name}.pub").read_text().strip()


def seed(bin_dir: Path, work: Path, garage: Cluster, model: Path, formats: list[str]) -> tuple[str, dict]:
    """Host A packs every format of ``model`` and uploads it. Returns A's
    public key line and {digest hex: {format: payload blake3}}."""
    secret, public = keygen(bin_dir, "a", work)
    a = Host(bin_dir, work / "a", policy_toml(formats) + "\n" + remote_toml(
        garage, fetch="never", write=True, signing_key=secret))
    try:
        t = time.perf_counter()
        res = a.client.resolve_model(model, on_miss="wait", timeout=1800)
        packed_s = time.perf_counter() - t
        want: dict[str, dict[str, str]] = {}
        for tensor in res.tensors:
            got = {ctcache.entry_format(e): e.payload_blake3 for e in tensor.entries}
            if sorted(got) != sorted(formats):
                raise BenchError(f"A packed {sorted(got)} of {tensor.name}, not {formats}")
            want[tensor.source_digest.hex()] = got
        total = len(want) * len(formats)
        while True:
            st = a.remote_status()
            if st["errors"] or st["upload_drops"]:
                raise BenchError(f"A's uploads failed: {st}\n{a.log_tail()}")
            if st["uploads"] >= total and st["queue_depth"] == 0:
                break
            if time.perf_counter() - t > 1800:
                raise BenchError(f"A's uploads not done in 30 min: {st}")
            time.sleep(0.1)
        uploaded_s = time.perf_counter() - t
        log(f"host A: packed {total} entries in {packed_s:.2f} s; all uploaded {uploaded_s:.1f} s after the "
            f"request ({mib(st['bytes_out'])}, {st['bytes_out'] / (uploaded_s - packed_s) / 1e6:.0f} MB/s "
            f"once packed, each object replicated on 3 nodes)")
        return public, want
    finally:
        a.stop()


def measure(bin_dir: Path, root: Path, garage: Cluster, staging: Path, fmt: str, mode: str, public: str,
            want: dict, drop: bool) -> dict:
    """One fresh host B: seconds from the model's arrival to every entry of
    ``fmt`` ready, and B's remote status."""
    watch = root / "watch"
    watch.mkdir(parents=True)
    config = f'watch = ["{watch}"]\n' + policy_toml([fmt]) + "\n" + remote_toml(
        garage, fetch=mode, write=False, trusted=[public])
    b = Host(bin_dir, root / "host", config)
    files = sorted(staging.iterdir(), key=lambda p: p.suffix == ".onnx")  # external data first
    try:
        drop_caches(drop)
        t = time.perf_counter()
        for f in files:
            f.rename(watch / f.name)
        waiting, packing_us = dict(want), 0
        while waiting:
            for digest in list(waiting):
                r = b.client.lookup(digest, brief=True)
                for e in r.entries:
                    if ctcache.entry_format(e) == fmt:
                        if e.payload_blake3 != waiting[digest][fmt]:
                            raise BenchError(f"B ({mode}) has other bytes than A for {digest} {fmt}")
                        del waiting[digest]
                        packing_us += e.pack_duration_us
                        break
            if not waiting:
                break
            if time.perf_counter() - t > 1800:
                raise BenchError(f"B ({fmt}, fetch={mode}) not ready in 30 min\n{b.log_tail()}")
            time.sleep(POLL_S)
        took = time.perf_counter() - t
        st = b.remote_status()
        # The entries' pack durations: this host's when it packed, A's when fetched.
        return {"s": took, "status": st, "packing_s": packing_us / 1e6}
    finally:
        b.stop()
        for f in files:
            (watch / f.name).rename(f)
        shutil.rmtree(root, ignore_errors=True)


def runtime_libraries() -> tuple[str, ...]:
    """The daemon's flags for the venv's onnxruntime and OpenVINO libraries."""
    import onnxruntime
    import openvino

    ort = next((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))
    ov = next((Path(openvino.__file__).parent / "libs").glob("libopenvino_c.so*"))
    return ("--ort-library", str(ort), "--openvino-library", str(ov))


def compile_args(model: str, runtime: str, level: str | None) -> list[str]:
    args = ["compile", str(real_models.by_name(model).path), "--runtime", runtime]
    return args + (["--level", level] if level else [])


def forms_of(host: Host) -> dict[str, str]:
    """{entry key: payload blake3} of ``host``'s store."""
    return {e["key"]: e["payload_blake3"] for e in host.ctl_json("ls")["entries"]}


def seed_forms(bin_dir: Path, work: Path, garage: Cluster, libs: tuple[str, ...],
               timed: list[tuple]) -> tuple[str, dict]:
    """Host A compiles every form of ``timed`` and uploads it (weights
    first). Returns A's public key line and A's entries {key: payload blake3}."""
    secret, public = keygen(bin_dir, "forms", work)
    a = Host(bin_dir, work / "forms-a", remote_toml(garage, fetch="never", write=True, signing_key=secret), libs)
    try:
        t = time.perf_counter()
        for _, model, runtime, level in timed:
            if not a.ctl_json(*compile_args(model, runtime, level))["compiled"]:
                raise BenchError(f"A did not compile the {runtime} form of {model}")
        entries = forms_of(a)
        while True:
            st = a.remote_status()
            if st["errors"] or st["upload_drops"]:
                raise BenchError(f"A's uploads failed: {st}\n{a.log_tail()}")
            if st["uploads"] >= len(entries) and st["queue_depth"] == 0:
                break
            if time.perf_counter() - t > 1800:
                raise BenchError(f"A's uploads not done in 30 min: {st}")
            time.sleep(0.1)
        log(f"host A: {len(timed)} forms compiled and uploaded ({len(entries)} entries, "
            f"{mib(st['bytes_out'])}) in {time.perf_counter() - t:.1f} s")
        return public, entries
    finally:
        a.stop()


def measure_form(bin_dir: Path, root: Path, garage: Cluster, libs: tuple[str, ...], form: tuple, mode: str,
                 public: str, seeded: dict, drop: bool) -> float:
    """One fresh host B: seconds from ``ctcachectl compile`` to its answer,
    the form fetched (``always``) or compiled here (``never``)."""
    _, model, runtime, level = form
    b = Host(bin_dir, root, remote_toml(garage, fetch=mode, write=False, trusted=[public],
                                        extra=(f'trusted_form_keys = ["{public}"]',)), libs)
    try:
        drop_caches(drop)
        t = time.perf_counter()
        r = subprocess.run([str(bin_dir / "ctcachectl"), "--socket", str(b.sock), *compile_args(model, runtime, level),
                            "--json"], capture_output=True, text=True, timeout=600)
        took = time.perf_counter() - t
        if r.returncode != 0:
            raise BenchError(f"B's compile ({mode}): exit {r.returncode}\n{r.stderr}\n{b.log_tail()}")
        if json.loads(r.stdout)["compiled"] != (mode == "never"):
            raise BenchError(f"B (fetch={mode}) compiled={not json.loads(r.stdout)['compiled']}\n{b.log_tail()}")
        if mode == "always":
            other = {k: v for k, v in forms_of(b).items() if seeded.get(k) != v}
            if other:
                raise BenchError(f"B has entries A does not: {sorted(other)}")
        return took
    finally:
        b.stop()
        shutil.rmtree(root, ignore_errors=True)


def forms(bin_dir: Path, work: Path, garage: Cluster, reps: int, drop: bool, timed: list[tuple]) -> None:
    """Runtime forms through the fleet: fetched vs compiled, per form of ``timed`` (of FORMS)."""
    for _, model, _, _ in timed:
        real_models.fetch(real_models.by_name(model))
    libs = runtime_libraries()
    public, seeded = seed_forms(bin_dir, work, garage, libs, timed)
    for form in timed:
        name, model, runtime, level = form
        runs: dict[str, list[float]] = {"never": [], "always": []}
        for rep in range(reps):
            for mode in (("never", "always"), ("always", "never"))[rep % 2]:
                took = measure_form(bin_dir, work / f"forms-b-{name}-{mode}-{rep}", garage, libs, form, mode,
                                    public, seeded, drop)
                runs[mode].append(took)
                log(f"form {name:11} fetch={mode:6} #{rep + 1}: {took:6.2f} s")
        here, fetched = statistics.median(runs["never"]), statistics.median(runs["always"])
        how = f"{runtime}'s form" + (f" at {level}" if level else "")
        result(f"fleet.form.{name}", f"{model}: a fresh host's ctcachectl compile, {how} fetched from Garage "
               f"(3 nodes, loopback) vs compiled by its worker", fetched, "s", here, here / fetched)


def raw_get(garage: Cluster, drop: bool) -> tuple[int, float]:
    """Every payload object read once with a plain S3 GET (boto3, page cache
    dropped first): (bytes, seconds). What the remote gives without ctcache."""
    c = garage.client()
    keys = [o["Key"] for page in c.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX + "/")
            for o in page.get("Contents", []) if o["Key"].endswith("/payload")]
    drop_caches(drop)
    n, t = 0, time.perf_counter()
    for k in keys:
        for chunk in c.get_object(Bucket=BUCKET, Key=k)["Body"].iter_chunks(1 << 20):
            n += len(chunk)
    return n, time.perf_counter() - t


def rate(st: dict, fmt: str) -> str:
    packs = {k.split("/")[0]: v for k, v in st["pack_bytes_per_s"].items()}
    return f"{packs[fmt] / 1e6:.0f} MB/s" if fmt in packs else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or "/var/tmp/ctcache-target")
    ap.add_argument("--garage", required=True, help="the garage 2.5 binary")
    ap.add_argument("--bin-dir", type=Path, default=target / "release")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=3, help="timed runs per format and mode (the median counts)")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--no-forms", action="store_true", help="skip the runtime forms")
    ap.add_argument("--forms", default=",".join(f[0] for f in FORMS), help="the runtime forms timed")
    ap.add_argument("--no-packs", action="store_true", help="skip the packs (the formats)")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir under /var/tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    ap.add_argument("--no-drop-caches", action="store_true", help="keep the page cache between runs")
    a = ap.parse_args()

    formats = [] if a.no_packs else a.formats.split(",")
    asked = set(a.forms.split(","))
    unknown = asked - {f[0] for f in FORMS}
    if unknown:
        log(f"unknown form {', '.join(sorted(unknown))}: one of {', '.join(f[0] for f in FORMS)} "
            f"(--no-forms for none)")
        return 2
    timed = [f for f in FORMS if f[0] in asked]
    for f in formats:
        if f not in FORMATS:
            log(f"unknown format {f!r}: one of {', '.join(FORMATS)}")
            return 2
    for b in ("ctcached", "ctcachectl"):
        if not os.access(a.bin_dir / b, os.X_OK):
            log(f"{a.bin_dir / b} missing: cargo build --release -p ctcached -p ctcachectl")
            return 2
    drop = not a.no_drop_caches
    if drop and not os.access(DROP_CACHES, os.W_OK):
        log(f"cannot write {DROP_CACHES} (not root?): run as root, or pass --no-drop-caches "
            f"(then the model and the remote's blocks are read from the page cache)")
        return 2

    work = a.work or Path(tempfile.mkdtemp(prefix="ctcfb-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    staging = work / "staging"
    staging.mkdir()
    garage = Cluster(a.garage, work / "garage", BUCKET)
    # The daemons' credentials: the standard AWS environment, nothing else of AWS.
    for k in ("AWS_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        os.environ.pop(k, None)
    try:
        t = time.perf_counter()
        garage.start()
        os.environ.update(AWS_ACCESS_KEY_ID=garage.key_id, AWS_SECRET_ACCESS_KEY=garage.secret,
                          AWS_REGION=REGION)
        log(f"garage: 3 nodes on loopback, replication factor 3, up in {time.perf_counter() - t:.1f} s "
            f"({a.garage}, endpoint {garage.endpoint})")
        log(f"{os.cpu_count()} CPUs; daemons {a.bin_dir / 'ctcached'} (default workers); page cache "
            + ("dropped before each timed run" if drop else "kept (--no-drop-caches)"))

        if formats:
            model = write_model(staging, a.layers, a.dim, "matmuls")
            public, want = seed(a.bin_dir, work, garage, model, formats)

            runs: dict[tuple[str, str], list[dict]] = {}
            for fmt in formats:
                for rep in range(a.reps):
                    # Each mode in each place of the order once in three runs:
                    # whatever a run leaves warm (Garage's own caches) is shared out.
                    for mode in MODES[rep % 3:] + MODES[:rep % 3]:
                        m = measure(a.bin_dir, work / f"b-{fmt}-{mode}-{rep}", garage, staging, fmt, mode, public,
                                    want, drop)
                        st = m["status"]
                        runs.setdefault((fmt, mode), []).append(m)
                        packed = f" (packing {m['packing_s']:.2f} s of it)" if mode == "never" else ""
                        log(f"{fmt:18} fetch={mode:6} #{rep + 1}: {m['s']:6.2f} s{packed}: fetched {st['hits']}, "
                            f"cost rule {st['chose_fetch']} fetch / {st['chose_pack']} pack, "
                            f"misses {st['misses']}, errors {st['errors']}, rejected {st['rejected']}, "
                            f"{mib(st['bytes_in'])} in; remote {st['remote_bytes_per_s'] / 1e6:.0f} MB/s, "
                            f"pack {rate(st, fmt)}")

            got, took = raw_get(garage, drop)
            log(f"plain S3 GET of every payload object (boto3, one at a time): {mib(got)} in {took:.2f} s, "
                f"{got / took / 1e6:.0f} MB/s")

            n = len(want)
            log("\n==== summary (median of %d per mode; ratio = local / this: above 1 the remote wins) ====" % a.reps)
            for fmt in formats:
                def med(mode: str) -> float:
                    return statistics.median(r["s"] for r in runs[(fmt, mode)])

                def last(mode: str) -> dict:
                    return runs[(fmt, mode)][-1]["status"]

                local, remote, auto = med("never"), med("always"), med("auto")
                fetched = last("always")
                autos = [r["status"] for r in runs[(fmt, "auto")]]
                cf, cp = sum(st["chose_fetch"] for st in autos), sum(st["chose_pack"] for st in autos)
                fetch_rate = statistics.median(r["status"]["remote_bytes_per_s"] for r in runs[(fmt, "always")])
                log(f"{fmt}: local {local:.2f} s, remote {remote:.2f} s ({local / remote:.2f}x), "
                    f"auto {auto:.2f} s ({local / auto:.2f}x; the cost rule chose fetch {cf}, pack {cp} "
                    f"over {a.reps} run(s)), {mib(fetched['bytes_in'])} fetched; "
                    f"rates: remote {fetch_rate / 1e6:.0f} MB/s, pack {rate(last('never'), fmt)} (payload bytes)")
                if fetched["hits"] != n:
                    log(f"  note: fetch=always fetched {fetched['hits']} of {n} entries (the rest were packed)")
                what = f"{a.layers} x {a.dim}x{a.dim} fp32 weights: model in a fresh host's watched folder to all ready"
                result(f"fleet.{fmt}.remote", f"{what}, fetched from Garage (3 nodes, loopback) vs packed locally",
                       remote, "s", local, local / remote)
                result(f"fleet.{fmt}.auto",
                       f"{what}, fetch = auto (chose fetch {cf}, pack {cp} of {n * a.reps} entries in {a.reps} "
                       f"runs) vs packed locally", auto, "s", local, local / auto)
                result(f"fleet.{fmt}.bytes", f"payload bytes fetched for {n} entries (fetch = always)",
                       fetched["bytes_in"] / (1 << 20), "MiB")
        if not a.no_forms:
            forms(a.bin_dir, work, garage, a.reps, drop, timed)
        return 0
    except (BenchError, GarageError) as e:
        log(f"fleet_bench: {e}")
        return 1
    finally:
        garage.stop()
        drop_scratch(work, a.keep)


if __name__ == "__main__":
    sys.exit(main())
