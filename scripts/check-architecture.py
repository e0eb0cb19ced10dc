#!/usr/bin/env python3
"""Architecture check of the workspace's Rust sources (crates/*/src), run by CI.

Three rules, all on non-test code (test code is an item under `#[cfg(test)]` or
`#[cfg(all(test, ...))]`, a file named tests.rs, or anything in a `tests/` folder):

1. No import cycle between the top-level modules of a crate (a file `src/x.rs` or a
   folder `src/x/` is module `x`). Module `a` uses `b` when code in `a` names
   `crate::b...` (also inside `use crate::{..., b::..., ...}`) or reaches `b` through
   `super::` from a nested module. Items the crate root brings in with a `use`
   are edges to the module they come from (`crate::Database` is a use of `db` when
   the root says `pub use db::Database`); items it defines itself are not edges. A
   cycle is listed with one source line per edge.
2. No source file over 900 non-test lines, unless one of its comment lines contains
   `architecture: one unit because` (then it is listed as allowed).
3. No function over 120 lines (from its `fn` line to its closing brace) outside tests,
   unless a comment in the lines just above it (its doc comment and attributes) contains
   `architecture: long because` (then it is listed as allowed).

Comments, strings (plain, byte and raw) and character literals are blanked out before
braces are counted or paths are read, so `"{"` or `// crate::x` change nothing.

Usage: python3 scripts/check-architecture.py [--max-file-lines N] [--max-fn-lines N]
                                             [--root DIR] [--self-test]
Exit status: 0 when every rule holds, 1 when one does not, 2 on bad usage.
Standard library only; reads files, writes nothing.
"""

import argparse
import os
import re
import sys

FILE_MARKER = "architecture: one unit because"
FN_MARKER = "architecture: long because"


# ---------------------------------------------------------------------------
# Lexing: blank out comments and literals, keep every newline where it was.


def mask(text):
    """Returns `text` with comments and the insides of string and character literals
    replaced by spaces (newlines kept), so offsets and line numbers stay valid and
    every brace, bracket and path left is code."""
    out = list(text)
    n = len(text)
    i = 0

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif c == "/" and text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c in "rb" and not _ident_char_before(text, i):
            m = re.compile(r'(?:br|r)(#*)"').match(text, i)
            if m:
                close = '"' + m.group(1)
                j = text.find(close, m.end())
                j = n if j < 0 else j + len(close)
                blank(m.end(), j - len(close))
                i = j
            elif text.startswith('b"', i):
                i = _skip_quoted(text, i + 1, blank)
            elif text.startswith("b'", i):
                i = _skip_char(text, i + 1, blank)
            else:
                i += 1
        elif c == '"':
            i = _skip_quoted(text, i, blank)
        elif c == "'":
            i = _skip_char(text, i, blank)
        else:
            i += 1
    return "".join(out)


def _ident_char_before(text, i):
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def _skip_quoted(text, i, blank):
    """`text[i]` opens a "string"; blanks its inside and returns the offset after it."""
    j = i + 1
    while j < len(text) and text[j] != '"':
        j += 2 if text[j] == "\\" else 1
    blank(i + 1, min(j, len(text)))
    return j + 1


def _skip_char(text, i, blank):
    """`text[i]` is a quote: a character literal ('x', '\\n', '\\u{..}') is blanked and
    skipped; a lifetime or label ('a) is left alone."""
    if text.startswith("\\", i + 1):
        j = text.find("'", i + 3)
        if j < 0:
            return i + 1
        blank(i + 1, j)
        return j + 1
    if i + 2 < len(text) and text[i + 2] == "'":
        blank(i + 1, i + 2)
        return i + 3
    return i + 1


def matching(code, start):
    """Offset of the bracket that closes the one at `code[start]` (code is masked), or
    len(code) if it never closes."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    stack = []
    for j in range(start, len(code)):
        c = code[j]
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")]}":
            if stack and stack[-1] == c:
                stack.pop()
            if not stack:
                return j
    return len(code)


# ---------------------------------------------------------------------------
# Test code.

TEST_ATTR = re.compile(r"#\[cfg\(\s*(?:test|all\([^\]]*\btest\b[^\]]*\))\s*\)\]")
OUTER_ATTR = re.compile(r"\s*#\[")
INNER_TEST_ATTR = re.compile(r"#!\[cfg\(\s*test\s*\)\]")


def test_spans(code):
    """(start, end) offsets of the items under a test-only `#[cfg(...)]`: from the
    attribute to the item's closing brace, or to its `;` for a `mod x;`, `use` or a
    `const`/`static` item."""
    if INNER_TEST_ATTR.search(code):
        return [(0, len(code))]
    spans = []
    for m in TEST_ATTR.finditer(code):
        if spans and m.start() < spans[-1][1]:
            continue
        j = m.end()
        # Further attributes of the same item.
        while True:
            a = OUTER_ATTR.match(code, j)
            if not a:
                break
            j = matching(code, a.end() - 1) + 1
        end = _item_end(code, j)
        spans.append((m.start(), end))
    return spans


ITEM_HEAD = re.compile(
    r"\s*(?:pub\s*(?:\([^)]*\))?\s*)?(?:(?:unsafe|async|default|extern\s*(?:\"[^\"]*\")?)\s+)*"
    r"(?:const\s+(?=fn\b))?([A-Za-z_]\w*)"
)


def _item_end(code, j):
    """End offset (exclusive) of the item (or statement) starting at `j`: its first `;`
    outside brackets for a `const`, `static`, `use`, `type`, `let` or `mod x;`, else the
    brace that closes its first block."""
    m = ITEM_HEAD.match(code, j)
    to_semicolon = bool(m) and m.group(1) in ("const", "static", "use", "type", "let")
    while j < len(code):
        c = code[j]
        if c == ";":
            return j + 1
        if c in "([" or (c == "{" and to_semicolon):
            j = matching(code, j) + 1
            continue
        if c == "{":
            return matching(code, j) + 1
        j += 1
    return len(code)


def line_starts(text):
    starts = [0]
    for k, c in enumerate(text):
        if c == "\n":
            starts.append(k + 1)
    return starts


def line_of(starts, offset):
    """1-based line number of `offset`."""
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1


def in_spans(spans, offset):
    return any(a <= offset < b for a, b in spans)


def is_test_file(rel_parts):
    return rel_parts[-1] == "tests.rs" or "tests" in rel_parts[:-1]


# ---------------------------------------------------------------------------
# The sources.


class Source:
    """One non-test source file of a crate: its text, masked code, test spans and the
    module path of its top (e.g. ["index", "tree"] for src/index/tree.rs)."""

    def __init__(self, root, crate, path):
        self.crate = crate
        self.path = path
        self.display = os.path.relpath(path, root)
        rel = os.path.relpath(path, os.path.join(root, "crates", crate, "src"))
        parts = rel.split(os.sep)
        self.parts = parts
        stem = [p for p in parts[:-1]] + [os.path.splitext(parts[-1])[0]]
        if stem[-1] == "mod" or (len(stem) == 1 and stem[0] in ("lib", "main")):
            stem = stem[:-1]
        self.module = stem
        self.top = stem[0] if stem else None
        with open(path, encoding="utf-8", errors="replace") as f:
            self.text = f.read()
        self.code = mask(self.text)
        self.spans = test_spans(self.code)
        self.starts = line_starts(self.text)
        self.lines = self.text.split("\n")
        if self.text.endswith("\n"):
            self.lines.pop()

    def line(self, offset):
        return line_of(self.starts, offset)

    def non_test_lines(self):
        test = set()
        for a, b in self.spans:
            test.update(range(self.line(a), self.line(max(a, b - 1)) + 1))
        return sum(1 for k in range(1, len(self.lines) + 1) if k not in test)


def sources(root):
    """Non-test sources by crate: {crate: [Source]} and the crate's top-level modules."""
    by_crate = {}
    crates_dir = os.path.join(root, "crates")
    for crate in sorted(os.listdir(crates_dir)):
        src = os.path.join(crates_dir, crate, "src")
        if not os.path.isdir(src):
            continue
        tops = set()
        for entry in os.listdir(src):
            full = os.path.join(src, entry)
            if entry.endswith(".rs") and entry not in ("lib.rs", "main.rs"):
                tops.add(entry[:-3])
            elif os.path.isdir(full) and entry not in ("bin", "tests"):
                tops.add(entry)
        files = []
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(dirpath, name)
                parts = os.path.relpath(path, src).split(os.sep)
                if is_test_file(parts) or parts[0] == "bin":
                    continue
                files.append(Source(root, crate, path))
        by_crate[crate] = (files, tops)
    return by_crate


# ---------------------------------------------------------------------------
# Rule 1: import cycles.

PATH_START = re.compile(r"(?<![\w$])(crate|super)\s*::")
INLINE_MOD = re.compile(r"\bmod\s+(r#)?([A-Za-z_]\w*)\s*\{")
IDENT = re.compile(r"\s*(?:r#)?([A-Za-z_]\w*)")


def inline_mods(code):
    """(start, end, name) of every `mod name { ... }` in the file."""
    out = []
    for m in INLINE_MOD.finditer(code):
        out.append((m.end() - 1, matching(code, m.end() - 1), m.group(2)))
    return out


def module_at(src, mods, offset):
    path = list(src.module)
    for a, b, name in mods:
        if a < offset < b:
            path.append(name)
    return path


def first_names(code, j):
    """The first path segments after `::` at `code[j]`: one name, or the first name of
    each element of a `{...}` group."""
    m = re.compile(r"\s*\{").match(code, j)
    if not m:
        i = IDENT.match(code, j)
        return [i.group(1)] if i else []
    close = matching(code, m.end() - 1)
    body = code[m.end() : close]
    names, depth, item = [], 0, ""
    for c in body + ",":
        if c in "{([":
            depth += 1
        elif c in "})]":
            depth -= 1
        if c == "," and depth == 0:
            i = IDENT.match(item)
            if i:
                names.append(i.group(1))
            item = ""
        else:
            item += c
    return names


def references(src):
    """(top-level module named, offset) for each path out of `crate::`/`super::` in the
    file's non-test code."""
    code = src.code
    mods = inline_mods(code)
    out = []
    for m in PATH_START.finditer(code):
        if in_spans(src.spans, m.start()):
            continue
        if m.group(1) == "crate":
            base, j = [], m.end()
        else:
            base, j = module_at(src, mods, m.start()), m.start()
            while True:
                s = re.compile(r"super\s*::\s*").match(code, j)
                if not s:
                    break
                base, j = base[:-1], s.end()
            if base:
                continue  # still inside this top-level module
        names = [n for n in first_names(code, j) if n not in ("self", "super", "crate")]
        for name in names:
            out.append((name, m.start()))
    return out


ROOT_USE = re.compile(r"\b(?:pub\s*(?:\([^)]*\))?\s*)?use\s+(?:self\s*::\s*|crate\s*::\s*)?(\w+)\s*::")


def leaf_names(code, j):
    """The names a `use` tree at `code[j]` (after `x::`) brings in: the last segment or
    the `as` alias of each leaf."""
    m = re.compile(r"\s*\{").match(code, j)
    if m:
        close = matching(code, m.end() - 1)
        names, depth, start = [], 0, m.end()
        for k in range(m.end(), close + 1):
            c = code[k]
            if c == "{":
                depth += 1
            elif c == "}" and depth:
                depth -= 1
            elif (c == "," and depth == 0) or k == close:
                element = code[start:k]
                inner = element.find("{")
                if inner >= 0:
                    names += leaf_names(code, start + inner)
                else:
                    names += leaf_names(element, 0)
                start = k + 1
        return names
    end = re.compile(r"[^;,}]*").match(code, j).end()
    words = re.findall(r"[A-Za-z_]\w*", code[j:end])
    if "as" in words[:-1]:
        return [words[-1]]
    return [words[-1]] if words and words[-1] not in ("self", "_") else []


def root_reexports(files, tops):
    """{name: module} for every item the crate root brings in with a `use` from one of
    its top-level modules, so `crate::Database` counts as a use of `db`."""
    names = {}
    for src in files:
        if src.top is not None:
            continue
        mods = inline_mods(src.code)
        for m in ROOT_USE.finditer(src.code):
            if m.group(1) not in tops or any(a < m.start() < b for a, b, _ in mods):
                continue
            for name in leaf_names(src.code, m.end()):
                names.setdefault(name, m.group(1))
    return names


def import_graph(files, tops):
    """{module: {used module: (file, line)}} of one crate."""
    graph = {t: {} for t in sorted(tops)}
    reexports = root_reexports(files, tops)
    for src in files:
        if src.top is None or src.top not in graph:
            continue
        for name, offset in references(src):
            used = name if name in tops else reexports.get(name)
            if used is not None and used != src.top:
                graph[src.top].setdefault(used, (src.display, src.line(offset)))
    return graph


def strongly_connected(graph):
    """Components of more than one module (Tarjan), each sorted, iteratively."""
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return sorted(comps)


def shortest_cycle(graph, comp):
    """One shortest cycle through the first module of `comp`, as a list of modules."""
    start = comp[0]
    members = set(comp)
    prev = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


# ---------------------------------------------------------------------------
# Rules 2 and 3: big files, long functions.

FN = re.compile(r"\bfn\s+(?:r#)?([A-Za-z_]\w*)")


def functions(src):
    """(name, first line, line count) of every function with a body in non-test code."""
    code = src.code
    out = []
    for m in FN.finditer(code):
        if in_spans(src.spans, m.start()):
            continue
        j = m.end()
        while j < len(code):
            c = code[j]
            if c == ";":
                j = -1  # a declaration without a body
                break
            if c in "([":
                j = matching(code, j) + 1
                continue
            if c == "{":
                break
            j += 1
        if j < 0 or j >= len(code):
            continue
        first = src.line(m.start())
        last = src.line(matching(code, j))
        out.append((m.group(1), first, last - first + 1))
    return out


def marked_above(src, line, marker):
    """Whether `marker` is in a comment on the `fn` line or in the comments and
    attributes right above it (up to a blank line or the end of the code before)."""
    if marker in src.lines[line - 1]:
        return True
    k = line - 1
    while k >= 1:
        text = src.lines[k - 1].strip()
        if text.startswith("//"):
            if marker in text:
                return True
        elif not text or text.endswith((";", "{", "}")):
            break
        k -= 1
    return False


def file_marked(src):
    for text in src.lines:
        stripped = text.strip()
        if stripped.startswith("//") and FILE_MARKER in stripped:
            return True
    return False


# ---------------------------------------------------------------------------


def check(root, max_file_lines, max_fn_lines):
    by_crate = sources(root)
    cycles, big, big_allowed, long_fns, long_allowed = [], [], [], [], []
    files_seen = fns_seen = 0
    for crate, (files, tops) in by_crate.items():
        graph = import_graph(files, tops)
        for comp in strongly_connected(graph):
            cycle = shortest_cycle(graph, comp)
            edges = [
                (a, b, graph[a][b]) for a in comp for b in sorted(graph[a]) if b in comp
            ]
            cycles.append((crate, comp, cycle, edges))
        for src in files:
            files_seen += 1
            n = src.non_test_lines()
            if n > max_file_lines:
                (big_allowed if file_marked(src) else big).append((n, src.display))
            for name, first, count in functions(src):
                fns_seen += 1
                if count > max_fn_lines:
                    entry = (count, f"{src.display}:{first}", name)
                    if marked_above(src, first, FN_MARKER):
                        long_allowed.append(entry)
                    else:
                        long_fns.append(entry)

    print(
        f"architecture check: {len(by_crate)} crates, {files_seen} non-test source files, "
        f"{fns_seen} functions"
    )
    print(f"import cycles between top-level modules: {len(cycles)}")
    for crate, comp, cycle, edges in cycles:
        print(f"  {crate}: {' -> '.join(cycle)}  (all of: {', '.join(comp)})")
        for a, b, (path, line) in edges:
            print(f"      {a} -> {b}  {path}:{line}")
    print(
        f"files over {max_file_lines} non-test lines: {len(big)}"
        + (f" (and {len(big_allowed)} allowed)" if big_allowed else "")
    )
    for n, path in sorted(big, reverse=True):
        print(f"  {path}: {n}")
    for n, path in sorted(big_allowed, reverse=True):
        print(f"  allowed ({FILE_MARKER} ...): {path}: {n}")
    print(
        f"functions over {max_fn_lines} lines outside tests: {len(long_fns)}"
        + (f" (and {len(long_allowed)} allowed)" if long_allowed else "")
    )
    for count, where, name in sorted(long_fns, reverse=True):
        print(f"  {where} fn {name}: {count}")
    for count, where, name in sorted(long_allowed, reverse=True):
        print(f"  allowed ({FN_MARKER} ...): {where} fn {name}: {count}")
    failed = bool(cycles or big or long_fns)
    print("architecture check " + ("FAILED" if failed else "passed"))
    return 1 if failed else 0


# ---------------------------------------------------------------------------
# Self-test of the lexer and the parsers on small snippets.


def self_test():
    code = mask('let s = "{ // }"; let c = \'{\'; let l: &\'a str; /* { /* } */ */ x\n')
    assert code.count("{") == 0 and code.count("}") == 0, code
    assert "'a" in code and "x" in code, code
    code = mask('let r = r#"a " { "#; let b = b"}"; let e = \'\\\'\'; y')
    assert "{" not in code and "}" not in code and code.rstrip().endswith("y"), code
    code = mask("fn f() {\n    // }\n    g('}');\n}\n")
    assert matching(code, code.index("{")) == len(code) - 2
    spans = test_spans(mask("a\n#[cfg(test)]\nmod tests;\nb\n#[cfg(test)]\n#[derive(X)]\nconst C: [u8; 2] = [1, 2];\nc\n"))
    assert len(spans) == 2
    code = "use crate::{a::{x, y}, b, self};\nfn f() { crate::c::g(); }\n"
    assert first_names(code, code.index("::") + 2) == ["a", "b", "self"]
    code = "pub use db::{Database, Options as Opts, inner::{A, b::C}};\npub use x::Y;\n"
    assert leaf_names(code, code.index("::") + 2) == ["Database", "Opts", "A", "C"]

    class Fake:
        module = ["region"]
        spans = []

    fake = Fake()
    fake.code = mask("use super::gc::Pass;\nmod r {\n    fn f() { super::log::g(); super::super::x(); }\n}\n")
    assert [n for n, _ in references(fake)] == ["gc", "x"], references(fake)
    fake.code = mask("fn f() {}\n#[cfg(test)]\nfn g() { crate::a::b(); }\nfn h() { crate::c(); }\n")
    fake.spans = test_spans(fake.code)
    assert [n for n, _ in references(fake)] == ["c"], references(fake)
    print("self-test passed")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-file-lines", type=int, default=900)
    parser.add_argument("--max-fn-lines", type=int, default=120)
    parser.add_argument(
        "--root",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
        help="the workspace (default: this script's parent folder)",
    )
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    root = os.path.normpath(args.root)
    if not os.path.isdir(os.path.join(root, "crates")):
        print(f"no crates/ folder in {root}", file=sys.stderr)
        return 2
    return check(root, args.max_file_lines, args.max_fn_lines)


if __name__ == "__main__":
    sys.exit(main())
