#!/usr/bin/env python3
"""The documents against the repository and the CLI, so they cannot drift.

    tests/docs_check.py [CTCACHECTL]      (else $CTCACHECTL, else the debug build)

Checks, standard library only:
- every repository path README.md, docs/*.md and docs/operations/*.md name
  in backticks or links (a token with a '/' that starts with a top-level
  folder, or a top-level file such as Cargo.toml) exists;
- every `ctcachectl` command docs/CLI.md documents (its headings, and the
  first column of its command tables) exists, and every command of
  `ctcachectl --help` (and of its command groups) is documented there;
- every long option CLI.md names for a command (in the command's heading or
  row, and in the code spans of its section) is in that command's --help
  (global options count for every command);
- README.md is at most 8,000 characters, and each part of the operations
  guide (docs/operations/*.md) at most 40,000;
- no markdown table cell in README.md or the docs is over 400 characters
  (a longer explanation goes in prose below its table);
- no line of README.md or the docs, outside code blocks and code spans,
  carries a date of the form 20YY-MM-DD (a date of measurement or of
  history goes stale; what is true is said in the present tense);
- every decision the code and the docs cite (`D3`, `D12`, ...) is defined in
  docs/DECISIONS.md.

Each failure names the file, the line and what is missing; exit 1 if any.
(Configuration keys against docs/operations/configure.md's key table are a
Rust test: daemon/src/config.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README_MAX = 8000
PART_MAX = 40000   # each docs/operations/*.md
CELL_MAX = 400     # a markdown table cell
TOP_DIRS = ("src/ format/ files/ proto/ convert/ kernels/ daemon/ client/ remote/ testkit/ tests/ "
            "bench/ benches/ systemd/ docs/ scripts/ contrib/ examples/ .ci/").split()
TOP_FILES = {"Cargo.toml", "Cargo.lock", "Makefile", "README.md", ".gitignore"}
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
WORD = re.compile(r"^[a-z][a-z0-9-]*$")

problems: list[str] = []


def fail(path: Path, line: int, what: str) -> None:
    problems.append(f"{path.relative_to(REPO)}:{line}: {what}")


def docs() -> list[Path]:
    return ([REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
            + sorted((REPO / "docs" / "operations").glob("*.md")))


def prose_lines(doc: Path):
    """(line number, line) of each line outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


# ---- sizes, table cells, dates --------------------------------------------------

CELL_SPLIT = re.compile(r"(?<!\\)\|")
# A calendar date 20YY-MM-DD: a date of measurement or history. Code spans are
# left out (an IAM policy's "Version": "2012-10-17" is in a code block anyway),
# and so are ids that merely contain digits (CVE-2026-34446 has no day).
DATE = re.compile(r"(?<![\w-])20\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])(?![\w-])")


def check_sizes_cells_dates() -> None:
    for part in sorted((REPO / "docs" / "operations").glob("*.md")):
        size = len(part.read_text())
        if size > PART_MAX:
            fail(part, 1, f"is {size} characters, more than {PART_MAX}")
    for doc in docs():
        for n, line in prose_lines(doc):
            if line.lstrip().startswith("|"):
                for i, cell in enumerate(CELL_SPLIT.split(line.strip().strip("|")), 1):
                    if len(cell.strip()) > CELL_MAX:
                        fail(doc, n, f"table cell {i} is {len(cell.strip())} characters, more than {CELL_MAX}")
            if m := DATE.search(CODE.sub("", line)):
                fail(doc, n, f"carries the date {m.group(0)}: say what is true now, without a date")


# ---- repository paths ---------------------------------------------------------

def path_of(token: str) -> str | None:
    """The repository path a code span or link names, or None."""
    t = token.strip().split()[0] if token.strip() else ""
    t = re.split(r"::|#|:(?=\d|\w)", t)[0].rstrip(".,;:)")
    if any(c in t for c in "*{}<>$~?=|") or t.startswith("/"):
        return None
    if t in TOP_FILES:
        return t
    if "/" in t and t.startswith(tuple(TOP_DIRS)):
        return t
    return None


# A bare file name in a code span (`walk.rs`): the code map names files
# inside the folder it describes.
BARE_FILE = re.compile(r"^[\w.-]+\.(rs|py|sh|proto|service|socket|timer)$")


def repo_file_names() -> set[str]:
    roots = [REPO / d.rstrip("/") for d in TOP_DIRS]
    return {f.name for r in roots if r.is_dir() for f in r.rglob("*")
            if f.is_file() and "target" not in f.parts}


def check_paths() -> None:
    names = repo_file_names()
    for doc in docs():
        for n, line in prose_lines(doc):
            for m in CODE.finditer(line):
                p = path_of(m.group(1))
                if p and not (REPO / p).exists():
                    fail(doc, n, f"names `{p}`, which is not in the repository")
                bare = m.group(1).strip().split("::")[0].rstrip(".,;:)")
                if BARE_FILE.match(bare) and bare not in names:
                    fail(doc, n, f"names the file `{bare}`, which no folder of the repository has")
            for m in LINK.finditer(line):
                target = m.group(1).split("#")[0]
                if not target or "://" in target or target.startswith("mailto:"):
                    continue
                if not (doc.parent / target).exists():
                    fail(doc, n, f"links to {target}, which is not in the repository")


# ---- decisions ------------------------------------------------------------------

DECISION = re.compile(r"(?<![\w/.-])D(\d{1,2})\b")


def check_decisions() -> None:
    defined = {int(m.group(1)) for m in re.finditer(r"^## D(\d+)\.", (REPO / "docs" / "DECISIONS.md").read_text(),
                                                   re.M)}
    roots = [REPO / d for d in TOP_DIRS] + [REPO / "README.md"]
    files = [f for r in roots for f in ([r] if r.is_file() else r.rglob("*"))
             if f.suffix in (".rs", ".md", ".py", ".proto", ".toml") and "target" not in f.parts]
    for f in files:
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for m in DECISION.finditer(line):
                if int(m.group(1)) not in defined:
                    fail(f, n, f"cites D{m.group(1)}, which docs/DECISIONS.md does not define")


# ---- ctcachectl -----------------------------------------------------------------

def helptext(ctl: str, path: tuple[str, ...]) -> str:
    r = subprocess.run([ctl, *path, "--help"], capture_output=True, text=True,
                       env={**os.environ, "NO_COLOR": "1"})
    if r.returncode != 0:
        raise RuntimeError(f"{ctl} {' '.join(path)} --help: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def subcommands(help_text: str) -> list[str]:
    m = re.search(r"^Commands:\n((?:  \S.*\n)+)", help_text, re.M)
    if not m:
        return []
    names = [l.split()[0] for l in m.group(1).splitlines()]
    return [n for n in names if n != "help"]


def cli_tree(ctl: str) -> dict[tuple[str, ...], str]:
    """Every command path (leaves and groups) to its --help text."""
    tree = {(): helptext(ctl, ())}
    todo = [()]
    while todo:
        path = todo.pop()
        for sub in subcommands(tree[path]):
            p = path + (sub,)
            tree[p] = helptext(ctl, p)
            todo.append(p)
    return tree


def command_path(spec: str, tree: dict) -> tuple[tuple[str, ...] | None, str]:
    """The command path a documented synopsis names (`remote pull MODEL`)."""
    words = spec.split()
    if words and words[0] == "ctcachectl":
        words = words[1:]
    path: tuple[str, ...] = ()
    for w in words:
        if not WORD.match(w):
            break
        if path + (w,) in tree:
            path += (w,)
        elif subcommands(tree[path]):
            return None, f"`ctcachectl {' '.join(path + (w,))}` is not a command"
        else:
            break
    if not path:
        return None, f"`{spec}` names no ctcachectl command"
    return path, ""


def check_cli(ctl: str) -> None:
    tree = cli_tree(ctl)
    cli_md = REPO / "docs" / "CLI.md"
    lines = cli_md.read_text().splitlines()
    documented: set[tuple[str, ...]] = set()
    # Sections: a command heading (### `...`) up to the next heading; a command
    # table row (| `...` | under "## ... commands") is a section of its own line.
    sections: list[tuple[int, list[str], list[tuple[int, str]]]] = []
    in_commands = False
    fenced = False
    current = None
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            if current:
                current[2].append((n, line))
            continue
        if line.startswith("#"):
            current = None
            if line.startswith("## "):
                in_commands = "commands" in line.lower()
            if line.startswith("### ") and in_commands:
                current = (n, CODE.findall(line), [])
                sections.append(current)
            continue
        if in_commands and line.startswith("| `"):
            sections.append((n, [CODE.findall(line)[0]], []))
            continue
        if current:
            current[2].append((n, line))

    for n, specs, body in sections:
        paths = []
        for spec in specs:
            path, why = command_path(spec, tree)
            if path is None:
                fail(cli_md, n, why)
                continue
            documented.add(path)
            paths.append(path)
            for flag in FLAG.findall(spec):
                if flag not in FLAG.findall(tree[path]):
                    fail(cli_md, n, f"`{spec}` names {flag}, which `ctcachectl {' '.join(path)} --help` lacks")
        for bn, line in body:
            for code in CODE.findall(line):
                first = code.split()[0] if code.split() else ""
                if first in ("ctcached", "cargo", "systemctl", "man"):
                    continue
                owners = paths
                if first == "ctcachectl" or (first,) in tree and first not in (p[0] for p in paths):
                    path, _ = command_path(code, tree)
                    if path is None:
                        continue
                    owners = [path]
                for flag in FLAG.findall(code):
                    if owners and not any(flag in FLAG.findall(tree[p]) for p in owners):
                        names = " / ".join(f"`ctcachectl {' '.join(p)} --help`" for p in owners)
                        fail(cli_md, bn, f"`{code}` names {flag}, which {names} lacks")

    for path in sorted(tree):
        if not path or subcommands(tree[path]):
            continue  # the top and command groups: their commands are checked
        if path not in documented:
            fail(cli_md, 1, f"`ctcachectl {' '.join(path)}` is not documented (no heading or command row)")


def main(argv: list[str]) -> int:
    ctl = (argv[1] if len(argv) > 1 else os.environ.get("CTCACHECTL")
           or os.path.join(os.environ.get("CARGO_TARGET_DIR", "/var/tmp/ctcache-target"), "debug", "ctcachectl"))
    readme = REPO / "README.md"
    size = len(readme.read_text())
    if size > README_MAX:
        fail(readme, 1, f"is {size} characters, more than {README_MAX}")
    check_sizes_cells_dates()
    check_paths()
    check_decisions()
    check_cli(ctl)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"docs check: {len(problems)} problems", file=sys.stderr)
        return 1
    print(f"docs check: README.md ({size} characters), docs/*.md and docs/operations/*.md agree with the "
          f"repository and {ctl}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
