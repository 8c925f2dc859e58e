#!/usr/bin/env python3
"""The container image's files, without building a container: lays out the
staging tree with deploy/image/stage.sh from the programs already built, and
runs `flotilla up` from it as an unprivileged user whose only writable place
is a fresh home directory (as the image's user runs it), then asks it one
chat completion and stops it with SIGTERM.

Usage: image_staging_test.py --source-dir DIR --build-dir DIR
"""
import argparse
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request

SHIPPED = {"flotilla", "flotilla-coordinator", "flotilla-worker", "flotillactl",
           "flotilla-pod-workers"}
START_TIMEOUT_S = 240


def stage(source_dir, build_dir, root):
    subprocess.run([os.path.join(source_dir, "deploy/image/stage.sh"), root, build_dir],
                   check=True)
    bin_dir = os.path.join(root, "opt/flotilla/bin")
    programs = set(os.listdir(bin_dir))
    if programs != SHIPPED:
        sys.exit(f"staged programs {sorted(programs)}, expected {sorted(SHIPPED)}")
    ranks = os.path.join(root, "opt/flotilla/share/flotilla/o200k_base.ranks")
    if not os.path.isfile(ranks):
        sys.exit("no tokenizer data in the staging tree")
    return bin_dir


def as_unprivileged(argv, home):
    """argv run as `nobody` when this test runs as root (else as this user),
    with HOME the fresh directory it may write and nothing else of the
    environment."""
    env = {"HOME": home, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if os.geteuid() != 0:
        return argv, env
    nobody = pwd.getpwnam("nobody")
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
            "--"] + argv, env


class Up:
    """`flotilla up` from the staging tree; its HTTP address once it serves."""

    def __init__(self, bin_dir, home):
        argv, env = as_unprivileged(
            [os.path.join(bin_dir, "flotilla"), "up", "--workers", "1", "--threads-per-worker", "1",
             "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"], home)
        self.process = subprocess.Popen(argv, env=env, cwd=home, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.output = []
        self.http = None
        ready = threading.Event()
        self.reader = threading.Thread(target=self._read, args=(ready,), daemon=True)
        self.reader.start()
        if not ready.wait(START_TIMEOUT_S) or self.http is None:
            self.stop()
            sys.exit("flotilla up did not serve:\n" + "".join(self.output))

    def _read(self, ready):
        for line in self.process.stdout:
            self.output.append(line)
            if m := re.search(r"OpenAI-compatible API: http://(\S+)/v1", line):
                self.http = m.group(1)
                ready.set()
        ready.set()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def post_json(http, path, body):
    request = urllib.request.Request(f"http://{http}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, json.loads(response.read())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--build-dir", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="flotilla-image-")
    try:
        os.chmod(work, 0o755)  # the unprivileged user reads the staged programs
        bin_dir = stage(args.source_dir, args.build_dir, os.path.join(work, "root"))
        home = os.path.join(work, "home")
        os.mkdir(home, 0o700)
        up = Up(bin_dir, home)
        try:
            with urllib.request.urlopen(f"http://{up.http}/v1/models", timeout=30) as response:
                model = json.loads(response.read())["data"][0]["id"]
            status, answer = post_json(up.http, "/v1/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
            if status != 200 or answer["choices"][0]["finish_reason"] not in ("stop", "length"):
                sys.exit(f"unexpected answer {status}: {answer}")
        finally:
            code = up.stop()
            up.reader.join(10)
        if code != 0:
            sys.exit(f"flotilla up exited with {code} on SIGTERM:\n" + "".join(up.output))
        # The built-in model was cached in the unprivileged user's home.
        cache = os.path.join(home, ".cache", "flotilla")
        if not os.path.isdir(cache) or not os.listdir(cache):
            sys.exit(f"nothing cached under {cache}")
        if os.geteuid() == 0 and os.stat(cache).st_uid != pwd.getpwnam("nobody").pw_uid:
            sys.exit(f"{cache} was not written by the unprivileged user")
        print("image staging tree: flotilla up served as an unprivileged user; ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
