#!/usr/bin/env python3
"""The code blocks in docs/*.md that show a tutorial's code must be that code, taken by markers.

In a file under examples/, a snippet is the lines between two marker lines with the same NAME:

    // [snippet NAME]
    ...the lines...
    // [snippet NAME]

Marker lines are not part of any snippet; snippets may nest or overlap; a NAME is used once per
file. A snippet's text is its lines with their common leading indentation removed.

In docs/*.md, a marker line directly followed by a fenced C++ block:

    <!-- snippet: examples/PATH#NAME -->
    ```cpp
    ...the snippet's text, exactly...
    ```

A diff between two files under examples/ (a trainer before and after adoption) is shown the same
way, with the count of lines it adds and removes, both checked:

    <!-- diff: examples/BEFORE examples/AFTER, N lines changed -->
    ```diff
    ...their unified diff (one line of context), exactly...
    ```

Usage (Python 3 standard library only):

    docs_snippets.py SOURCE_ROOT           check every docs marker: one line per block ('ok ...', or
                                           'FAIL ...' with a unified diff), then 'N passed, M failed';
                                           exit 1 on any failure
    docs_snippets.py SOURCE_ROOT --write   the same, but a block that differs is rewritten from its
                                           source ('wrote ...') instead of failing

A marker in examples/ opened but never closed, or whose NAME is used again in the file, fails too,
and so does a docs marker that names a missing file or snippet, or has no ```cpp block after it.
"""
import difflib
import pathlib
import re
import sys
import textwrap

SOURCE_MARKER = re.compile(r"^\s*// \[snippet ([\w.-]+)\]\s*$")
DOCS_MARKER = re.compile(r"^<!-- snippet: (examples/[^#\s]+)#([\w.-]+) -->$")
DIFF_MARKER = re.compile(r"^<!-- diff: (examples/\S+) (examples/\S+), (\d+) lines changed -->$")


def diff_of(root, before, after):
    """The unified diff (one line of context) of two files, and how many lines it adds and removes."""
    a, b = ((root / p).read_text(encoding="utf-8").splitlines() for p in (before, after))
    lines = list(difflib.unified_diff(a, b, before, after, lineterm="", n=1))
    changed = sum(1 for l in lines if l[:1] in "+-" and not l.startswith(("+++", "---")))
    return lines, changed
SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp"}


def read_snippets(root, failures):
    """{(path, name): text} for every snippet under examples/; marker errors go to `failures`."""
    snippets = {}
    for path in sorted((root / "examples").rglob("*")):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        opened, closed = {}, set()  # name -> (first line, its lines); names already closed
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = SOURCE_MARKER.match(line)
            if not m:
                for _, lines in opened.values():
                    lines.append(line)
            elif m[1] in opened:
                snippets[rel, m[1]] = textwrap.dedent("".join(l + "\n" for l in opened.pop(m[1])[1]))
                closed.add(m[1])
            elif m[1] in closed:
                failures.append(f"{rel}:{n}: snippet {m[1]} is used again (a NAME marks one snippet per file)")
            else:
                opened[m[1]] = (n, [])
        failures += [f"{rel}:{first}: snippet {name} is opened but never closed" for name, (first, _) in opened.items()]
    return snippets


def check_doc(doc, root, snippets, write, report):
    """Checks (or rewrites) the marked blocks of one docs file; report(ok, text) counts each."""
    rel = doc.relative_to(root).as_posix()
    lines, out, i = doc.read_text(encoding="utf-8").split("\n"), [], 0
    while i < len(lines):
        out.append(lines[i])
        m = DOCS_MARKER.match(lines[i].strip())
        d = DIFF_MARKER.match(lines[i].strip())
        i += 1
        if d:
            where = f"{rel}:{i} diff {d[1]} {d[2]}"
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            if i >= len(lines) or lines[i].strip() != "```diff" or end is None:
                report(False, f"FAIL {where}: the marker is not directly followed by a ```diff ... ``` block")
                continue
            if not all((root / p).is_file() for p in (d[1], d[2])):
                report(False, f"FAIL {where}: no such file")
                continue
            want, changed = diff_of(root, d[1], d[2])
            if int(d[3]) != changed:
                report(False, f"FAIL {where}: the marker says {d[3]} lines changed, the diff has {changed}")
            elif lines[i + 1:end] == want:
                report(True, f"ok {where}")
            elif write:
                report(True, f"wrote {where}")
            else:
                report(False, f"FAIL {where}: the block differs from the diff of the two files")
            out += [lines[i]] + want + [lines[end]]
            i = end + 1
            continue
        if not m:
            continue
        where = f"{rel}:{i} {m[1]}#{m[2]}"
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if i >= len(lines) or lines[i].strip() != "```cpp" or end is None:
            report(False, f"FAIL {where}: the marker is not directly followed by a ```cpp ... ``` block")
            continue
        if (m[1], m[2]) not in snippets:
            what = "no such file" if not (root / m[1]).is_file() else f"no snippet '{m[2]}' in it"
            report(False, f"FAIL {where}: {what}")
            continue
        have, want = lines[i + 1:end], snippets[m[1], m[2]].splitlines()
        if have == want:
            report(True, f"ok {where}")
        elif write:
            report(True, f"wrote {where}")
        else:
            diff = difflib.unified_diff(have, want, f"{rel}:{i + 2} (the block)", f"{m[1]}#{m[2]} (the source)", lineterm="")
            report(False, f"FAIL {where}: the block differs from the source\n" + "\n".join("    " + d for d in diff))
        out += [lines[i]] + want + [lines[end]]
        i = end + 1
    if write and out != lines:
        doc.write_text("\n".join(out), encoding="utf-8")


def main(argv):
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "--write"):
        sys.exit(__doc__)
    root, write = pathlib.Path(argv[1]).resolve(), len(argv) == 3
    counts = {True: 0, False: 0}

    def report(ok, text):
        counts[ok] += 1
        print(text)

    failures = []
    snippets = read_snippets(root, failures)
    for failure in failures:
        report(False, f"FAIL {failure}")
    for doc in sorted((root / "docs").glob("*.md")):
        check_doc(doc, root, snippets, write, report)
    print(f"{counts[True]} passed, {counts[False]} failed")
    return 1 if counts[False] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
