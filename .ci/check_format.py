#!/usr/bin/env python3
"""Checks the formatting of every C++ and CUDA line changed since a base commit.

The tree predates its formatting check, so whole files are not held to
.clang-format: only the lines added or changed since the commit in
.ci/format_base (moved files count by their changed lines only, through git's
rename detection). Each such line range goes to `clang-format --dry-run
-Werror --lines`; exits 1 with clang-format's findings when any range is off.
  .ci/check_format.py [--base REV]
"""
import os
import re
import subprocess
import sys

EXTENSIONS = ("*.cc", "*.h", "*.cu", "*.cuh")
HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


def changed_ranges(base):
    diff = subprocess.run(
        ["git", "diff", "-M", "--diff-filter=AMR", "-U0", "--no-color", "--no-ext-diff", base,
         "--", *EXTENSIONS], check=True, capture_output=True, text=True).stdout
    ranges, path = {}, None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[len("+++ b/"):] if line.startswith("+++ b/") else None
        elif path and (match := HUNK.match(line)):
            start, count = int(match.group(1)), int(match.group(2) or "1")
            if count > 0:
                ranges.setdefault(path, []).append((start, start + count - 1))
    return ranges


def main():
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                          capture_output=True, text=True).stdout.strip()
    os.chdir(root)
    if len(sys.argv) == 3 and sys.argv[1] == "--base":
        base = sys.argv[2]
    else:
        with open(".ci/format_base", encoding="utf-8") as f:
            base = f.read().split()[0]
    if subprocess.run(["git", "cat-file", "-e", base + "^{commit}"],
                      capture_output=True).returncode != 0:
        print(f"check_format: base commit {base} is not in this clone (fetch full history)")
        return 2
    failed = []
    for path, ranges in sorted(changed_ranges(base).items()):
        lines = [f"--lines={start}:{end}" for start, end in ranges]
        result = subprocess.run(["clang-format", "--dry-run", "-Werror", *lines, path],
                                capture_output=True, text=True)
        if result.returncode != 0:
            failed.append(path)
            sys.stdout.write(result.stderr)
    if failed:
        print(f"check_format: {len(failed)} file(s) with changed lines off .clang-format; "
              "`git clang-format " + base[:12] + "` fixes them")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
