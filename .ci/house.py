#!/usr/bin/env python3
"""The house rules `.ci/run` checks (issue 33, item 4): every library file of
the workspace holds at most MAX_LINES non-test lines, and no two library
files import each other (no cycle among the `use crate::` / `super::` /
`self::` paths of a crate's files), and the pure crates stay pure: `cargo
tree -e normal` of each crate in PURE shows none of the crates it must not
pull in (no async runtime, no network, no I/O libraries).

A library file is a `.rs` file under a crate's `src/` (tests/, benches and
examples are not). Non-test lines: every line outside `#[cfg(test)]` items.
An import of file A by file B: a `crate::`, `super::` or `self::` path in B
(in a `use` or written out) that names A's module or an item inside it.

Exceptions are listed below, each with its reason; an exception that no
longer applies is an error too, so the list only shrinks.

    python3 .ci/house.py            # check; exit 1 naming each breach
    python3 .ci/house.py --report   # also print every file's count
"""

import os
import re
import sys

MAX_LINES = 700

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# file -> reason. Issue 33 rebuilds these halls; each leaves the list when it does.
LONG_FILES = {}

# Pure crates -> the crates their normal dependency tree must not contain.
PURE = {
    "granary-proto": ("tokio", "quinn", "mio", "socket2"),
    "granary-node-core": ("tokio", "quinn", "mio", "socket2"),
}

# (file, file) pairs, sorted -> reason.
CYCLES = {}


def crates():
    """Each crate's source folder (a folder with Cargo.toml and src/)."""
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in ("target", ".git", "node_modules") and not d.startswith(".")]
        if "Cargo.toml" in filenames and os.path.isdir(os.path.join(dirpath, "src")):
            yield os.path.join(dirpath, "src")


def module_of(src, path):
    """The module path (a tuple) of file `path` in the crate rooted at `src`."""
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def strip_tests(text):
    """`text` without its `#[cfg(test)]` items (a module or a single item)."""
    out = []
    i = 0
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        j = m.end()
        # The item ends at its closing brace, or at a `;` before any brace.
        brace = text.find("{", j)
        semi = text.find(";", j)
        if brace == -1 or (semi != -1 and semi < brace):
            i = semi + 1 if semi != -1 else len(text)
            continue
        depth = 0
        k = brace
        while k < len(text):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1
    out.append(text[i:])
    return "".join(out)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return text


def expand_use(body):
    """The paths of one `use` tree (`a::{b, c::d}` -> a::b, a::c::d)."""
    body = re.sub(r"\s+", "", body)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(s):
        k = s.find("{")
        if k == -1:
            return [s.split(" as ")[0]]
        prefix, inner = s[:k], s[k + 1 : s.rfind("}")]
        out = []
        for part in split_top(inner):
            for p in walk(part):
                out.append(prefix + p if p != "self" else prefix.rstrip(":"))
        return out

    return walk(body)


def references(text):
    """Every `crate::`/`super::`/`self::` path the code names."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        paths.extend(expand_use(m.group(1)))
    for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", text):
        paths.append(m.group(1))
    return [p for p in paths if p.split("::")[0] in ("crate", "super", "self")]


def reexports(text, here, modules):
    """Items module `here` re-exports (`pub use a::B;`, `pub(crate) use ...`):
    name -> the path it stands for, absolute (`crate::...`)."""
    out = {}
    for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", text):
        for path in expand_use(m.group(1)):
            name = path.split("::")[-1]
            body = m.group(1)
            alias = re.search(r"\b" + re.escape(name) + r"\s+as\s+(\w+)", body)
            parts = path.split("::")
            if parts[0] == "crate":
                absolute = parts
            elif parts[0] == "super":
                cur = list(here)
                while parts and parts[0] == "super":
                    cur = cur[:-1]
                    parts = parts[1:]
                absolute = ["crate"] + cur + parts
            elif parts[0] == "self":
                absolute = ["crate"] + list(here) + parts[1:]
            elif (parts[0],) in modules or tuple(list(here) + [parts[0]]) in modules:
                absolute = ["crate"] + (list(here) if tuple(list(here) + [parts[0]]) in modules else []) + parts
            else:
                continue
            out[alias.group(1) if alias else name] = "::".join(absolute)
    return out


def resolve(path, here, is_mod_file, modules, exports=None, depth=0):
    """The module file (a module path) a path from module `here` names: its
    longest prefix that is a module of the crate, following re-exports."""
    parts = path.split("::")
    if parts[0] == "crate":
        cur = []
    elif parts[0] == "self":
        cur = list(here)
    else:
        cur = list(here)
        while parts and parts[0] == "super":
            cur = cur[:-1]
            parts = parts[1:]
        parts = ["super"] + parts  # keep the shape: the first element is dropped below
    rest = parts[1:]
    best = tuple(cur) if tuple(cur) in modules else None
    used = 0
    for k in range(1, len(rest) + 1):
        cand = tuple(cur + rest[:k])
        if cand in modules:
            best, used = cand, k
    # An item the module re-exports lives where the re-export points.
    if exports and best is not None and used < len(rest) and depth < 8:
        target = exports.get(best, {}).get(rest[used])
        if target:
            again = resolve(target, (), False, modules, exports, depth + 1)
            if again is not None:
                return again
    return best


def main():
    report = "--report" in sys.argv
    breaches = []
    long_seen = set()
    cycles_seen = set()
    for src in crates():
        files = {}
        for dirpath, _, filenames in os.walk(src):
            for f in filenames:
                if f.endswith(".rs"):
                    p = os.path.join(dirpath, f)
                    files[module_of(src, p)] = p
        texts = {}
        for mod, p in files.items():
            with open(p, encoding="utf-8") as fh:
                texts[mod] = strip_tests(fh.read())
        exports = {mod: reexports(strip_comments(t), mod, files) for mod, t in texts.items()}
        edges = {}
        for mod, p in files.items():
            text = texts[mod]
            rel = os.path.relpath(p, ROOT)
            lines = text.count("\n")
            if report:
                print(f"{lines:6} {rel}")
            if lines > MAX_LINES:
                if rel in LONG_FILES:
                    long_seen.add(rel)
                else:
                    breaches.append(f"{rel}: {lines} non-test lines, over {MAX_LINES}")
            is_mod = os.path.basename(p) in ("mod.rs", "lib.rs", "main.rs")
            targets = set()
            for ref in references(strip_comments(text)):
                t = resolve(ref, mod, is_mod, files, exports)
                if t is not None and t != mod:
                    targets.add(t)
            edges[mod] = targets
        # Cycles: strongly connected components of more than one file.
        index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

        def strong(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in edges.get(v, ()):
                if w not in index:
                    strong(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(comp)

        sys.setrecursionlimit(10000)
        for v in list(edges):
            if v not in index:
                strong(v)
        for comp in sccs:
            names = sorted(os.path.relpath(files[m], ROOT) for m in comp)
            pairs = {tuple(sorted((os.path.relpath(files[a], ROOT), os.path.relpath(files[b], ROOT))))
                     for a in comp for b in edges[a] if b in comp}
            unexcused = [p for p in pairs if p not in CYCLES]
            cycles_seen.update(p for p in pairs if p in CYCLES)
            if unexcused:
                arrows = sorted(f"{os.path.relpath(files[a], ROOT)} -> {os.path.relpath(files[b], ROOT)}"
                                for a in comp for b in edges[a] if b in comp)
                breaches.append("files import each other: " + ", ".join(names) + " (" + "; ".join(arrows) + ")")
    breaches.extend(impurities())
    for rel in sorted(set(LONG_FILES) - long_seen):
        breaches.append(f"{rel} is listed as a long file but is not one now: take it off LONG_FILES")
    for pair in sorted(set(CYCLES) - cycles_seen):
        breaches.append(f"{pair[0]} <-> {pair[1]} is listed as a cycle but is not one now: take it off CYCLES")
    for b in breaches:
        print(f"house: {b}")
    if breaches:
        sys.exit(1)
    print(f"house: every library file within {MAX_LINES} non-test lines, no import cycle, "
          f"{', '.join(PURE)} pure "
          f"(exceptions: {len(LONG_FILES)} long files, {len(CYCLES)} cycles, each issue 33's)")


def impurities():
    """A breach for each crate of PURE whose dependency tree holds a crate it must not."""
    import subprocess
    found = []
    for crate, banned in PURE.items():
        tree = subprocess.run(
            ["cargo", "tree", "-p", crate, "-e", "normal", "--prefix", "none", "--offline"],
            cwd=ROOT, capture_output=True, text=True)
        if tree.returncode != 0:
            found.append(f"cargo tree -p {crate} failed: {tree.stderr.strip()[:300]}")
            continue
        names = {line.split(" ")[0] for line in tree.stdout.splitlines() if line.strip()}
        for b in banned:
            if b in names:
                found.append(f"{crate} depends on {b}: it must stay pure (no runtime, no network, no I/O)")
    return found


if __name__ == "__main__":
    main()
