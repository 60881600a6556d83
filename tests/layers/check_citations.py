#!/usr/bin/env python3
"""Comments cite documents in the repository (CTest test "comment_citations").

Scans the comments of libs/, apps/, plugins/ and tests/ (C and C++ // and /* */ comments; # comments
of CMake, Python, shell and TOML files, and Python docstrings; Markdown files whole) and fails,
naming file:line, on a comment that
  - cites the notes outside the product: a path through the shared notes or seed folders, or the
    first design sketch by its file name (OUTSIDE below);
  - cites a .md file that does not exist (resolved against the file's own directory, then the
    repository root: "docs/shard.md", "README.md" next to the file);
  - cites an issue by number (the word issue followed by a number, or a number in parentheses
    after a hash sign): say what the thing is instead.
Design documents live in docs/ (docs/style.md, "Comments").

Usage: check_citations.py [--self-test] SOURCE_DIR. --self-test first runs the check on a small
tree with one bad citation of each kind and fails unless every one is reported.
"""
import os
import re
import sys
import tempfile

SCAN = ("libs", "apps", "plugins", "tests")
C_LIKE = (".h", ".hpp", ".c", ".cc", ".cpp", ".cu")
HASH = (".py", ".sh", ".cmake", ".toml")
OUTSIDE = re.compile(r"(?<![\w.-])(shared/|seeds/)|\bDESIGN\.md\b")
MD = re.compile(r"(?<![\w/.-])((?:\.\.?/)*[\w.-]+(?:/[\w.-]+)*\.md)\b")
ISSUE = re.compile(r"\bissues?\s*#?\s*\d+|\(#\d+\)", re.IGNORECASE)


def c_comments(text):
    """(line, comment text) of every // and /* */ comment, skipping string and char literals."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, j)
            i = j + 2
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + (m.group(1) if m else "") + '"', i)
            end = n if end < 0 else end
            line += text.count("\n", i, end)
            i = end + 2 + (len(m.group(1)) if m else 0)
        elif c == '"' or (c == "'" and (i == 0 or not text[i - 1].isalnum())):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def hash_comments(text, python):
    """(line, comment text) of # comments (outside quotes) and, for Python, docstrings."""
    out = []
    lines = text.split("\n")
    in_doc = None
    for n, l in enumerate(lines, 1):
        if python and in_doc:
            out.append((n, l))
            if in_doc in l:
                in_doc = None
            continue
        if python:
            m = re.match(r'\s*[rbuRBU]?("""|\'\'\')', l)
            if m:
                out.append((n, l))
                if l.count(m.group(1)) == 1:
                    in_doc = m.group(1)
                continue
        quote = None
        for i, c in enumerate(l):
            if quote:
                if c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "#":
                out.append((n, l[i + 1:]))
                break
    return out


def comments(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    name = os.path.basename(path)
    if name.endswith(C_LIKE):
        return c_comments(text)
    if name.endswith(HASH) or name == "CMakeLists.txt":
        return hash_comments(text, name.endswith(".py"))
    if name.endswith(".md"):
        return list(enumerate(text.split("\n"), 1))
    return []


def check(root):
    out = []
    for top in SCAN:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for f in sorted(filenames):
                path = os.path.join(dirpath, f)
                where = os.path.relpath(path, root)
                for n, text in comments(path):
                    m = OUTSIDE.search(text)
                    if m:
                        out.append(f"{where}:{n}: cites '{m.group(0)}', a document outside the "
                                   f"repository: {text.strip()}")
                    for md in MD.findall(text):
                        if not any(os.path.isfile(os.path.join(base, md))
                                   for base in (dirpath, root)) and "DESIGN.md" not in md:
                            out.append(f"{where}:{n}: cites '{md}', which does not exist in the "
                                       f"repository: {text.strip()}")
                    m = ISSUE.search(text)
                    if m:
                        out.append(f"{where}:{n}: cites an issue number ('{m.group(0)}'); say "
                                   f"what the thing is instead: {text.strip()}")
    return out


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def self_test():
    """A tree with one bad citation of each kind; every one must be reported."""
    iss = "iss" + "ue"  # spelt apart so this file does not cite anything itself
    with tempfile.TemporaryDirectory() as t:
        write(f"{t}/docs/real.md", "# real\n")
        write(f"{t}/libs/a/a.cpp",
              f'// fine: docs/real.md, "Section"\n'
              f'const char* s = "{iss} #1 in a string is code, not a comment";\n'
              f"// see ../shared/reference/x.md\n"
              f"/* per DESIGN.md */\n"
              f"int x;  // gone.md\n"
              f"// ({iss} #5 item 3)\n"
              f"// a fix (#12)\n")
        write(f"{t}/tests/b/CMakeLists.txt", f"# {iss} 8: install tests\nset(X \"#9\")\n")
        write(f"{t}/tests/b/gen.py", f'"""Skeletons ({iss} 4)."""\nx = "# not a comment"\n')
        write(f"{t}/plugins/p/README.md", "Notes in seeds/h2o.txt.\n")
        got = "\n".join(check(t))
        want = ["libs/a/a.cpp:3: cites 'shared/'", "libs/a/a.cpp:4: cites 'DESIGN.md'",
                "libs/a/a.cpp:5: cites 'gone.md'", "libs/a/a.cpp:6: cites an issue number",
                "libs/a/a.cpp:7: cites an issue number", "tests/b/CMakeLists.txt:1: cites an issue",
                "tests/b/gen.py:1: cites an issue", "plugins/p/README.md:1: cites 'seeds/'"]
        missed = [w for w in want if w not in got]
        wrong = [w for w in ("libs/a/a.cpp:1:", "libs/a/a.cpp:2:", "tests/b/CMakeLists.txt:2:",
                             "tests/b/gen.py:2:") if w in got]
        if missed or wrong:
            print("check_citations self-test failed; the check reported:\n" + got)
            for w in missed:
                print(f"  not reported: {w}")
            for w in wrong:
                print(f"  reported wrongly: {w}")
            return False
    return True


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit("usage: check_citations.py [--self-test] SOURCE_DIR")
    if "--self-test" in argv and not self_test():
        return 1
    problems = check(os.path.abspath(args[0]))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} comment citation(s) to fix: cite docs/<page>.md by section name")
        return 1
    print("comment citations: every cited document is in the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
