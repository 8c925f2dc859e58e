#!/usr/bin/env python3
"""The Python SDK and gRPC reflection against a real local cluster.

Starts `flotilla up` (the built-in synthetic model with the real vocabulary,
one CPU worker, an API key, two served model names), then with flotilla_client
streams a chat and a generate, cancels one request by id and drops another,
lets a deadline expire and checks that the server freed every sequence
(/metrics); over HTTP checks /v1/models (every name, max_model_len),
/tokenize and /detokenize; over server reflection lists the services and
describes flotilla.v1.Flotilla (in process and with
`python3 -m flotilla_client.reflection`). Prints a line per check; exits
non-zero on the first failure.

Usage: sdk_cluster_test.py --bin-dir BUILD/bin --python-dir BUILD/python
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import json
import urllib.error
import urllib.request

API_KEY = "python-sdk-test-key"
ADMIN_KEY = "python-sdk-test-admin-key"  # /metrics answers the admin key only
SERVED_NAMES = ["gpt-oss-test", "openai/gpt-oss-test"]


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print(f"ok: {what}", flush=True)


class Cluster:
    """`flotilla up` in the background; its gRPC and HTTP addresses."""

    def __init__(self, bin_dir, work_dir):
        key_file = os.path.join(work_dir, "keys")
        with open(key_file, "w") as f:
            f.write(API_KEY + "\n")
        admin_key_file = os.path.join(work_dir, "admin-keys")
        with open(admin_key_file, "w") as f:
            f.write(ADMIN_KEY + "\n")
        self.process = subprocess.Popen(
            [os.path.join(bin_dir, "flotilla"), "up", "--workers", "1", "--threads-per-worker", "1",
             "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--api-key-file", key_file,
             "--admin-key-file", admin_key_file, "--served-model-name", ",".join(SERVED_NAMES),
             "--log-dir", os.path.join(work_dir, "logs")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output = []
        self.address = self.http = None
        ready = threading.Event()
        threading.Thread(target=self._read, args=(ready,), daemon=True).start()
        if not ready.wait(240) or self.address is None:
            self.stop()
            raise RuntimeError("flotilla up did not start:\n" + "".join(self.output))

    def _read(self, ready):
        for line in self.process.stdout:
            self.output.append(line)
            if m := re.search(r"serving .* at (\S+)$", line.strip()):
                self.address = m.group(1)
            if m := re.search(r"OpenAI-compatible API: http://(\S+)/v1", line):
                self.http = m.group(1)
            if "Ctrl-C stops" in line:
                ready.set()
        ready.set()

    def http_json(self, path, body=None):
        """(status, JSON answer) of GET path, or POST when a body is given."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://{self.http}{path}", data=data,
                                         headers={"Authorization": f"Bearer {API_KEY}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def metric(self, name):
        request = urllib.request.Request(f"http://{self.http}/metrics",
                                         headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        body = urllib.request.urlopen(request, timeout=10).read().decode()
        # Series carry labels (model_name="..."), or none.
        m = re.search(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", body, re.MULTILINE)
        return float(m.group(2)) if m else -1.0

    def wait_idle(self, seconds=30):
        """True once no request is in flight and no sequence runs."""
        end = time.time() + seconds
        while time.time() < end:
            if self.metric("flotilla_requests_in_flight") == 0 and self.metric("flotilla_running_sequences") == 0:
                return True
            time.sleep(0.1)
        return False

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


HELLO = [{"role": "system", "content": "You are terse."},
         {"role": "user", "content": "What is the capital of France?"}]


def test_chat_and_generate(client):
    import flotilla_client as fc
    models = client.list_models()
    check([m.id for m in models] == SERVED_NAMES and models[0].vocab_size > 1024,
          f"list_models lists every served name: {[m.id for m in models]}")
    aliased = client.chat(HELLO, model=SERVED_NAMES[1], temperature=0, max_tokens=2).collect()
    check(aliased.finish is not None, "chat under the second served name")
    stream = client.chat(HELLO, reasoning_effort="low", temperature=0, max_tokens=8, return_token_ids=True)
    check(re.fullmatch(r"[0-9a-f]{32}", stream.request_id) is not None, f"chat request id {stream.request_id}")
    events = list(stream)
    kinds = {type(e).__name__ for e in events}
    check(isinstance(events[-1], fc.Finish), f"chat streams events ending in Finish: {sorted(kinds)}")
    reply = fc.Reply()
    for e in events:
        reply.add(e)
    check(reply.finish.reason in ("LENGTH", "STOP") and 0 < reply.finish.completion_tokens <= 8,
          f"chat finished {reply.finish}")
    check(len(reply.token_ids) == reply.finish.completion_tokens, "chat streamed every completion token")
    again = client.chat(HELLO, reasoning_effort="low", temperature=0, max_tokens=8, return_token_ids=True).collect()
    check(again.token_ids == reply.token_ids, "greedy chat is repeatable")
    generated = client.generate("Hello", max_tokens=6, temperature=0, ignore_eos=True).collect()
    check(len(generated.token_ids) == 6 and generated.finish.reason == "LENGTH",
          f"generate streamed {len(generated.token_ids)} tokens, {generated.finish.reason}")
    by_ids = client.generate([1, 2, 3], max_tokens=4, temperature=0, ignore_eos=True).collect()
    check(len(by_ids.token_ids) == 4, "generate from token ids")


def test_structured_output(client):
    import grpc
    import flotilla_client as fc
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "rank"],
              "properties": {"city": {"type": "string", "maxLength": 8},
                             "rank": {"type": "integer", "minimum": 1, "maximum": 9}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}}
    for seed in range(3):
        reply = client.chat(HELLO, response_format=fmt, temperature=1, seed=seed, max_tokens=200).collect()
        check(reply.finish.reason == "STOP", f"structured chat finished: {reply.finish}")
        answer = json.loads(reply.content)
        check(sorted(answer) == ["city", "rank"] and isinstance(answer["city"], str)
              and len(answer["city"]) <= 8 and isinstance(answer["rank"], int) and 1 <= answer["rank"] <= 9,
              f"the answer conforms to the schema: {reply.content}")
    bad = {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(a)\\1"}}}
    try:
        client.chat(HELLO, response_format=bad, max_tokens=4).collect()
        check(False, "an unsupported schema keyword is refused")
    except fc.FlotillaError as e:
        check(e.code == grpc.StatusCode.INVALID_ARGUMENT and "response_format.json_schema" in e.details
              and "pattern" in e.details, f"unsupported keyword: {e.code.name} {e.details}")


def test_errors(cluster, client_class):
    import grpc
    import flotilla_client as fc
    with client_class(cluster.address, api_key="") as keyless:
        try:
            keyless.list_models()
            check(False, "a call without a key is refused")
        except fc.FlotillaError as e:
            check(e.code == grpc.StatusCode.UNAUTHENTICATED, f"a call without a key: {e.code.name}")
    with client_class(cluster.address, api_key=API_KEY) as client:
        try:
            client.chat(HELLO, temperature=-1, max_tokens=4).collect()
            check(False, "a bad temperature is refused")
        except fc.FlotillaError as e:
            check(e.code == grpc.StatusCode.INVALID_ARGUMENT and "temperature" in e.details,
                  f"bad temperature: {e.code.name} {e.details}")
        check(client.cancel("0" * 32) is False, "cancel of an unknown id is False")


def test_cancel_and_deadline(cluster, client):
    import grpc
    import flotilla_client as fc
    long_chat = dict(reasoning_effort="low", temperature=1.0, max_tokens=0, stop_token_ids=(),
                     return_token_ids=True)
    stream = client.chat(HELLO, **long_chat)
    request_id = stream.request_id
    check(client.cancel(request_id) is True, "cancel by id finds the running chat")
    reply = stream.collect()
    check(reply.finish is not None and reply.finish.reason == "CANCELLED", f"cancelled chat ends {reply.finish}")
    check(cluster.wait_idle(), "the cancelled chat's sequence is freed")

    dropped = client.chat(HELLO, **long_chat)
    next(iter(dropped))
    dropped.cancel()
    try:
        dropped.collect()
        check(False, "a dropped stream raises")
    except fc.FlotillaError as e:
        check(e.code == grpc.StatusCode.CANCELLED, f"dropped stream: {e.code.name}")
    check(cluster.wait_idle(), "the dropped chat's sequence is freed")

    started = time.time()
    try:
        client.chat(HELLO, timeout=0.5, **long_chat).collect()
        check(False, "a 0.5 s deadline expires")
    except fc.FlotillaError as e:
        # The status is the behaviour; how long it took is only reported.
        took = time.time() - started
        check(e.code == grpc.StatusCode.DEADLINE_EXCEEDED,
              f"deadline: {e.code.name} after {took:.2f} s")
    check(cluster.wait_idle(), "the expired chat's sequence is freed")


def test_http_models_and_tokenize(cluster):
    status, models = cluster.http_json("/v1/models")
    check(status == 200 and [m["id"] for m in models["data"]] == SERVED_NAMES,
          f"/v1/models lists every served name: {[m['id'] for m in models['data']]}")
    max_len = models["data"][0]["max_model_len"]
    check(isinstance(max_len, int) and max_len > 0, f"/v1/models has max_model_len {max_len}")
    status, one = cluster.http_json("/v1/models/" + SERVED_NAMES[1])
    check(status == 200 and one["id"] == SERVED_NAMES[1], "/v1/models/{second name}")
    status, chat = cluster.http_json("/v1/chat/completions", {
        "model": SERVED_NAMES[1], "messages": HELLO, "max_tokens": 2, "temperature": 0})
    check(status == 200 and chat["model"] == SERVED_NAMES[0], f"HTTP chat under the second name answers as {chat.get('model')}")
    status, tokens = cluster.http_json("/tokenize", {"prompt": "Hello world", "return_token_strs": True})
    check(status == 200 and tokens["count"] == len(tokens["tokens"]) == 2 and
          tokens["token_strs"] == ["Hello", " world"] and tokens["max_model_len"] == max_len,
          f"/tokenize a prompt: {tokens}")
    status, text = cluster.http_json("/detokenize", {"tokens": tokens["tokens"], "model": SERVED_NAMES[1]})
    check(status == 200 and text == {"prompt": "Hello world"}, f"/detokenize: {text}")
    status, chat_tokens = cluster.http_json("/tokenize", {"model": SERVED_NAMES[0], "messages": HELLO})
    check(status == 200 and chat_tokens["count"] == chat["usage"]["prompt_tokens"],
          f"/tokenize messages counts what chat bills ({chat_tokens['count']} tokens)")
    status, error = cluster.http_json("/detokenize", {"tokens": [1, -5]})
    check(status == 400 and "tokens[1]" in error["error"]["message"], f"/detokenize bad id: {error['error']['message']}")
    status, error = cluster.http_json("/tokenize", {"prompt": "x", "model": "nope"})
    check(status == 404, f"/tokenize of another model: {status}")


def test_reflection(cluster, python_dir):
    import grpc
    from flotilla_client import ReflectionClient, ReflectionError
    with grpc.insecure_channel(cluster.address) as channel:
        reflection = ReflectionClient(channel)
        services = reflection.list_services()
        check(reflection.version == "v1", f"the client asked v1 first and was answered: {reflection.version}")
        for name in ("flotilla.v1.Flotilla", "flotilla.admin.Admin", "grpc.health.v1.Health",
                     "grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection"):
            check(name in services, f"reflection lists {name}")
        # Both versions answer alike (tools ask v1 first, older ones v1alpha).
        alpha = ReflectionClient(channel, version="v1alpha")
        check(alpha.list_services() == services, f"v1alpha lists what v1 lists: {alpha.list_services()}")
        check(alpha.describe("flotilla.v1.ChatRequest") ==
              ReflectionClient(channel, version="v1").describe("flotilla.v1.ChatRequest"),
              "v1 and v1alpha describe flotilla.v1.ChatRequest alike")
        try:
            ReflectionClient(channel, version="v1").describe("flotilla.v1.Nothing")
            check(False, "v1: an unknown symbol is an error")
        except ReflectionError as e:
            check("flotilla.v1.Nothing" in str(e) and "code 5" in str(e), f"v1: unknown symbol: {e}")
        described = reflection.describe("flotilla.v1.Flotilla")
        for line in ("rpc Chat ( .flotilla.v1.ChatRequest ) returns ( stream .flotilla.v1.ChatResponse );",
                     "rpc Generate ( .flotilla.v1.GenerateRequest ) returns ( stream .flotilla.v1.GenerateResponse );",
                     "rpc Cancel ( .flotilla.v1.CancelRequest ) returns ( .flotilla.v1.CancelResponse );",
                     "rpc ListModels ( .flotilla.v1.ListModelsRequest ) returns ( .flotilla.v1.ListModelsResponse );"):
            check(line in described, f"describe flotilla.v1.Flotilla: {line}")
        message = reflection.describe("flotilla.v1.ChatRequest")
        check("repeated .flotilla.v1.ChatMessage messages = 2;" in message and
              ".flotilla.common.SamplingParams sampling = 6;" in message, "describe flotilla.v1.ChatRequest")
    env = dict(os.environ, PYTHONPATH=python_dir)
    cli = [sys.executable, "-m", "flotilla_client.reflection", cluster.address]
    listed = subprocess.run(cli + ["list"], capture_output=True, text=True, env=env, timeout=60)
    check(listed.returncode == 0 and "flotilla.v1.Flotilla" in listed.stdout.split(),
          "python3 -m flotilla_client.reflection ADDR list")
    shown = subprocess.run(cli + ["describe", "flotilla.v1.Flotilla"], capture_output=True, text=True, env=env,
                           timeout=60)
    check(shown.returncode == 0 and shown.stdout.startswith("flotilla.v1.Flotilla is a service:") and
          "rpc Chat (" in shown.stdout, "python3 -m flotilla_client.reflection ADDR describe flotilla.v1.Flotilla")
    missing = subprocess.run(cli + ["describe", "flotilla.v1.Nothing"], capture_output=True, text=True, env=env,
                             timeout=60)
    check(missing.returncode == 1 and "flotilla.v1.Nothing" in missing.stderr,
          f"an unknown symbol is an error: {missing.stderr.strip()}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--python-dir", required=True)
    args = parser.parse_args()
    sys.path.insert(0, args.python_dir)
    import flotilla_client
    with tempfile.TemporaryDirectory(prefix="flotilla-python-sdk-") as work_dir:
        cluster = Cluster(args.bin_dir, work_dir)
        try:
            with flotilla_client.Client(cluster.address, api_key=API_KEY, timeout=120) as client:
                test_chat_and_generate(client)
                test_structured_output(client)
                test_cancel_and_deadline(cluster, client)
            test_errors(cluster, flotilla_client.Client)
            test_http_models_and_tokenize(cluster)
            test_reflection(cluster, args.python_dir)
        except Exception:
            print("flotilla up output:\n" + "".join(cluster.output), file=sys.stderr)
            raise
        finally:
            cluster.stop()
        check(cluster.process.returncode is not None, "flotilla up stopped")
    print("all checks passed")


if __name__ == "__main__":
    main()
