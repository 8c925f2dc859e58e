#!/usr/bin/env python3
"""Builds the importable flotilla_client package: copies the package sources
into OUT/flotilla_client and generates its gRPC stubs into
OUT/flotilla_client/_pb with protoc and grpc_python_plugin.

The protos import each other as "proto/NAME.proto", so protoc writes
`from proto import NAME_pb2`; those imports are rewritten to the package's
own (`from . import NAME_pb2`), leaving no top-level `proto` package.

Usage: build_package.py --source-dir REPO --out DIR [--protoc P] [--grpc-plugin P]
"""
import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

# The client API, the shared messages it uses, and the admin API.
SERVICE_PROTOS = ["proto/common.proto", "proto/flotilla.proto", "proto/cluster.proto", "proto/admin.proto",
                  "proto/grpc_reflection_v1.proto"]
# Messages only (no grpc stubs needed).
SDK_PROTOS = ["grpc_reflection_v1alpha.proto"]


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"build_package: {' '.join(cmd)} failed:\n{result.stderr}")


def rewrite_imports(pb_dir):
    pattern = re.compile(r"^from proto import (\w+)", re.MULTILINE)
    for path in pb_dir.glob("*.py"):
        text = path.read_text()
        path.write_text(pattern.sub(r"from . import \1", text))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-dir", required=True, type=pathlib.Path)
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--protoc", default=shutil.which("protoc") or "protoc")
    parser.add_argument("--grpc-plugin", default=shutil.which("grpc_python_plugin") or "grpc_python_plugin")
    args = parser.parse_args()

    sdk_dir = args.source_dir / "sdk" / "python"
    package = args.out / "flotilla_client"
    with tempfile.TemporaryDirectory(dir=args.out.parent if args.out.parent.exists() else None) as tmp:
        staged = pathlib.Path(tmp) / "flotilla_client"
        shutil.copytree(sdk_dir / "flotilla_client", staged,
                        ignore=shutil.ignore_patterns("__pycache__", "_pb"))
        generated = pathlib.Path(tmp) / "generated"
        generated.mkdir()
        run([args.protoc, f"-I{args.source_dir}", f"--python_out={generated}", f"--grpc_out={generated}",
             f"--plugin=protoc-gen-grpc={args.grpc_plugin}", *SERVICE_PROTOS])
        run([args.protoc, f"-I{sdk_dir / 'protos'}", f"--python_out={generated / 'proto'}", *SDK_PROTOS])
        pb_dir = staged / "_pb"
        shutil.move(str(generated / "proto"), pb_dir)
        (pb_dir / "__init__.py").write_text('"""Generated protobuf and gRPC modules (do not edit)."""\n')
        rewrite_imports(pb_dir)
        args.out.mkdir(parents=True, exist_ok=True)
        if package.exists():
            shutil.rmtree(package)
        shutil.move(str(staged), package)


if __name__ == "__main__":
    main()
