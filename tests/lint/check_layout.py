#!/usr/bin/python3
"""The layout rule of paradev (README.md, "Layout"), as a test.

  (a) No source file (.c, .h) outside tests/ passes MAX_LINES (800) lines;
      CUDA kernels (*.cu) are not counted.
  (b) No two source files of server/, scheduler/, client/ or device/
      (subfolders included; each of the four is its own graph) call each
      other in a circle.  The one circle allowed is the op registry's:
      device/registry.c calls each op file's registration function
      (dev_register_*_ops) and device/ops/*.c call the registry back, by
      design; edges from device/registry.c to device/ops/*.c are not counted.

The file graph comes from the build tree's object files: `nm -P` on each .o
gives the symbols it defines (T D B R, and the weak and small-data kinds) and
the ones it needs (U); file A -> file B when A needs a symbol that B defines.
Each object under BUILD/**/CMakeFiles/<target>.dir/ is mapped back to its
source through the target's DependInfo.cmake (objects it does not list are
stale and skipped), or, for a target without one (other generators), the
first dependency in its .o.d file.  Strongly connected components (Tarjan) of more
than one file are the circles; each is printed with the symbols that make
each edge, and with its elementary cycles.

Usage: check_layout.py --source-dir SRC --build-dir BUILD [--nm NM]
                       [--max-lines N]
Exit status: 0 when the layout holds, 1 when it does not, 2 for bad usage.
Run tests/lint/test_check_layout.py for the self-test.
"""

import argparse
import os
import re
import subprocess
import sys

MAX_LINES = 800
GRAPHS = ("server", "scheduler", "client", "device")
SOURCE_EXTS = (".c", ".h")
OBJECT_SOURCE_EXTS = (".c", ".cu")
# nm kinds that define a symbol another file can link against.
DEFINED_KINDS = set("TDBRGSVWiu")
MAX_CYCLES_PRINTED = 12


# --- (a) long files ------------------------------------------------------------

def _is_build_dir(path):
    return (os.path.exists(os.path.join(path, "CMakeCache.txt")) or
            os.path.isdir(os.path.join(path, "CMakeFiles")))


def source_files(source_dir, exclude=()):
    """Every .c and .h under source_dir, relative, sorted; skips tests/,
    hidden folders and build trees (a folder holding CMakeCache.txt)."""
    exclude = {os.path.realpath(p) for p in exclude}
    out = []
    for root, dirs, files in os.walk(source_dir):
        rel_root = os.path.relpath(root, source_dir)
        keep = []
        for d in dirs:
            full = os.path.join(root, d)
            rel = os.path.normpath(os.path.join(rel_root, d))
            if d.startswith(".") or rel == "tests" or _is_build_dir(full):
                continue
            if os.path.realpath(full) in exclude:
                continue
            keep.append(d)
        dirs[:] = sorted(keep)
        for f in files:
            if f.endswith(SOURCE_EXTS):
                out.append(os.path.normpath(os.path.join(rel_root, f)))
    return sorted(out)


def count_lines(path):
    with open(path, "rb") as f:
        data = f.read()
    n = data.count(b"\n")
    if data and not data.endswith(b"\n"):
        n += 1
    return n


def long_files(source_dir, max_lines=MAX_LINES, exclude=()):
    """[(relpath, lines)] of the source files over max_lines."""
    out = []
    for rel in source_files(source_dir, exclude):
        n = count_lines(os.path.join(source_dir, rel))
        if n > max_lines:
            out.append((rel, n))
    return out


# --- (b) circles -----------------------------------------------------------------

_DEPINFO_RE = re.compile(r'"([^"]+)"\s+"([^"]+\.o)"\s+"[^"]*"\s+"[^"]*"')


def _depinfo_map(target_dir, build_dir):
    """{object abspath: source abspath} from CMake's DependInfo.cmake."""
    path = os.path.join(target_dir, "DependInfo.cmake")
    out = {}
    if not os.path.exists(path):
        return out
    # Object paths there are relative to the top of the build tree.
    with open(path) as f:
        for m in _DEPINFO_RE.finditer(f.read()):
            src, obj = m.group(1), m.group(2)
            out[os.path.normpath(os.path.join(build_dir, obj))] = os.path.normpath(src)
    return out


def _source_from_depfile(obj, base):
    """The source named first in obj's .o.d file (gcc -MD), or None; relative
    names are relative to `base`, the folder the compiler ran in."""
    dep = obj + ".d"
    if not os.path.exists(dep):
        return None
    with open(dep, errors="replace") as f:
        text = f.read().replace("\\\n", " ")
    head, sep, rest = text.partition(": ")
    if not sep:
        return None
    for word in rest.split():
        if word.endswith(OBJECT_SOURCE_EXTS):
            return os.path.normpath(os.path.join(base, word))
    return None


def object_sources(build_dir):
    """{source abspath: [object abspath, ...]} for every object file of a
    CMake target in build_dir whose source still exists."""
    out = {}
    for root, dirs, files in os.walk(build_dir):
        dirs.sort()
        if not (root.endswith(".dir") and
                os.path.basename(os.path.dirname(root)) == "CMakeFiles"):
            continue
        mapping = _depinfo_map(root, build_dir)
        for sub, _, objs in os.walk(root):
            for o in objs:
                if not o.endswith(".o"):
                    continue
                obj = os.path.normpath(os.path.join(sub, o))
                if mapping:
                    # DependInfo.cmake lists the target's sources of today;
                    # an object it does not name is left from an older build.
                    src = mapping.get(obj)
                else:
                    src = _source_from_depfile(
                        obj, os.path.dirname(os.path.dirname(root)))
                if src is None or not os.path.exists(src):
                    continue  # a stale object, or one we cannot place
                out.setdefault(src, []).append(obj)
    return out


def nm_symbols(obj, nm="nm"):
    """(defined, undefined) global symbol sets of one object file."""
    res = subprocess.run([nm, "-P", obj], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True)
    if res.returncode != 0:
        raise RuntimeError("%s -P %s failed: %s" % (nm, obj, res.stderr.strip()))
    defined, undefined = set(), set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind in DEFINED_KINDS:
            defined.add(name)
    return defined, undefined


def graph_of(path):
    """Which of GRAPHS a source path (relative to the source tree) is in."""
    top = path.split("/", 1)[0]
    return top if top in GRAPHS else None


def is_allowed_edge(a, b):
    """The op registry registers every op file (and they call it back)."""
    return a == "device/registry.c" and re.match(r"^device/ops/[^/]+\.c$", b) is not None


def build_edges(files):
    """files: {relpath: (defined, undefined)} of one graph.
    Returns {a: {b: sorted symbols}} for a needing what b defines."""
    definers = {}
    for f, (defined, _) in files.items():
        for s in defined:
            definers.setdefault(s, set()).add(f)
    edges = {}
    for a, (_, undefined) in files.items():
        for s in undefined:
            for b in definers.get(s, ()):
                if b == a or is_allowed_edge(a, b):
                    continue
                edges.setdefault(a, {}).setdefault(b, set()).add(s)
    return {a: {b: sorted(syms) for b, syms in bs.items()} for a, bs in edges.items()}


def tarjan(nodes, edges):
    """Strongly connected components, each a sorted list, in sorted order."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):  # iterative, so deep graphs do not hit the recursion limit
        work = [(v, iter(sorted(edges.get(v, {}))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, {})))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(out)


def elementary_cycles(comp, edges, limit=MAX_CYCLES_PRINTED):
    """Up to `limit` elementary cycles inside one component, shortest first;
    each starts at its smallest file."""
    members = set(comp)
    found = set()
    steps = 0
    for start in sorted(comp):
        # Paths from start back to start through files greater than start.
        stack = [(start, [start])]
        while stack and len(found) < limit * 8 and steps < 200000:
            steps += 1
            node, path = stack.pop()
            for w in sorted(edges.get(node, {}), reverse=True):
                if w not in members:
                    continue
                if w == start:
                    found.add(tuple(path))
                elif w > start and w not in path:
                    stack.append((w, path + [w]))
    return sorted(found, key=lambda c: (len(c), c))[:limit]


def circles(files):
    """files: {relpath: (defined, undefined)} (all graphs). Returns
    [(graph, component, edges within it, cycles)]."""
    out = []
    for g in GRAPHS:
        sub = {f: v for f, v in files.items() if graph_of(f) == g}
        edges = build_edges(sub)
        for comp in tarjan(sub.keys(), edges):
            if len(comp) < 2:
                continue
            inside = {a: {b: s for b, s in edges.get(a, {}).items() if b in comp}
                      for a in comp}
            out.append((g, comp, inside, elementary_cycles(comp, inside)))
    return out


def object_symbols(source_dir, build_dir, nm="nm"):
    """{relpath: (defined, undefined)} for every source of the four graphs
    that the build tree compiled (objects of one source in several targets
    are merged)."""
    src_root = os.path.realpath(source_dir)
    out = {}
    for src, objs in sorted(object_sources(build_dir).items()):
        real = os.path.realpath(src)
        if not real.startswith(src_root + os.sep):
            continue  # generated code in the build tree
        rel = os.path.relpath(real, src_root).replace(os.sep, "/")
        if graph_of(rel) is None:
            continue
        defined, undefined = set(), set()
        for o in objs:
            d, u = nm_symbols(o, nm)
            defined |= d
            undefined |= u
        out[rel] = (defined, undefined - defined)
    return out


# --- report ----------------------------------------------------------------------

def report(longs, circs, max_lines, out):
    if longs:
        out.write("Source files over %d lines (tests/ and *.cu are exempt):\n" % max_lines)
        for rel, n in longs:
            out.write("  %s: %d lines (%d over)\n" % (rel, n, n - max_lines))
        out.write("  What to do: a file that passes %d lines holds more than one idea."
                  " Split it by domain\n  (one concern per file, a private header"
                  " beside the code for what the parts share),\n  not by call shape;"
                  " see README.md, \"Layout\", and each folder's README.md.\n\n" % max_lines)
    for g, comp, inside, cycles in circs:
        out.write("Circle in %s/: %d files call each other: %s\n"
                  % (g, len(comp), " ".join(comp)))
        out.write("  edges (caller -> callee: symbols the caller needs from the callee):\n")
        for a in comp:
            for b in sorted(inside.get(a, {})):
                syms = inside[a][b]
                shown = ", ".join(syms[:8]) + (", ... (%d more)" % (len(syms) - 8)
                                               if len(syms) > 8 else "")
                out.write("    %s -> %s: %s\n" % (a, b, shown))
        out.write("  cycles%s:\n" % (" (the first %d)" % len(cycles)
                                       if len(cycles) == MAX_CYCLES_PRINTED else ""))
        for c in cycles:
            out.write("    %s\n" % " -> ".join(list(c) + [c[0]]))
        out.write("\n")
    if circs:
        out.write("What to do about a circle: make the calls go one way. Move what both\n"
                  "sides use into a lower file that calls neither (or state it in the\n"
                  "layer's private header and define it once), or let the lower file take\n"
                  "a callback or function table that the higher one fills in; cut first\n"
                  "the edges whose symbols do not belong to the callee's domain. Only\n"
                  "device/registry.c -> device/ops/*.c (registration) is exempt.\n\n")
    if not longs and not circs:
        out.write("layout OK: no source file over %d lines, no circle between files of %s\n"
                  % (max_lines, ", ".join(g + "/" for g in GRAPHS)))
    else:
        out.write("layout: %d file(s) over %d lines, %d circle(s)\n"
                  % (len(longs), max_lines, len(circs)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source-dir", required=True)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--nm", default=os.environ.get("NM", "nm"))
    p.add_argument("--max-lines", type=int, default=MAX_LINES)
    a = p.parse_args(argv)
    if not os.path.isdir(a.source_dir) or not os.path.isdir(a.build_dir):
        sys.stderr.write("check_layout: --source-dir and --build-dir must be folders\n")
        return 2
    longs = long_files(a.source_dir, a.max_lines, exclude=[a.build_dir])
    syms = object_symbols(a.source_dir, a.build_dir, a.nm)
    if not syms:
        sys.stderr.write("check_layout: no object files of %s under %s: build first\n"
                         % ("/, ".join(GRAPHS) + "/", a.build_dir))
        return 2
    circs = circles(syms)
    report(longs, circs, a.max_lines, sys.stdout)
    return 1 if longs or circs else 0


if __name__ == "__main__":
    sys.exit(main())
