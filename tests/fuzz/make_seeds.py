#!/usr/bin/env python3
"""Writes the seed inputs of tests/fuzz/corpus/<target>/seed_*.

Run from anywhere: python3 tests/fuzz/make_seeds.py. The files are checked
in; inputs found by fuzzing (crash_*, found_*) sit beside them and are not
touched here. Encodings are those of the targets (see each *_fuzzer.cc).
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- http_request: selector byte (0 chat, 1 completions) + body ----
chat = {"model": "gpt-oss-20b", "messages": [{"role": "user", "content": "Hi"}]}
write("http_request", "chat_minimal", b"\x00" + json.dumps(chat).encode())
tools = {
    "model": "gpt-oss-20b",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "call it", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ],
    "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather now",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "name"},
            "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}],
    "tool_choice": "auto", "reasoning_effort": "high", "temperature": 0.5, "top_p": 0.9,
    "max_tokens": 100, "stop": ["\n\n"], "stream": True, "stream_options": {"include_usage": True},
    "logprobs": True, "top_logprobs": 2, "logit_bias": {"42": -5}, "top_k": 5, "seed": 7,
}
write("http_request", "chat_tools", b"\x00" + json.dumps(tools).encode())
comp = {"model": "gpt-oss-20b", "prompt": "<|start|>user<|message|>Hello<|end|>", "max_tokens": 5,
        "logprobs": 2, "stop": "x"}
write("http_request", "completion", b"\x01" + json.dumps(comp).encode())
write("http_request", "completion_array", b"\x01" + json.dumps(
    {"model": "gpt-oss-20b", "prompt": ["caf\u00e9 \U0001F600"]}).encode())
write("http_request", "bad_json", b"\x00{\"model\": \"gpt-oss-20b\", \"messages\": [")
write("http_request", "bad_utf8", b"\x00{\"model\": \"gpt-oss-20b\", \"messages\": \"\xff\xfe\"}")
write("http_request", "wrong_model", b"\x00" + json.dumps(
    {"model": "other", "messages": [{"role": "user", "content": "x"}]}).encode())
write("http_request", "not_object", b"\x01[1, 2, 3]")
write("http_request", "bad_fields", b"\x00" + json.dumps(
    {"model": "gpt-oss-20b", "messages": [{"role": "robot"}], "temperature": "hot", "n": 3}).encode())

# ---- harmony_parser: flags byte + token stream (token_stream.h) ----
START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL = (bytes([i]) for i in range(7))


def t(s):
    return s.encode()


ASSISTANT = 2  # flags bit 1: the stream begins inside an assistant header
write("harmony_parser", "final", bytes([ASSISTANT]) + CHANNEL + t("final") + MESSAGE + t("Hello!") + RETURN)
write("harmony_parser", "analysis_then_final",
      bytes([ASSISTANT | 1]) + CHANNEL + t("analysis") + MESSAGE + t("think") + END + START +
      t("assistant") + CHANNEL + t("final") + MESSAGE + t("The answer is 42") + RETURN)
write("harmony_parser", "tool_call",
      bytes([ASSISTANT | 4]) + CHANNEL + t("commentary to=functions.get_weather ") + CONSTRAIN +
      t("json") + MESSAGE + t('{"city":"Paris"}') + CALL)
write("harmony_parser", "recipient_first",
      bytes([ASSISTANT | 8]) + t(" to=functions.f") + CHANNEL + t("commentary") + MESSAGE + t("{}") + CALL)
write("harmony_parser", "from_start", bytes([1]) + START + t("assistant") + CHANNEL + t("final") +
      MESSAGE + t("x") + END)
# UTF-8 split across byte tokens ("é" = C3 A9), and a stray byte.
write("harmony_parser", "utf8_pieces", bytes([ASSISTANT | 16]) + CHANNEL + t("final") + MESSAGE +
      b"caf\xc3\xa9 \xe2\x82" + RETURN)
write("harmony_parser", "malformed", bytes([0]) + MESSAGE + START + START + CHANNEL + END + b"\x0b\x0c")
write("harmony_parser", "any_ids", bytes([ASSISTANT | 32]) + b"\xf0\x01\x02\x03\xf0\xff\xff\xff" + RETURN)

# ---- tokenizer: mode byte + text (0 all, 1 none, 2 ordinary, 3 listed) or ids (4..7) ----
write("tokenizer", "all_specials", b"\x00<|start|>user<|message|>Hello, world!<|end|><|reserved_200013|>")
write("tokenizer", "none_plain", b"\x01The quick brown fox \xe2\x80\x94 jumps 12345 times.\n\n  ")
write("tokenizer", "none_special_refused", b"\x01text <|end|> more")
write("tokenizer", "ordinary", b"\x02<|start|>  \t\n\xf0\x9f\x98\x80 I'm you'll THEY'RE 3.14159 \xe4\xb8\xad\xe6\x96\x87")
write("tokenizer", "listed", b"\x03<|start|><|channel|><|end|>")
write("tokenizer", "invalid_utf8", b"\x00abc\xc3(\xff\xed\xa0\x80")
write("tokenizer", "ids", b"\x04" + struct.pack("<6I", 0, 1, 200006, 199997, 201087, 201090))
write("tokenizer", "ids_split_char", b"\x05" + struct.pack("<2I", 1, 2))


# ---- safetensors: a file image ----
def st(header, data=b""):
    h = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(h)) + h + data


write("safetensors", "valid", st({
    "__metadata__": {"format": "pt"},
    "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
    "empty": {"dtype": "I64", "shape": [0, 5], "data_offsets": [22, 22]},
    "s": {"dtype": "BOOL", "shape": [], "data_offsets": [22, 23]},
}, bytes(range(23))))
write("safetensors", "overlap", st({
    "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
    "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, bytes(6)))
write("safetensors", "past_end", st({"a": {"dtype": "F64", "shape": [4], "data_offsets": [0, 32]}}, bytes(8)))
write("safetensors", "bad_dtype", st({"a": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}}, b"\x00"))
write("safetensors", "overflow", st({"a": {"dtype": "F32", "shape": [2**62, 4], "data_offsets": [0, 0]}}))
write("safetensors", "truncated", b"\x40\x00\x00\x00\x00\x00\x00\x00{\"a\":")
write("safetensors", "huge_header_len", b"\xff" * 8 + b"{}")


# ---- proto_request: selector byte (0 ChatRequest, 1 GenerateRequest) + the message ----
def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def fld(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    if wire == 5:
        return key + struct.pack("<f", payload)
    if isinstance(payload, str):
        payload = payload.encode()
    return key + varint(len(payload)) + payload


def msg(role, content=None, reasoning=None, tool_calls=(), tool_call_id=None, name=None):
    m = fld(1, 0, role)
    if content is not None:
        m += fld(2, 2, content)
    if reasoning is not None:
        m += fld(3, 2, reasoning)
    for tc in tool_calls:
        m += fld(4, 2, fld(1, 2, tc[0]) + fld(2, 2, tc[1]) + fld(3, 2, tc[2]))
    if tool_call_id is not None:
        m += fld(5, 2, tool_call_id)
    if name is not None:
        m += fld(6, 2, name)
    return m


SYSTEM, DEVELOPER, USER, ASSISTANT_ROLE, TOOL = 1, 2, 3, 4, 5
sampling = fld(1, 5, 0.7) + fld(2, 5, 0.9) + fld(3, 0, 40) + fld(8, 0, 64) + fld(10, 0, 3)
write("proto_request", "chat_minimal", b"\x00" + fld(2, 2, msg(USER, "Hi")))
write("proto_request", "chat_tools", b"\x00" + fld(1, 2, "gpt-oss-20b") +
      fld(2, 2, msg(SYSTEM, "Be brief.")) + fld(2, 2, msg(USER, "Weather?")) +
      fld(2, 2, msg(ASSISTANT_ROLE, reasoning="call", tool_calls=[("call_1", "get_weather", '{"city":"Paris"}')])) +
      fld(2, 2, msg(TOOL, "sunny", tool_call_id="call_1", name="get_weather")) +
      fld(3, 2, fld(1, 2, "get_weather") + fld(2, 2, "Weather now") +
          fld(3, 2, '{"type":"object","properties":{"city":{"type":"string"}}}')) +
      fld(4, 2, fld(1, 0, 3) + fld(2, 2, "get_weather")) + fld(5, 0, 3) + fld(6, 2, sampling) +
      fld(7, 2, "\n\n") + fld(9, 0, 1))
write("proto_request", "chat_bad_sampling", b"\x00" + fld(2, 2, msg(USER, "x")) +
      fld(6, 2, fld(1, 5, float("nan")) + fld(12, 0, 1)))
write("proto_request", "chat_bad_role", b"\x00" + fld(2, 2, msg(9, "x")) + fld(2, 2, msg(TOOL, "r")))
write("proto_request", "generate_text", b"\x01" + fld(6, 2, "<|start|>user<|message|>Hello<|end|>") +
      fld(3, 2, sampling))
write("proto_request", "generate_ids", b"\x01" + fld(1, 2, "gpt-oss-20b") +
      fld(2, 2, fld(1, 2, b"".join(varint(i) for i in (200006, 1428, 200008, 13225)))) + fld(4, 0, 1))
write("proto_request", "generate_bad_ids", b"\x01" + fld(2, 2, fld(1, 0, 2**32 - 1) + fld(1, 0, 999999)))
write("proto_request", "generate_no_prompt", b"\x01" + fld(1, 2, ""))
write("proto_request", "garbage", b"\x00\xff\xff\xff\xff\x0f\x12\x80")


# ---- deep nesting (50,000 levels, ~100 KB): each route's JSON fields and
# the JSON-carrying proto fields must be refused cleanly, never recursed into ----
DEPTH = 50000
DEEP_ARRAY = "[" * DEPTH + "]" * DEPTH
DEEP_OBJECT = "{\"a\":" * (DEPTH // 3) + "1" + "}" * (DEPTH // 3)  # ~100 KB too
USER_MSG = '[{"role": "user", "content": "x"}]'
write("http_request", "deep_chat_metadata",
      '\x00{"model": "gpt-oss-20b", "messages": ' + USER_MSG + ', "metadata": ' + DEEP_OBJECT + "}")
write("http_request", "deep_chat_messages", '\x00{"model": "gpt-oss-20b", "messages": ' + DEEP_ARRAY + "}")
write("http_request", "deep_chat_tools",
      '\x00{"model": "gpt-oss-20b", "messages": ' + USER_MSG +
      ', "tools": [{"type": "function", "function": {"name": "f", "parameters": ' + DEEP_OBJECT + "}}]}")
write("http_request", "deep_responses_input", '\x02{"model": "gpt-oss-20b", "input": ' + DEEP_ARRAY + "}")
write("http_request", "deep_tokenize", '\x03{"prompt": ' + DEEP_ARRAY + "}")
write("http_request", "deep_detokenize", '\x04{"tokens": ' + DEEP_ARRAY + "}")
write("proto_request", "deep_chat_parameters_json", b"\x00" + fld(2, 2, msg(USER, "x")) +
      fld(3, 2, fld(1, 2, "f") + fld(3, 2, DEEP_OBJECT)))
write("proto_request", "deep_chat_schema_json", b"\x00" + fld(2, 2, msg(USER, "x")) +
      fld(10, 2, fld(1, 0, 2) + fld(2, 2, fld(3, 2, DEEP_ARRAY))))
write("proto_request", "generate_bad_temperature", b"\x01" + fld(2, 2, fld(1, 0, 1) + fld(1, 0, 2)) +
      fld(3, 2, fld(1, 5, -1.0) + fld(2, 5, 7.0)))


# ---- json_schema: flags byte (bits 0-1: response format, tool, required tool,
# both; bit 2: reasoning) + walk byte + the schema text ----
TICKET = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 80},
    "priority": {"type": "integer", "minimum": 1, "maximum": 5},
    "labels": {"type": "array", "items": {"type": "string", "enum": ["bug", "feature", "docs"]},
               "maxItems": 4}},
    "required": ["title", "priority", "labels"], "additionalProperties": False}
write("json_schema", "ticket", b"\x00\x01" + json.dumps(TICKET).encode())
write("json_schema", "ticket_required_tool", b"\x02\x07" + json.dumps(TICKET).encode())
write("json_schema", "any_object_reasoning", b"\x04\x03")
write("json_schema", "formats", b"\x00\x05" + json.dumps({"type": "object", "properties": {
    "id": {"type": "string", "format": "uuid"}, "at": {"type": "string", "format": "date-time"},
    "mail": {"type": "string", "format": "email", "maxLength": 40}},
    "required": ["id", "at", "mail"]}).encode())
write("json_schema", "pattern_keys", b"\x01\x09" + json.dumps({
    "type": "object", "propertyNames": {"pattern": "^[a-z]{1,8}$"},
    "additionalProperties": {"type": "integer", "multipleOf": 5}, "maxProperties": 4}).encode())
write("json_schema", "anyof_refs", b"\x03\x02" + json.dumps({
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "number"},
                                                         "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                       "required": ["v"]}},
    "anyOf": [{"$ref": "#/$defs/node"}, {"type": "object", "properties": {"n": {"enum": [1, "a", None, True]}}}]}).encode())
write("json_schema", "unsatisfiable", b"\x00\x00" + json.dumps(
    {"type": "string", "minLength": 5, "maxLength": 2}).encode())
write("json_schema", "bad_pattern", b"\x00\x00" + json.dumps(
    {"type": "string", "pattern": "(a|b)*a(a|b){40}"}).encode())
write("json_schema", "deep_schema", b"\x00\x00" + ('{"items":' * (DEPTH // 10) + "{}" + "}" * (DEPTH // 10)).encode())
write("json_schema", "not_json", b"\x00\x00{\"type\": ")
