#!/usr/bin/env python3
"""Checks that every path and symbol a README names in `backticks` exists.

A name with a slash or a file extension is a path: it must exist relative to
the README's folder, the repository root or a folder between them, or end a
tracked path (`schema_corpus/generate_corpus.js`); brace lists such as
`cli/gpu_assignment.{h,cc}` are expanded, and a path whose last part names a
CMake target (`engine/engine_test`) is that target. A CamelCase name
(`FakeCommunicator`, `Scheduler::Step`) is a symbol: it must appear as a word
in a tracked source file. Commands, flags, URLs, JSON pointers, npm packages,
placeholders in capitals and values are left alone; names that live outside
the tree (build outputs, a checkpoint's files, a file the reader writes) are
listed in .ci/readme_names_outside_tree.txt.
Exits 1 listing README:line: name for each one that is missing.
  .ci/check_readmes.py [ROOT]
"""
import os
import re
import subprocess
import sys

SOURCE_EXTENSIONS = (".cc", ".h", ".cu", ".cuh", ".py", ".js", ".proto", ".sh", ".cmake",
                     ".txt", ".yaml", ".yml", ".json", ".md", ".in", ".toml", ".ts")
PATH_EXTENSIONS = SOURCE_EXTENSIONS + (".cfg", ".ranks", ".tsv", ".bin", ".safetensors")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
SYMBOL = re.compile(r"^(?:[A-Z][a-z0-9]+){2,}[A-Za-z0-9]*(?:::[A-Za-z_][A-Za-z0-9_]*)*(?:\(\))?$")
# Things in backticks that are not ours to find: URLs, routes, flags, shell,
# environment variables, model specs, globs and placeholders.
NOT_A_NAME = re.compile(r"(://|^/|^-|^\$|^#|^@|^~|\s|[*<>=?|,;:]|^\.[a-z]+$|^\.\.?/?$|\b[A-Z]{3,}\b)")


def tracked_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard"],
                         check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if line and os.path.lexists(os.path.join(root, line))]


def expand_braces(name):
    match = re.search(r"\{([^{}]*)\}", name)
    if not match:
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    return [expanded for part in match.group(1).split(",")
            for expanded in expand_braces(head + part + tail)]


def is_path(name):
    base = name.rstrip("/")
    return "/" in base or base.endswith(PATH_EXTENSIONS)


def path_exists(root, readme_dir, name, files, dirs):
    name = name.rstrip("/")
    folder = readme_dir
    while True:
        candidate = os.path.normpath(os.path.join(folder, name))
        if candidate in files or candidate in dirs:
            return True
        if folder in ("", "."):
            break
        folder = os.path.dirname(folder)
    suffix = "/" + name
    return any(path.endswith(suffix) for path in files | dirs)


def symbol_pattern(name):
    last = name.rstrip("()").split("::")[-1]
    return re.compile(r"\b" + re.escape(last) + r"\b")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = set(tracked_files(root))
    dirs = {os.path.dirname(path) for path in files}
    for path in list(dirs):
        while path:
            path = os.path.dirname(path)
            dirs.add(path)
    sources = {}
    for path in files:
        if path.endswith(SOURCE_EXTENSIONS) and not path.endswith(".md"):
            try:
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                    sources[path] = f.read()
            except OSError:
                pass
    corpus = "\n".join(sources.values())
    targets = set(re.findall(r"[A-Za-z0-9_.+-]+", "\n".join(
        text for path, text in sources.items()
        if path.endswith(("CMakeLists.txt", ".cmake")))))
    with open(os.path.join(root, ".ci", "readme_names_outside_tree.txt"), encoding="utf-8") as f:
        outside = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    missing = []
    for readme in sorted(path for path in files if os.path.basename(path) == "README.md"):
        readme_dir = os.path.dirname(readme)
        with open(os.path.join(root, readme), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                for name in CODE_SPAN.findall(line):
                    name = name.strip()
                    if name in outside:
                        continue
                    if NOT_A_NAME.search(name.replace(",", "") if "{" in name else name):
                        continue
                    if is_path(name):
                        if not all(path_exists(root, readme_dir, each, files, dirs) or
                                   ("." not in os.path.basename(each) and
                                    os.path.basename(each.rstrip("/")) in targets)
                                   for each in expand_braces(name)):
                            missing.append(f"{readme}:{number}: path `{name}` does not exist")
                    elif SYMBOL.match(name) and not symbol_pattern(name).search(corpus):
                        missing.append(f"{readme}:{number}: symbol `{name}` is in no source file")
    for line in missing:
        print(line)
    if missing:
        print(f"check_readmes: {len(missing)} name(s) in READMEs that the tree does not have")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
