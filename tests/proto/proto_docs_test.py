#!/usr/bin/env python3
"""Every service, method, message, field, oneof, enum and enum value in
proto/*.proto carries a comment (a leading or trailing one, as protoc records
them): the protos are the API's documentation for clients in any language.

Usage: proto_docs_test.py --protoc PROTOC --source-dir REPO
Prints each undocumented element and exits 1 when there is one.
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

from google.protobuf import descriptor_pb2

# Field numbers of FileDescriptorProto, DescriptorProto, ... that form
# SourceCodeInfo paths.
FILE_MESSAGE, FILE_ENUM, FILE_SERVICE = 4, 5, 6
MESSAGE_FIELD, MESSAGE_NESTED, MESSAGE_ENUM, MESSAGE_ONEOF = 2, 3, 4, 8
ENUM_VALUE, SERVICE_METHOD = 2, 2


def elements(file):
    """(path, description) for every element that needs a comment."""
    def enum(e, path, scope):
        yield path, f"enum {scope}{e.name}"
        for i, v in enumerate(e.value):
            yield path + [ENUM_VALUE, i], f"enum value {scope}{e.name}.{v.name}"

    def message(m, path, scope):
        name = f"{scope}{m.name}"
        yield path, f"message {name}"
        for i, f in enumerate(m.field):
            yield path + [MESSAGE_FIELD, i], f"field {name}.{f.name}"
        for i, o in enumerate(m.oneof_decl):
            # proto3 `optional` fields make synthetic oneofs with no source of their own.
            if not o.name.startswith("_"):
                yield path + [MESSAGE_ONEOF, i], f"oneof {name}.{o.name}"
        for i, n in enumerate(m.nested_type):
            if not n.options.map_entry:
                yield from message(n, path + [MESSAGE_NESTED, i], name + ".")
        for i, e in enumerate(m.enum_type):
            yield from enum(e, path + [MESSAGE_ENUM, i], name + ".")

    package = file.package + "."
    for i, m in enumerate(file.message_type):
        yield from message(m, [FILE_MESSAGE, i], package)
    for i, e in enumerate(file.enum_type):
        yield from enum(e, [FILE_ENUM, i], package)
    for i, s in enumerate(file.service):
        yield [FILE_SERVICE, i], f"service {package}{s.name}"
        for j, method in enumerate(s.method):
            yield [FILE_SERVICE, i, SERVICE_METHOD, j], f"rpc {package}{s.name}.{method.name}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--protoc", required=True)
    parser.add_argument("--source-dir", required=True, type=pathlib.Path)
    args = parser.parse_args()
    protos = sorted(str(p.relative_to(args.source_dir)) for p in (args.source_dir / "proto").glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "set.pb"
        subprocess.run([args.protoc, f"-I{args.source_dir}", "--include_source_info",
                        f"--descriptor_set_out={out}", *protos], check=True)
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    missing, total = [], 0
    for file in files:
        comments = {tuple(loc.path): (loc.leading_comments + loc.trailing_comments).strip()
                    for loc in file.source_code_info.location}
        for path, what in elements(file):
            total += 1
            if not comments.get(tuple(path)):
                missing.append(f"{file.name}: {what}")
    print(f"{total - len(missing)} of {total} elements documented in {len(files)} files")
    for m in missing:
        print("undocumented:", m)
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
