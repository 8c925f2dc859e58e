"""What an operator reads from `flotilla up`, run as its users run it.

    up_signals_test.py --bin-dir DIR --python-dir DIR json-logs
                                                  every line of `up --log-format json`
                                                  (its own, the children's) is JSON,
                                                  through requests and a stop; a gRPC
                                                  call past its deadline is logged and
                                                  counted as a deadline, not a cancel
    up_signals_test.py --bin-dir DIR promtool     /metrics after traffic passes
                                                  `promtool check metrics`
                                                  (exit 77, skipped, without promtool)
    up_signals_test.py --bin-dir DIR tls-try      under TLS, both "try:" lines up
                                                  prints work as printed (exit 77
                                                  without openssl or curl)
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SKIP = 77


class Up:
    """`flotilla up` with the given flags; its stdout lines as they come."""

    def __init__(self, bin_dir, flags, banner_done):
        self.process = subprocess.Popen(
            [os.path.join(bin_dir, "flotilla"), "up", "--workers", "1", "--threads-per-worker",
             "1", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"] + flags,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stdout, self.stderr = [], []
        ready = threading.Event()

        def read_stdout():
            for line in self.process.stdout:
                self.stdout.append(line)
                if banner_done(line):
                    ready.set()
            ready.set()

        def read_stderr():
            for line in self.process.stderr:
                self.stderr.append(line)

        self.readers = [threading.Thread(target=read_stdout, daemon=True),
                        threading.Thread(target=read_stderr, daemon=True)]
        for r in self.readers:
            r.start()
        if not ready.wait(240) or self.process.poll() is not None:
            self.stop()
            raise AssertionError("flotilla up did not start:\n" + "".join(self.stdout + self.stderr))

    def stop(self):
        """Ctrl-C, as a user stops it; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            rc = self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            rc = self.process.wait()
        for r in self.readers:
            r.join(10)
        return rc


def get_text(url):
    with urllib.request.urlopen(url, timeout=60) as answer:
        return answer.read().decode()


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def expire_a_grpc_call(address, python_dir):
    """A gRPC Chat (the Python SDK) whose 0.5 s deadline passes mid-generation."""
    sys.path.insert(0, python_dir)
    import grpc
    import flotilla_client
    with flotilla_client.Client(address, timeout=120) as client:
        try:
            client.chat([{"role": "user", "content": "Tell a long story."}], timeout=0.5,
                        temperature=1.0, max_tokens=0, stop_token_ids=()).collect()
            raise AssertionError("a 0.5 s deadline expired")
        except flotilla_client.FlotillaError as e:
            check(e.code == grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline: {e.code.name}")


def finished(metrics, reason):
    """flotilla_requests_finished_total for `reason` in a /metrics scrape."""
    m = re.search(r'\nflotilla_requests_finished_total\{[^}]*finished_reason="' + reason +
                  r'"\} ([0-9.e+]+)', metrics)
    return float(m.group(1)) if m else 0.0


def json_logs(bin_dir, python_dir):
    origin = "http://localhost:3000"
    up = Up(bin_dir, ["--log-format", "json", "--allowed-origins", origin],
            lambda line: '"serving"' in line)
    banner = json.loads(up.stdout[0])
    check(banner["msg"] == "serving", f"banner: {banner}")
    # As a web page at `origin` calls it: up passed --allowed-origins on.
    request = urllib.request.Request(
        banner["openai_api"] + "/chat/completions",
        data=json.dumps({"model": banner["model_id"], "max_tokens": 4,
                         "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Content-Type": "application/json", "Origin": origin})
    with urllib.request.urlopen(request, timeout=120) as reply:
        answer = json.loads(reply.read())
        check(reply.status == 200 and answer["choices"], f"chat answer: {answer}")
        check(reply.headers.get("Access-Control-Allow-Origin") == origin,
              f"no CORS header for {origin}: {dict(reply.headers)}")
    expire_a_grpc_call(banner["address"], python_dir)
    metrics = ""
    for _ in range(100):  # the session ends as the deadline passes; the count follows
        metrics = get_text(banner["openai_api"][:-len("/v1")] + "/metrics")
        if finished(metrics, "deadline") >= 1:
            break
        time.sleep(0.1)
    check(finished(metrics, "deadline") == 1 and finished(metrics, "cancelled") == 0,
          "the expired call counts as a deadline: " +
          " ".join(l for l in metrics.splitlines() if "finished_total{" in l))
    rc = up.stop()
    check(rc == 0, f"up exit code {rc}")
    lines = up.stdout + up.stderr
    parsed = []
    for number, line in enumerate(lines, 1):
        try:
            parsed.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"line {number} is not JSON: {line!r}")
        check(isinstance(parsed[-1], dict), f"line {number} is not an object: {line!r}")
    processes = {p.get("process") for p in parsed}
    check({"up", "coordinator", "worker-0"} <= processes, f"processes seen: {processes}")
    check(any(p.get("msg") == "access" for p in parsed),
          "no access log line:\n" + "".join(lines))
    grpc_chats = [p for p in parsed if p.get("msg") == "access" and p.get("api") == "grpc Chat"]
    check(len(grpc_chats) == 1 and grpc_chats[0].get("finish_reason") == "deadline",
          f"the expired gRPC call's access line: {grpc_chats}")
    check(any(p.get("process") == "up" and p["msg"] == "stopped" for p in parsed),
          "up did not say it stopped")
    # jq, what operators pipe the stream into, reads it whole.
    if shutil.which("jq"):
        jq = subprocess.run(["jq", "-c", "."], input="".join(lines), text=True,
                            capture_output=True)
        check(jq.returncode == 0, f"jq: {jq.stderr}")
        check(len(jq.stdout.splitlines()) == len(lines), "jq read fewer objects than lines")
    print(f"{len(lines)} lines, all JSON")


def promtool(bin_dir):
    tool = shutil.which("promtool")
    if tool is None:
        print("promtool is not installed (Debian package prometheus): skipped")
        return SKIP
    up = Up(bin_dir, [], lambda line: "Ctrl-C stops" in line)
    try:
        http = re.search(r"OpenAI-compatible API: (\S+)/v1", "".join(up.stdout)).group(1)
        model = re.search(r"model id \(a request's \"model\"\): (\S+)", "".join(up.stdout)).group(1)
        for stream in (False, True):
            body = {"model": model, "max_tokens": 4, "stream": stream,
                    "messages": [{"role": "user", "content": "hi"}]}
            request = urllib.request.Request(http + "/v1/chat/completions",
                                             data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as answer:
                answer.read()
        metrics = get_text(http + "/metrics")
    finally:
        up.stop()
    check("flotilla_requests_finished_total" in metrics, "the scrape has no serving metrics")
    lint = subprocess.run([tool, "check", "metrics"], input=metrics, text=True,
                          capture_output=True)
    check(lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(),
          f"promtool check metrics (rc {lint.returncode}):\n{lint.stdout}{lint.stderr}")
    print(f"promtool clean on {len(metrics.splitlines())} lines")


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certs(directory):
    """A CA and a certificate for 127.0.0.1 it signed."""
    def path(name):
        return os.path.join(directory, name)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "2", "-keyout", path("ca.key"), "-out", path("ca.crt"),
            "-subj", "/CN=test-ca")
    with open(path("server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", path("server.key"), "-out", path("server.csr"), "-subj", "/CN=localhost")
    openssl("x509", "-req", "-days", "2", "-in", path("server.csr"), "-CA", path("ca.crt"),
            "-CAkey", path("ca.key"), "-CAcreateserial", "-out", path("server.crt"),
            "-extfile", path("server.ext"))
    return path


def tls_try(bin_dir):
    for tool in ("openssl", "curl"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed: skipped")
            return SKIP
    with tempfile.TemporaryDirectory() as directory:
        path = make_certs(directory)
        up = Up(bin_dir, ["--tls-cert", path("server.crt"), "--tls-key", path("server.key"),
                          "--tls-ca", path("ca.crt"), "--log-dir", path("logs")],
                lambda line: "Ctrl-C stops" in line)
        try:
            tries = [line.split("try: ", 1)[1].strip() for line in up.stdout if "try: " in line]
            check(len(tries) == 2, f"two try: lines expected:\n{''.join(up.stdout)}")
            env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
            for command in tries:
                ran = subprocess.run(["sh", "-c", command], env=env, capture_output=True,
                                     text=True, timeout=120)
                check(ran.returncode == 0, f"{command}\nexit {ran.returncode}: {ran.stderr}")
                answer = json.loads(ran.stdout)
                check(isinstance(answer, dict) and "error" not in answer,
                      f"{command}\nanswered {ran.stdout}")
                print(f"ok: {command[:60]}...")
        finally:
            up.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--python-dir", help="the Python SDK (json-logs)")
    parser.add_argument("check", choices=["json-logs", "promtool", "tls-try"])
    args = parser.parse_args()
    run = {"json-logs": lambda b: json_logs(b, args.python_dir), "promtool": promtool,
           "tls-try": tls_try}[args.check]
    try:
        return run(args.bin_dir) or 0
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
