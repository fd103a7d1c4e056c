#!/usr/bin/env python3
"""check_layers.py: the layers of src/ only point down (docs/ARCHITECTURE.md).

Every file under src/ and tools/ gets a layer from its directory:

    1 core      src/core/
    2 formats   src/formats/
    3 graph     src/graph/, src/autograd/
    4 backends  src/backends/  (ref, cpu, cuda)
    5 compile   src/compile/ (graph rewrites; the runtime calls it)
    6 runtime   src/runtime/
    7 nn        src/nn/, src/data/, src/train/
    8 llm       src/llm/
    9 programs  tools/
    0 public    include/ (visible to every layer)

A header directly in src/ (an umbrella such as the old src/kn-impl.h) belongs
to no layer: it ranks above all of src/, so any src/ file including it is
reported; split it per layer instead.

Two checks:
  includes  every `#include "..."` of a src/ or tools/ file must name a header
            of its own layer or a lower one; tools/ may include only include/
            and tools/ headers (the public API), except the one internal
            header named in SERVER_JSON (the server reads requests with the
            project's fuzzed JSON reader, docs/ARCHITECTURE.md 6a).
  symbols   (when the library's objects are built: BUILD/src/**/*.o, BUILD
            from the environment, default build) every function or variable
            an object uses must be defined in its own layer or a lower one,
            and the tools' objects (BUILD/tools/*.o) may use only what
            include/*.h declares. This catches calls that dodge the include
            check with a local prototype. Objects whose source is gone are
            ignored; a missing build skips the check (with a note).

Prints one line per back-edge ("file:line: layer -> layer: what") and exits 1
when there is any. Circles inside a layer (two files that use each other's
symbols, e.g. a dispatcher and the family it dispatches to sharing helpers)
are listed as notes ("# circle: ...") without failing: move the shared
helpers into a file of their own to end one. Run from the repository root: python3 scripts/check_layers.py
"""
import os
import re
import subprocess
import sys

LAYERS = [  # (path prefix, rank, name); longest prefix wins
    ("include/", 0, "public"),
    ("src/core/", 1, "core"),
    ("src/formats/", 2, "formats"),
    ("src/graph/", 3, "graph"),
    ("src/autograd/", 3, "graph"),
    ("src/backends/", 4, "backends"),
    ("src/compile/", 5, "compile"),
    ("src/runtime/", 6, "runtime"),
    ("src/nn/", 7, "nn"),
    ("src/data/", 7, "nn"),
    ("src/train/", 7, "nn"),
    ("src/llm/", 8, "llm"),
    ("tools/", 9, "programs"),
]
# the one exception to "tools/ uses only include/": `kiln serve` (tools/serve/)
# parses request bodies with kn_json, the fuzzed reader of src/formats/
SERVER_JSON = ("tools/serve/", "src/formats/hfconfig.h", "src/formats/hfconfig.c")
UMBRELLA = (10, "umbrella")   # src/*.h: no layer, above all of src/
SRC_EXT = (".c", ".h", ".cu", ".cuh")


def layer_of(path):
    best = None
    for prefix, rank, name in LAYERS:
        if path.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, rank, name)
    if best:
        return best[1], best[2]
    if path.startswith("src/") and "/" not in path[4:]:
        return UMBRELLA
    return None


def files_under(top):
    out = []
    for root, _dirs, names in os.walk(top):
        for n in names:
            if n.endswith(SRC_EXT):
                out.append(os.path.normpath(os.path.join(root, n)))
    return sorted(out)


INC = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def resolve(src, name):
    """The file an include names, as the compiler finds it: next to the
    including file, then -Isrc, then -Iinclude (the Makefile's order)."""
    for base in (os.path.dirname(src), "src", "include"):
        p = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(p):
            return p
    return None


def check_includes(files, report):
    for f in files:
        mine = layer_of(f)
        with open(f, encoding="utf-8", errors="replace") as fh:
            for ln, line in enumerate(fh, 1):
                m = INC.match(line)
                if not m:
                    continue
                target = resolve(f, m.group(1))
                if target is None:
                    continue  # a generated or system header: nothing to rank
                theirs = layer_of(target)
                if theirs is None:
                    continue
                if mine[1] == "programs":
                    if f.startswith(SERVER_JSON[0]) and target == SERVER_JSON[1]:
                        continue
                    if theirs[1] not in ("public", "programs"):
                        report(f"{f}:{ln}: programs -> {theirs[1]}: includes {target} (tools/ may use only include/)")
                elif theirs[0] > mine[0]:
                    report(f"{f}:{ln}: {mine[1]} -> {theirs[1]}: includes {target}")


def nm_symbols(obj):
    """(defined, undefined) global symbol names of one object file."""
    out = subprocess.run(["nm", obj], capture_output=True, text=True).stdout
    defined, undef = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undef.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRVWGS":
            defined.add(parts[2])
    return defined, undef


def public_names():
    """Every identifier of include/*.h, read through the preprocessor (names
    made by macros count), as tests/test_symbols.sh reads them."""
    text = "".join('#include "%s"\n' % n for n in sorted(os.listdir("include")) if n.endswith(".h"))
    cc = os.environ.get("KN_CC", "cc")
    try:
        out = subprocess.run([cc, "-E", "-P", "-DKN_CUDA", "-Iinclude", "-x", "c", "-"], input=text,
                             capture_output=True, text=True).stdout
    except OSError:
        return None
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", out)) or None


def check_symbols(build, report, note):
    objs = []
    for top in (os.path.join(build, "src"), os.path.join(build, "tools")):
        for root, _dirs, names in os.walk(top):
            for n in names:
                if n.endswith(".o"):
                    objs.append(os.path.join(root, n))
    top = os.path.join(build, "src")
    if not objs:
        note(f"symbols: skipped ({top} has no objects: build the library first)")
        return
    try:
        subprocess.run(["nm", "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        note("symbols: skipped (nm not found)")
        return
    # object -> source; an object whose source is gone is stale: skip it
    srcs = {}
    for o in objs:
        rel = os.path.relpath(o, build)[:-2]       # x.c -> x.o, y.cu -> y.cu.o
        for cand in (rel + ".c", rel):
            if cand.endswith((".c", ".cu")) and os.path.isfile(cand):
                srcs[o] = cand
                break
    where = {}       # symbol -> defining source
    uses = {}        # source -> undefined symbols
    for o, s in srcs.items():
        d, u = nm_symbols(o)
        for sym in d:
            where.setdefault(sym, s)
        uses[s] = u
    public = None
    if any(s.startswith("tools/") for s in uses):
        public = public_names()
        if public is None:
            note("symbols: tools/ not checked (could not preprocess include/*.h)")
    dep = {}         # source -> {source it uses: [symbols]}
    for s in uses:
        for sym in uses[s]:
            t = where.get(sym)
            if t and t != s and not s.startswith("tools/"):
                dep.setdefault(s, {}).setdefault(t, []).append(sym)
    for a in sorted(dep):
        for b in sorted(dep[a]):
            if a < b and a in dep.get(b, {}):
                note(f"circle: {a} uses {', '.join(sorted(dep[a][b])[:3])}; "
                     f"{b} uses {', '.join(sorted(dep[b][a])[:3])}")
    for s in sorted(uses):
        mine = layer_of(s)
        for sym in sorted(uses[s]):
            t = where.get(sym)
            if t is None:
                continue  # libc, libm, ...
            theirs = layer_of(t)
            if mine[1] == "programs":
                if s.startswith(SERVER_JSON[0]) and t == SERVER_JSON[2]:
                    continue
                if public is not None and t.startswith("src/") and sym not in public:
                    report(f"{s}: programs -> {theirs[1]}: uses {sym} (defined in {t}), not in include/")
            elif theirs and theirs[0] > mine[0]:
                report(f"{s}: {mine[1]} -> {theirs[1]}: uses {sym} (defined in {t})")


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    os.chdir(root)
    problems, notes = [], []
    files = files_under("src") + files_under("tools")
    check_includes(files, problems.append)
    if "--no-symbols" not in sys.argv:
        check_symbols(os.environ.get("BUILD", "build"), problems.append, notes.append)
    for n in notes:
        print("# " + n)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} back-edge(s): a layer may use only its own layer and lower ones (docs/ARCHITECTURE.md)")
        return 1
    print(f"layers ok: {len(files)} files only point down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
