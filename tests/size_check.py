"""A smell check, not a gate: lists product functions over 100 lines and
files over 500 (inline `#[cfg(test)]` modules, tests/ folders and tests.rs
files not counted), for a reader to ask whether each does one job. A long
one is split where it has a seam, never to get under a number, and never
by dropping behaviour; so the check reports and exits 0 (1 with --strict).

    python3 tests/size_check.py [--strict] [MAX_FN_LINES MAX_FILE_LINES]
"""
import os
import re
import sys

ROOTS = ["src", "format/src", "proto/src", "convert/src", "kernels/src",
         "daemon/src", "client/src", "client/ctl/src", "remote/src"]
RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"'(\\.[^']*|[^\\'])'")
TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{")
FN = re.compile(r"\bfn\s+(\w+)")


def blank(text: str) -> str:
    """`text` with every character but newlines replaced by a space."""
    return re.sub(r"[^\n]", " ", text)


def code_only(text: str) -> str:
    """Comments, strings and char literals blanked (lines kept), so braces
    inside them do not count."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
        elif (m := RAW_STRING.match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
        elif text[i] == "'" and (m := CHAR.match(text, i)):
            j = m.end()
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(blank(text[i:j]))
        i = j
    return "".join(out)


def closing_brace(code: str, at: int) -> int:
    depth = 0
    for j in range(at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def body_start(code: str, after: int) -> int:
    """Where a fn's body opens, or -1 for a declaration without one."""
    depth = 0
    for j in range(after, len(code)):
        ch = code[j]
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        elif ch == ";" and depth <= 0:
            return -1
        elif ch == "{" and depth <= 0:
            return j
    return -1


def measure(path: str):
    """Lines of the file outside test modules, and (lines, name, line) of
    each function outside them."""
    code = code_only(open(path).read())
    tests = [(m.start(), closing_brace(code, m.end() - 1)) for m in TEST_MODULE.finditer(code)]
    test_lines = sum(code.count("\n", a, b) + 1 for a, b in tests)
    fns = []
    for m in FN.finditer(code):
        if any(a <= m.start() <= b for a, b in tests):
            continue
        start = body_start(code, m.end())
        if start < 0:
            continue
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, closing_brace(code, start)) + 1
        fns.append((last - first + 1, m.group(1), first))
    return code.count("\n") - test_lines, fns


def main() -> int:
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    strict = "--strict" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--strict"]
    max_fn = int(args[0]) if args else 100
    max_file = int(args[1]) if len(args) > 1 else 500
    over = 0
    for root in ROOTS:
        for folder, _, files in os.walk(root):
            for f in sorted(files):
                path = os.path.join(folder, f)
                if not f.endswith(".rs") or "/tests/" in path or f == "tests.rs":
                    continue
                lines, fns = measure(path)
                if lines > max_file:
                    print(f"smell: file {path}: {lines} lines")
                    over += 1
                for n, name, line in fns:
                    if n > max_fn:
                        print(f"smell: fn {name} ({path}:{line}): {n} lines")
                        over += 1
    if over:
        print(f"size_check: {over} to look at (functions over {max_fn} lines, files over {max_file}): "
              "split where there is a seam, else leave it")
        return 1 if strict else 0
    print(f"size_check: no product function over {max_fn} lines, no file over {max_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
