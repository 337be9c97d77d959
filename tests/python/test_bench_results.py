"""bench/results.py: the performance table (docs/PERFORMANCE.md) from the benches' RESULT lines, and README.md's summary of it.

A run of some benches (``bench/all.sh --only NAME --markdown``) replaces the rows of the figures it measured
and keeps every other row as it was; its note joins the table's note. A whole run writes every row.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results.py"
BEGIN = "<!-- bench/all.sh --markdown: begin (generated, do not edit) -->"
END = "<!-- bench/all.sh --markdown: end -->"


def results(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, RESULTS, *map(str, args)], capture_output=True, text=True)


def block(readme: Path) -> str:
    text = readme.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)]


def test_a_partial_run_replaces_only_its_rows(tmp_path: Path) -> None:
    figures = tmp_path / "figures"
    figures.write_text("a.speed\nb.size\nc.time\n")
    whole = tmp_path / "whole.log"
    whole.write_text(
        "prose\n"
        'RESULT name=a.speed value=10 unit=GB/s anchor=11 ratio=0.909 target=ratio>=1.0 label="a vs anchor"\n'
        'RESULT name=b.size value=3 unit=MiB target=value<64 label="b size"\n'
        'RESULT name=c.time value=2.5 unit=s target=value<2 label="c time"\n'
    )
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{BEGIN}\n{END}\n\nafter\n")
    r = results("markdown", figures, whole, "--readme", readme, "--note", "Whole run on day 1.")
    assert r.returncode == 0, r.stderr
    before = block(readme)
    assert "Whole run on day 1." in before and "MISSED" in before

    part = tmp_path / "part.log"
    part.write_text('RESULT name=a.speed value=12 unit=GB/s anchor=11 ratio=1.091 target=ratio>=1.0 label="a vs anchor"\n')
    r = results("markdown", figures, part, "--readme", readme, "--update", "--note", "Rows of a: day 2.")
    assert r.returncode == 0, r.stderr
    after = block(readme)

    old_rows = {l.split("|")[1].strip(): l for l in before.splitlines() if l.startswith("| `")}
    new_rows = {l.split("|")[1].strip(): l for l in after.splitlines() if l.startswith("| `")}
    assert list(new_rows) == ["`a.speed`", "`b.size`", "`c.time`"]
    assert new_rows["`b.size`"] == old_rows["`b.size`"]
    assert new_rows["`c.time`"] == old_rows["`c.time`"]
    assert new_rows["`a.speed`"] != old_rows["`a.speed`"]
    assert "12.0 GB/s" in new_rows["`a.speed`"] and "| met |" in new_rows["`a.speed`"]
    assert "Whole run on day 1. Rows of a: day 2." in after
    # A later run of the same rows replaces its note; other notes stay.
    for day in (3, 4):
        r = results("markdown", figures, part, "--readme", readme, "--update", "--note",
                    f"The rows of a: day {day}.")
        assert r.returncode == 0, r.stderr
    assert "Whole run on day 1. Rows of a: day 2. The rows of a: day 4." in block(readme)
    assert "day 3" not in block(readme)
    assert readme.read_text().endswith(f"{END}\n\nafter\n")
    assert results("check", figures, readme).returncode == 0


def test_a_partial_run_adds_a_row_for_a_new_figure(tmp_path: Path) -> None:
    figures = tmp_path / "figures"
    figures.write_text("a.speed\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"{BEGIN}\n{END}\n")
    log = tmp_path / "a.log"
    log.write_text('RESULT name=a.speed value=1 unit=s label="a"\n')
    assert results("markdown", figures, log, "--readme", readme).returncode == 0
    figures.write_text("a.speed\nd.new\n")
    log.write_text('RESULT name=d.new value=7 unit=ms label="d"\n')
    r = results("markdown", figures, log, "--readme", readme, "--update")
    assert r.returncode == 0, r.stderr
    rows = [l for l in block(readme).splitlines() if l.startswith("| `")]
    assert [l.split("|")[1].strip() for l in rows] == ["`a.speed`", "`d.new`"]
    assert "7.00 ms" in rows[1]
    assert results("check", figures, readme).returncode == 0


def test_the_readme_summary_is_what_the_table_gives(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("results", RESULTS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ids = [name for name, _ in mod.HEADLINE]
    figures = tmp_path / "figures"
    figures.write_text("\n".join(ids) + "\n")
    log = tmp_path / "all.log"
    log.write_text("".join(f'RESULT name={i} value={n + 1} unit=s anchor=2 ratio={(n + 1) / 2} label="{i}"\n'
                           for n, i in enumerate(ids)))
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text(f"# p\n\n{BEGIN}\n{END}\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# r\n\n{mod.SUMMARY_BEGIN}\n{mod.SUMMARY_END}\n\nafter\n")
    assert results("markdown", figures, log, "--doc", doc).returncode == 0
    r = results("summary", doc, readme)
    assert r.returncode == 0, r.stderr
    summary = readme.read_text()
    assert summary.count("| `") == len(ids) and "| 1.00 s | 2.00 s | 0.5x |" in summary
    assert results("check", figures, doc, "--summary", readme).returncode == 0

    readme.write_text(summary.replace("| 1.00 s |", "| 0.90 s |"))
    r = results("check", figures, doc, "--summary", readme)
    assert r.returncode == 1 and "headline summary differs" in r.stderr
