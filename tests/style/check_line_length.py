#!/usr/bin/env python3
"""Fails listing every line of hyflow's C++/CUDA sources that is longer than .clang-format's
ColumnLimit, so the code and the formatter's settings cannot drift apart.
Usage: check_line_length.py <source dir>"""
import pathlib
import re
import subprocess
import sys

root = pathlib.Path(sys.argv[1])
match = re.search(r"^ColumnLimit:\s*(\d+)", (root / ".clang-format").read_text(), re.M)
if not match:
    sys.exit(f"no ColumnLimit in {root / '.clang-format'}")
limit = int(match.group(1))
tracked = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout.split()
sources = [p for p in tracked if p.endswith((".cpp", ".hpp", ".cu", ".cuh"))]
long_lines = []
for rel in sources:
    path = root / rel
    if not path.exists():
        continue
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if len(line) > limit:
            long_lines.append(f"  {rel}:{number}: {len(line)} columns")
if long_lines:
    sys.exit(f"{len(long_lines)} line(s) exceed .clang-format's ColumnLimit of {limit}:\n" + "\n".join(long_lines))
print(f"line length: {len(sources)} files within {limit} columns")
