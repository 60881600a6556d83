#!/usr/bin/env python3
"""The layer rule of libs/CMakeLists.txt, checked (CTest test "layers").

libs/CMakeLists.txt lists the libraries in layer order, bottom first (HP_LAYERS); a library may
include and link only libraries before it. This reads that list and fails, naming file:line, on:
  - an #include "hp/<lib>/..." in libs/<lib>/include or libs/<lib>/src of a library later in the
    order (an upward include) or of a library that is not in the list;
  - an hp::<lib> in libs/<lib>/CMakeLists.txt (DEPS, PRIVATE_DEPS, target_link_libraries) that is
    later in the order or unknown;
  - a cycle among the libraries (reported even where the order check would hide its cause);
  - a plugin (plugins/<name>/) including an hp/ header other than hp/plugin/hp_plugin.h (the C ABI),
    a quoted header that is neither its own nor plugins/common's, or linking an hp:: library other
    than hp::plugin_abi.
apps/ may use every library, but only ones that exist.

Usage: check_layers.py [--self-test] SOURCE_DIR. --self-test first runs the check on a small tree
with one violation of each kind and fails unless every one is reported, so a check that cannot fail
is caught too. See docs/architecture.md, "Layers".
"""
import os
import re
import sys
import tempfile

SOURCE_EXT = (".h", ".hpp", ".c", ".cc", ".cpp", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
HP_INCLUDE = re.compile(r"^hp/([A-Za-z0-9_]+)/")
HP_TARGET = re.compile(r"\bhp::([A-Za-z0-9_]+)")
PLUGIN_ABI = "hp/plugin/hp_plugin.h"


def read_layers(root):
    """The HP_LAYERS list of libs/CMakeLists.txt, in order."""
    path = os.path.join(root, "libs", "CMakeLists.txt")
    text = "\n".join(strip_cmake_comment(l) for l in open(path, encoding="utf-8"))
    m = re.search(r"set\(\s*HP_LAYERS\s+([^)]*)\)", text)
    if not m:
        sys.exit(f"{path}: no set(HP_LAYERS ...) list: the layer order must be stated there")
    return m.group(1).split()


def strip_cmake_comment(line):
    return line.split("#", 1)[0].rstrip("\n")


def source_files(top):
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for f in sorted(filenames):
            if f.endswith(SOURCE_EXT):
                yield os.path.join(dirpath, f)


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield n, m.group(1), m.group(2)


def rel(root, path):
    return os.path.relpath(path, root)


def check(root):
    """Every violation as 'file:line: message', sorted as found."""
    layers = read_layers(root)
    rank = {lib: i for i, lib in enumerate(layers)}
    problems = []
    edges = {lib: {} for lib in layers}  # lib -> {dep: first "file:line" using it}

    def use(lib, dep, where):
        if dep not in rank:
            problems.append(f"{where}: '{lib}' uses 'hp/{dep}', which is not a library of the "
                            f"layer list ({' '.join(layers)})")
            return
        if dep == lib:
            return
        edges[lib].setdefault(dep, where)
        if rank[dep] > rank[lib]:
            problems.append(f"{where}: '{lib}' uses '{dep}', which comes after it in the layer "
                            f"order (a library may use only those before it: "
                            f"{' '.join(layers[:rank[lib]]) or 'none'})")

    for lib in layers:
        base = os.path.join(root, "libs", lib)
        if not os.path.isdir(base):
            continue
        for sub in ("include", "src"):
            for path in source_files(os.path.join(base, sub)):
                for n, _, inc in includes(path):
                    m = HP_INCLUDE.match(inc)
                    if m:
                        use(lib, m.group(1), f"{rel(root, path)}:{n}")
        cmake = os.path.join(base, "CMakeLists.txt")
        if os.path.exists(cmake):
            with open(cmake, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    for t in HP_TARGET.findall(strip_cmake_comment(line)):
                        dep = "plugin" if t == "plugin_abi" else t
                        use(lib, dep, f"{rel(root, cmake)}:{n}")

    problems += find_cycles(layers, edges)
    problems += check_plugins(root)
    problems += check_apps(root, rank)
    return problems


def find_cycles(layers, edges):
    """One message per cycle found by depth-first search, with the file:line of each edge."""
    out, state, stack = [], {}, []

    def visit(lib):
        state[lib] = "open"
        stack.append(lib)
        for dep in sorted(edges[lib]):
            if state.get(dep) == "open":
                cyc = stack[stack.index(dep):] + [dep]
                hops = ", ".join(f"{a} -> {b} ({edges[a][b]})" for a, b in zip(cyc, cyc[1:]))
                out.append(f"cycle {' -> '.join(cyc)}: {hops}")
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[lib] = "done"

    for lib in layers:
        if lib not in state:
            visit(lib)
    return out


def check_plugins(root):
    out = []
    top = os.path.join(root, "plugins")
    if not os.path.isdir(top):
        return out
    common = os.path.join(top, "common")
    for name in sorted(os.listdir(top)):
        pdir = os.path.join(top, name)
        if not os.path.isdir(pdir):
            continue
        for path in source_files(pdir):
            for n, kind, inc in includes(path):
                where = f"{rel(root, path)}:{n}"
                if inc.startswith("hp/"):
                    if inc != PLUGIN_ABI:
                        out.append(f"{where}: plugin '{name}' includes '{inc}'; plugins may "
                                   f"include only the C ABI header {PLUGIN_ABI}")
                elif kind == '"':
                    here = os.path.dirname(path)
                    if not any(os.path.exists(os.path.join(d, inc)) for d in (here, pdir, common)):
                        out.append(f"{where}: plugin '{name}' includes \"{inc}\", which is "
                                   f"neither its own header nor one of plugins/common")
        cmake = os.path.join(pdir, "CMakeLists.txt")
        if os.path.exists(cmake):
            with open(cmake, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    code = strip_cmake_comment(line)
                    for t in HP_TARGET.findall(code):
                        if t != "plugin_abi":
                            out.append(f"{rel(root, cmake)}:{n}: plugin '{name}' links hp::{t}; "
                                       f"plugins link only hp::plugin_abi")
                    if re.search(r"\blibs/", code):
                        out.append(f"{rel(root, cmake)}:{n}: plugin '{name}' reaches into libs/; "
                                   f"plugins see only the C ABI header")
    return out


def check_apps(root, rank):
    out = []
    top = os.path.join(root, "apps")
    if not os.path.isdir(top):
        return out
    for path in source_files(top):
        for n, _, inc in includes(path):
            m = HP_INCLUDE.match(inc)
            if m and m.group(1) not in rank:
                out.append(f"{rel(root, path)}:{n}: includes '{inc}' of no library in the layer list")
    return out


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def self_test():
    """A tree with one violation of each kind; every one must be reported."""
    with tempfile.TemporaryDirectory() as t:
        write(f"{t}/libs/CMakeLists.txt", "set(HP_LAYERS low mid high)\n")
        write(f"{t}/libs/low/include/hp/low/a.h", '#include "hp/mid/b.h"\n')   # upward
        write(f"{t}/libs/low/src/a.cpp", '#include "hp/nowhere/x.h"\n')        # unknown
        write(f"{t}/libs/mid/include/hp/mid/b.h", '#include "hp/low/a.h"\n')    # fine
        write(f"{t}/libs/mid/CMakeLists.txt", "hp_add_library(mid DEPS hp::low hp::high)\n")
        write(f"{t}/libs/high/src/c.cpp", '#include "hp/mid/b.h"\n')          # fine
        write(f"{t}/plugins/p/p.cpp", '#include "hp/low/a.h"\n#include "hp/plugin/hp_plugin.h"\n'
              '#include "elsewhere.h"\n')
        write(f"{t}/plugins/p/CMakeLists.txt", "hp_add_plugin(p DEPS hp::low)\n")
        write(f"{t}/apps/x/main.cpp", '#include "hp/gone/y.h"\n')
        got = "\n".join(check(t))
        want = ["libs/low/include/hp/low/a.h:1: 'low' uses 'mid'",
                "libs/low/src/a.cpp:1: 'low' uses 'hp/nowhere'",
                "libs/mid/CMakeLists.txt:1: 'mid' uses 'high'",
                "cycle low -> mid -> low",
                "plugins/p/p.cpp:1: plugin 'p' includes 'hp/low/a.h'",
                "plugins/p/p.cpp:3: plugin 'p' includes \"elsewhere.h\"",
                "plugins/p/CMakeLists.txt:1: plugin 'p' links hp::low",
                "apps/x/main.cpp:1: includes 'hp/gone/y.h'"]
        missed = [w for w in want if w not in got]
        if missed or "plugins/p/p.cpp:2" in got or "libs/high/src/c.cpp:1:" in got:
            print("check_layers self-test failed; the check reported:\n" + got)
            for w in missed:
                print(f"  not reported: {w}")
            return False
    return True


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit("usage: check_layers.py [--self-test] SOURCE_DIR")
    if "--self-test" in argv and not self_test():
        return 1
    problems = check(os.path.abspath(args[0]))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layer violation(s); the rule and the order: libs/CMakeLists.txt")
        return 1
    print("layers: every include and link points down the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
