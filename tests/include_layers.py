#!/usr/bin/env python3
"""The house has no arrow running back up: every header under include/capscope/ includes only
headers of its own room or of a room below it, in the order of ROOMS (README.md's layout table).

usage: include_layers.py INCLUDE_DIR
Prints each upward include (file, line, the two rooms) and fails on any; a header in a room the
table does not name fails too, so a new room must be placed in the order before it lands.
"""
import pathlib
import re
import sys

# Lowest first. A top-level header is its own room where it is not an umbrella; umbrellas are last.
ROOMS = [
    ["detail", "version.hpp"],
    ["vocabulary"],
    ["cuda"],
    ["rules", "validate.hpp", "describe.hpp"],
    ["config", "config.hpp"],
    ["pipeline", "pipeline.hpp"],
    ["flags", "emit_cpp.hpp"],
    ["stage"],
    ["plan"],
    ["hooks"],
    ["offload"],
    ["run"],
    ["parallel"],
    ["compose"],
    ["capscope.hpp", "cuda.hpp", "plan.hpp", "hooks.hpp", "offload.hpp", "engine.hpp", "compose.hpp"],
]
RANK = {name: rank for rank, names in enumerate(ROOMS) for name in names}
INCLUDE = re.compile(r'^\s*#\s*include\s*<capscope/([^>]+)>')


def room(relative):
    """The room of a path relative to include/capscope/: its directory, or the file at the top."""
    return relative.split("/", 1)[0]


def main():
    top = pathlib.Path(sys.argv[1]) / "capscope"
    problems, arrows = [], 0
    for header in sorted(top.rglob("*.hpp")):
        mine = room(header.relative_to(top).as_posix())
        if mine not in RANK:
            problems.append(f"{header}: room '{mine}' is not in tests/include_layers.py's ROOMS -- fix: place it in the order")
            continue
        for number, line in enumerate(header.read_text().splitlines(), start=1):
            match = INCLUDE.match(line)
            if not match:
                continue
            theirs = room(match.group(1))
            arrows += 1
            if theirs not in RANK:
                problems.append(f"{header}:{number}: includes <capscope/{match.group(1)}>, whose room '{theirs}' is not in ROOMS")
            elif RANK[theirs] > RANK[mine]:
                problems.append(f"{header}:{number}: {mine}/ includes <capscope/{match.group(1)}> from {theirs}/, a room above it "
                                f"(the order is {' < '.join('/'.join(r) for r in ROOMS)})")
    for p in problems:
        print("FAIL", p)
    print(f"{arrows} includes between capscope's headers checked: {arrows - len(problems)} passed, {len(problems)} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
