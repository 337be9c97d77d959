#!/usr/bin/env python3
"""The performance table of bench/all.sh, from the benches' RESULT lines.

Each bench prints, beside its prose, one line per figure
(ctcache_testkit::Figure in Rust; the same format from the shell and
Python benches):

    RESULT name=ID value=V unit=U [anchor=A ratio=R] [target=(value|ratio)OP BOUND] label="..."

Subcommands (standard library only: runs without the venv):

    results.py table FIGURES LOG...    print the table of the declared FIGURES
                                       (a file, one id a line) from the RESULT
                                       lines in the LOGs; exit 1 on a figure
                                       nobody declared
    results.py markdown FIGURES LOG... [--doc docs/PERFORMANCE.md] [--note TEXT] [--update]
                                       the same as a Markdown table, written
                                       between the document's markers (--readme
                                       is the old name of --doc); with --update
                                       only the rows the LOGs measure are
                                       replaced, --note joins the old note
                                       (replacing an older "The rows of X:"
                                       note of the same X)
    results.py summary DOC README      write README's headline summary (the
                                       HEADLINE figures below) from DOC's table
    results.py check FIGURES DOC [--summary README]
                                       exit 1 unless DOC's table has one row per
                                       declared figure, no other, and (with
                                       --summary) README's summary is what DOC's
                                       table gives (runs no bench: a cheap CI check)
"""

from __future__ import annotations

import math
import operator
import re
import shlex
import sys
from pathlib import Path

BEGIN = "<!-- bench/all.sh --markdown: begin (generated, do not edit) -->"
END = "<!-- bench/all.sh --markdown: end -->"
SUMMARY_BEGIN = "<!-- bench/results.py summary: begin (generated, do not edit) -->"
SUMMARY_END = "<!-- bench/results.py summary: end -->"
# The README's headline figures (at most ten), each with a short "what"; their
# figure, anchor and ratio come from the table's rows.
HEADLINE = [
    ("materialize.cold", "fp32 model to a 4-bit onnxruntime session, empty cache, vs onnxruntime's quantizer"),
    ("materialize.warm.memory", "the same, warm cache, `ctcache.ort.inference_session` (no file written)"),
    ("pack.ort.matmul_nbits.cpu", "4-bit MatMulNBits pack vs onnxruntime's quantizer"),
    ("pack.ggml.q8_0.cpu", "ggml Q8_0 pack vs gguf-py"),
    ("digest.b3sum", "digest of 1 GiB of external data vs `b3sum`"),
    ("daemon.lookup_p50", "Lookup over the Unix socket, p50, vs a no-op RPC"),
    ("open_payload.throughput", "read of a 256 MiB entry through `open_payload` vs `read()`"),
    ("store.gc", "gc of 10,000 of 100,000 entries"),
    ("soak.wrong_bytes", "wrong bytes served under faults"),
    ("soak.lost", "acknowledged entries lost under faults"),
]
CELL = re.compile(r"(?<!\\)\|")
OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
TARGET = re.compile(r"^(value|ratio)(>=|<=|>|<)(-?[0-9.e+-]+)$")
ROW_ID = re.compile(r"^\|\s*`([^`]+)`\s*\|")


class Bad(Exception):
    pass


def parse_line(line: str) -> dict[str, str] | None:
    """The fields of a RESULT line (None for any other line)."""
    if not line.startswith("RESULT "):
        return None
    try:
        words = shlex.split(line[len("RESULT "):])
    except ValueError as e:
        raise Bad(f"unparsable RESULT line {line!r}: {e}") from None
    fields = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq:
            raise Bad(f"RESULT field without '=' in {line!r}")
        fields[key] = value
    for key in ("name", "value", "unit"):
        if key not in fields:
            raise Bad(f"RESULT line without {key}: {line!r}")
    for key in ("value", "anchor", "ratio"):
        if key in fields:
            try:
                fields[key] = float(fields[key])
            except ValueError:
                raise Bad(f"RESULT {key} is not a number in {line!r}") from None
    if ("anchor" in fields) != ("ratio" in fields):
        raise Bad(f"RESULT line with an anchor but no ratio, or the reverse: {line!r}")
    if "target" in fields and not TARGET.match(fields["target"]):
        raise Bad(f"RESULT target {fields['target']!r} is not (value|ratio)OP NUMBER")
    return fields


def judge(f: dict) -> str:
    """'met', 'MISSED', or '-' (no target)."""
    t = f.get("target")
    if not t:
        return "-"
    on, op, bound = TARGET.match(t).groups()
    x = f.get(on)
    if x is None or math.isnan(x):
        return "MISSED"
    return "met" if OPS[op](x, float(bound)) else "MISSED"


def number(x: float) -> str:
    if math.isnan(x):
        return "nan"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def target_text(t: str | None, unit: str) -> str:
    if not t:
        return "-"
    on, op, bound = TARGET.match(t).groups()
    return f"{op} {number(float(bound))}" + ("x" if on == "ratio" else f" {unit}")


def read_declared(path: str) -> list[str]:
    ids = [l.strip() for l in Path(path).read_text().splitlines() if l.strip()]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise Bad(f"figures declared twice in bench/all.sh: {sorted(dup)}")
    return ids


def collect(declared: list[str], logs: list[str]) -> dict[str, dict]:
    got: dict[str, dict] = {}
    for log in logs:
        for line in Path(log).read_text(errors="replace").splitlines():
            f = parse_line(line.strip())
            if f is None:
                continue
            if f["name"] not in declared:
                raise Bad(f"{log}: figure {f['name']!r} is not declared in bench/all.sh")
            got[f["name"]] = f  # a bench repeating a figure: the last one counts
    return got


def rows(declared: list[str], got: dict[str, dict]) -> list[list[str]]:
    out = []
    for name in declared:
        f = got.get(name)
        if f is None:
            out.append([name, "not measured", "", "", "", "-", "-"])
            continue
        unit = f["unit"]
        value = f"{number(f['value'])} {unit}"
        anchor = f"{number(f['anchor'])} {unit}" if "anchor" in f else "-"
        ratio = f"{number(f['ratio'])}x" if "ratio" in f else "-"
        out.append([name, f.get("label", ""), value, anchor, ratio,
                    target_text(f.get("target"), unit), judge(f)])
    return out


HEAD = ["figure", "what", "value", "anchor", "ratio", "target", "met"]


def text_table(rs: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rs + [HEAD]) for i in range(len(HEAD))]
    widths[1] = min(widths[1], 60)
    line = lambda r: "  ".join(c[:widths[i]].ljust(widths[i]) for i, c in enumerate(r)).rstrip()
    return "\n".join([line(HEAD), line(["-" * w for w in widths])] + [line(r) for r in rs])


def markdown_row(r: list[str]) -> str:
    esc = lambda c: c.replace("|", "\\|")
    return "| " + " | ".join([f"`{r[0]}`"] + [esc(c) for c in r[1:]]) + " |"


def markdown_table(rs: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    return "\n".join(lines + [markdown_row(r) for r in rs])


# The sentences of a table's note, and the "The rows of X:" that starts one.
NOTE_SPLIT = re.compile(r"(?<=\.) (?=The rows of |Measured by )")
NOTE_OF = re.compile(r"The rows of [^:]+:")


def updated_block(block: str, rs: list[list[str]], measured: set[str], note: str) -> str:
    """The README's block with the rows of `measured` replaced by `rs`'s and
    every other row kept as it was (a run of some benches only); `note`
    joins the block's note."""
    kept = {m.group(1): l for l in block.splitlines() if (m := ROW_ID.match(l.strip()))}
    head = block.split("\n| figure |", 1)[0].strip()
    table = [markdown_row(r) if r[0] in measured or r[0] not in kept else kept[r[0]]
             for r in rs]
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)] + table
    if head and note and not head.endswith("."):
        head += "."
    # A note "The rows of X: ..." stands for the latest run of X: an older
    # one of the same X goes.
    if (m := NOTE_OF.match(note)) and head:
        head = " ".join(t for t in NOTE_SPLIT.split(head) if not t.startswith(m.group(0)))
    note = " ".join(t for t in (head, note) if t)
    return (f"\n{note}\n\n" if note else "\n") + "\n".join(lines) + "\n"


def marked(path: Path, begin: str, end: str) -> tuple[str, int, int]:
    """PATH's text and the span between its markers BEGIN and END."""
    text = path.read_text()
    b, e = text.find(begin), text.find(end)
    if b < 0 or e < b:
        raise Bad(f"{path}: no block between the markers {begin!r} and {end!r}")
    return text, b + len(begin), e


def readme_block(readme: Path) -> tuple[str, int, int]:
    return marked(readme, BEGIN, END)


def table_rows(doc: Path) -> dict[str, list[str]]:
    """The cells of each row of DOC's table, by figure id."""
    text, b, e = readme_block(doc)
    out = {}
    for l in text[b:e].splitlines():
        if ROW_ID.match(l.strip()):
            cells = [c.strip() for c in CELL.split(l.strip())[1:-1]]
            out[cells[0].strip("`")] = cells
    return out


def summary_block(doc: Path) -> str:
    """README's headline summary from DOC's table: what, figure, anchor, ratio."""
    rows = table_rows(doc)
    lines = ["| what | figure | anchor | ratio |", "|---|---|---|---|"]
    for name, what in HEADLINE:
        if name not in rows:
            raise Bad(f"{doc}: no row for the headline figure {name!r}")
        _, _, value, anchor, ratio, _, _ = rows[name]
        lines.append(f"| `{name}`: {what} | {value} | {anchor} | {ratio} |")
    return "\n" + "\n".join(lines) + "\n"


def summary_span(readme: Path) -> tuple[str, int, int]:
    return marked(readme, SUMMARY_BEGIN, SUMMARY_END)


def check(declared: list[str], readme: Path) -> list[str]:
    """The problems of the README's table against the declared figures."""
    text, b, e = readme_block(readme)
    ids = [m.group(1) for l in text[b:e].splitlines() if (m := ROW_ID.match(l.strip()))]
    problems = []
    for name in declared:
        if name not in ids:
            problems.append(f"no row for figure {name!r} (declared in bench/all.sh)")
    for name in ids:
        if name not in declared:
            problems.append(f"row {name!r} is not a figure bench/all.sh knows")
    for name in {i for i in ids if ids.count(i) > 1}:
        problems.append(f"row {name!r} appears twice")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] not in ("table", "markdown", "summary", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "summary":
        doc, readme = Path(argv[2]), Path(argv[3])
        text, b, e = summary_span(readme)
        readme.write_text(text[:b] + summary_block(doc) + text[e:])
        print(f"wrote the summary of {len(HEADLINE)} headline figures into {readme}")
        return 0
    cmd, declared = argv[1], read_declared(argv[2])
    if cmd == "check":
        problems = check(declared, Path(argv[3]))
        if argv[4:5] == ["--summary"]:
            readme = Path(argv[5])
            text, b, e = summary_span(readme)
            if text[b:e] != summary_block(Path(argv[3])):
                problems.append(f"{readme}'s headline summary differs from what {argv[3]}'s table gives")
        for p in problems:
            print(f"{argv[3]}: {p}", file=sys.stderr)
        if problems:
            print("regenerate it with bench/all.sh --markdown", file=sys.stderr)
        return 1 if problems else 0
    args, readme, note = argv[3:], None, ""
    update = "--update" in args
    args = [a for a in args if a != "--update"]
    for flag in ("--doc", "--readme"):
        if flag in args:
            i = args.index(flag)
            readme, args = Path(args[i + 1]), args[:i] + args[i + 2:]
    if "--note" in args:
        i = args.index("--note")
        note, args = args[i + 1], args[:i] + args[i + 2:]
    rs = rows(declared, collect(declared, args))
    if cmd == "table":
        print(text_table(rs))
        missed = sum(r[6] == "MISSED" for r in rs)
        unmeasured = sum(r[1] == "not measured" for r in rs)
        print(f"\n{len(rs)} figures: {sum(r[6] == 'met' for r in rs)} targets met, "
              f"{missed} missed, {unmeasured} not measured")
        return 0
    if update:
        if readme is None:
            raise Bad("--update needs --doc")
        text, b, e = readme_block(readme)
        got = collect(declared, args)
        readme.write_text(text[:b] + updated_block(text[b:e], rs, set(got), note) + text[e:])
        print(f"updated the rows of {len(got)} figures in {readme}")
        return 0
    block = (f"\n{note}\n\n" if note else "\n") + markdown_table(rs) + "\n"
    if readme is None:
        print(block)
        return 0
    text, b, e = readme_block(readme)
    readme.write_text(text[:b] + block + text[e:])
    print(f"wrote the table of {len(rs)} figures into {readme}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except Bad as e:
        print(f"results.py: {e}", file=sys.stderr)
        sys.exit(1)
