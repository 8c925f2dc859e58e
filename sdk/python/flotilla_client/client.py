"""A small, idiomatic wrapper over the flotilla.v1.Flotilla gRPC API."""
import dataclasses
import json
import os
from typing import Iterable, Iterator, List, Optional, Sequence, Union

import grpc

from ._pb import common_pb2, flotilla_pb2, flotilla_pb2_grpc

_ROLES = {
    "system": flotilla_pb2.ChatMessage.SYSTEM,
    "developer": flotilla_pb2.ChatMessage.DEVELOPER,
    "user": flotilla_pb2.ChatMessage.USER,
    "assistant": flotilla_pb2.ChatMessage.ASSISTANT,
    "tool": flotilla_pb2.ChatMessage.TOOL,
}
_EFFORTS = {"low": flotilla_pb2.LOW, "medium": flotilla_pb2.MEDIUM, "high": flotilla_pb2.HIGH}
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty",
                    "presence_penalty", "max_tokens", "logprobs", "return_logprobs",
                    "ignore_eos", "repetition_penalty")


class FlotillaError(Exception):
    """A call failed: `code` is the grpc.StatusCode, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


def _error(rpc_error: grpc.RpcError) -> FlotillaError:
    return FlotillaError(rpc_error.code(), rpc_error.details() or "")


@dataclasses.dataclass
class Reasoning:
    """Reasoning text (the analysis channel)."""
    text: str


@dataclasses.dataclass
class Content:
    """Answer text (the final channel)."""
    text: str


@dataclasses.dataclass
class ToolCallDelta:
    """A piece of function call `index`: the first carries id and name, later
    ones the next text of its JSON arguments."""
    index: int
    id: str
    name: str
    arguments: str


@dataclasses.dataclass
class Tokens:
    """Generated token ids (Generate) and, when set, their text."""
    token_ids: List[int]
    text: str


@dataclasses.dataclass
class Finish:
    """The last event: why the reply ended (a FinishReason name such as "STOP",
    "LENGTH", "TOOL_CALLS", "CANCELLED") and the token counts."""
    reason: str
    prompt_tokens: int
    completion_tokens: int


Event = Union[Reasoning, Content, ToolCallDelta, Tokens, Finish]


class Stream:
    """A streaming call: iterate it for events; `request_id` is known after the
    first message (reading it waits for that message); `cancel()` drops the
    call, which frees the sequence on the server."""

    def __init__(self, call, to_events):
        self._call = call
        self._to_events = to_events
        self._responses = iter(call)
        self._pending: List[Event] = []
        self._request_id: Optional[str] = None
        self.finish: Optional[Finish] = None

    @property
    def request_id(self) -> str:
        while self._request_id is None:
            if not self._read_one():
                break
        return self._request_id or ""

    def cancel(self) -> None:
        self._call.cancel()

    def _read_one(self) -> bool:
        try:
            response = next(self._responses)
        except StopIteration:
            return False
        except grpc.RpcError as e:
            raise _error(e) from None
        if response.request_id:
            self._request_id = response.request_id
        for event in self._to_events(response):
            if isinstance(event, Finish):
                self.finish = event
            self._pending.append(event)
        return True

    def __iter__(self) -> Iterator[Event]:
        while True:
            while self._pending:
                yield self._pending.pop(0)
            if not self._read_one():
                return

    def collect(self) -> "Reply":
        """Reads the rest of the stream into one Reply."""
        reply = Reply()
        for event in self:
            reply.add(event)
        reply.request_id = self._request_id or ""
        return reply


@dataclasses.dataclass
class Reply:
    """A whole reply, from Stream.collect()."""
    request_id: str = ""
    reasoning: str = ""
    content: str = ""
    text: str = ""
    token_ids: List[int] = dataclasses.field(default_factory=list)
    tool_calls: List[dict] = dataclasses.field(default_factory=list)
    finish: Optional[Finish] = None

    def add(self, event: Event) -> None:
        if isinstance(event, Reasoning):
            self.reasoning += event.text
        elif isinstance(event, Content):
            self.content += event.text
        elif isinstance(event, Tokens):
            self.token_ids.extend(event.token_ids)
            self.text += event.text
        elif isinstance(event, ToolCallDelta):
            while len(self.tool_calls) <= event.index:
                self.tool_calls.append({"id": "", "name": "", "arguments": ""})
            call = self.tool_calls[event.index]
            call["id"] = call["id"] or event.id
            call["name"] = call["name"] or event.name
            call["arguments"] += event.arguments
        elif isinstance(event, Finish):
            self.finish = event


def _chat_events(response) -> List[Event]:
    events: List[Event] = []
    for delta in response.deltas:
        kind = delta.WhichOneof("delta")
        if kind == "reasoning":
            events.append(Reasoning(delta.reasoning))
        elif kind == "content":
            events.append(Content(delta.content))
        elif kind == "tool_call":
            t = delta.tool_call
            events.append(ToolCallDelta(t.index, t.id, t.name, t.arguments))
    if response.token_ids:
        events.append(Tokens(list(response.token_ids), ""))
    if response.finish_reason:
        events.append(Finish(flotilla_pb2.ChatResponse.FinishReason.Name(response.finish_reason),
                             response.usage.prompt_tokens, response.usage.completion_tokens))
    return events


def _generate_events(response) -> List[Event]:
    events: List[Event] = []
    if response.token_ids or response.text:
        events.append(Tokens(list(response.token_ids), response.text))
    if response.finish_reason:
        events.append(Finish(common_pb2.FinishReason.Name(response.finish_reason),
                             response.usage.prompt_tokens, response.usage.completion_tokens))
    return events


def _message(m) -> flotilla_pb2.ChatMessage:
    if isinstance(m, flotilla_pb2.ChatMessage):
        return m
    role = _ROLES.get(m.get("role", ""))
    if role is None:
        raise ValueError(f"message role must be one of {sorted(_ROLES)}, not {m.get('role')!r}")
    out = flotilla_pb2.ChatMessage(role=role, content=m.get("content") or "",
                                   reasoning=m.get("reasoning") or "",
                                   tool_call_id=m.get("tool_call_id") or "", name=m.get("name") or "")
    for call in m.get("tool_calls") or []:
        fn = call.get("function", call)
        arguments = fn.get("arguments", "")
        out.tool_calls.add(id=call.get("id", ""), name=fn["name"],
                           arguments=arguments if isinstance(arguments, str) else json.dumps(arguments))
    return out


def _tool(t) -> flotilla_pb2.Tool:
    if isinstance(t, flotilla_pb2.Tool):
        return t
    fn = t.get("function", t)
    parameters = fn.get("parameters")
    return flotilla_pb2.Tool(name=fn["name"], description=fn.get("description", ""),
                             parameters_json=json.dumps(parameters) if parameters is not None else "",
                             strict=bool(fn.get("strict", False)))


def _response_format(fmt) -> flotilla_pb2.ResponseFormat:
    """OpenAI's response_format dict ({"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}}, {"type": "json_object"}, {"type": "text"})
    or a ResponseFormat message."""
    if isinstance(fmt, flotilla_pb2.ResponseFormat):
        return fmt
    types = {"text": flotilla_pb2.ResponseFormat.TEXT,
             "json_object": flotilla_pb2.ResponseFormat.JSON_OBJECT,
             "json_schema": flotilla_pb2.ResponseFormat.JSON_SCHEMA}
    kind = fmt.get("type")
    if kind not in types:
        raise ValueError(f"response_format type must be one of {sorted(types)}, not {kind!r}")
    out = flotilla_pb2.ResponseFormat(type=types[kind])
    if kind == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema")
        out.json_schema.CopyFrom(flotilla_pb2.ResponseFormat.JsonSchema(
            name=spec.get("name", ""), description=spec.get("description", ""),
            schema_json=schema if isinstance(schema, str) else json.dumps(schema if schema is not None else {}),
            strict=bool(spec.get("strict", False))))
    return out


def _tool_choice(choice) -> flotilla_pb2.ToolChoice:
    modes = {"auto": flotilla_pb2.ToolChoice.AUTO, "none": flotilla_pb2.ToolChoice.NONE,
             "required": flotilla_pb2.ToolChoice.REQUIRED}
    if choice in modes:
        return flotilla_pb2.ToolChoice(mode=modes[choice])
    return flotilla_pb2.ToolChoice(mode=flotilla_pb2.ToolChoice.FUNCTION, function=choice)


def _sampling(stop_token_ids: Sequence[int], **fields) -> common_pb2.SamplingParams:
    unknown = set(fields) - set(_SAMPLING_FIELDS)
    if unknown:
        raise TypeError(f"unknown sampling fields: {sorted(unknown)}")
    params = common_pb2.SamplingParams(**{k: v for k, v in fields.items() if v is not None})
    params.stop_token_ids.extend(stop_token_ids)
    return params


class Client:
    """A connection to a Flotilla coordinator's client API.

    target: "host:port". api_key: sent as "authorization: Bearer KEY" (default:
    $FLOTILLA_API_KEY). timeout: default deadline of every call, in seconds
    (None: no deadline); each call's `timeout` overrides it. credentials:
    grpc.ssl_channel_credentials(...) for a TLS server.
    """

    def __init__(self, target: str, *, api_key: Optional[str] = None, timeout: Optional[float] = None,
                 credentials: Optional[grpc.ChannelCredentials] = None):
        self._channel = (grpc.secure_channel(target, credentials) if credentials
                         else grpc.insecure_channel(target))
        self._stub = flotilla_pb2_grpc.FlotillaStub(self._channel)
        key = api_key if api_key is not None else os.environ.get("FLOTILLA_API_KEY", "")
        self._metadata = (("authorization", f"Bearer {key}"),) if key else ()
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _deadline(self, timeout):
        return self._timeout if timeout is None else timeout

    def list_models(self, *, timeout: Optional[float] = None) -> list:
        """The served models (flotilla.v1.ModelInfo messages)."""
        try:
            reply = self._stub.ListModels(flotilla_pb2.ListModelsRequest(), metadata=self._metadata,
                                          timeout=self._deadline(timeout))
        except grpc.RpcError as e:
            raise _error(e) from None
        return list(reply.models)

    def chat(self, messages: Iterable, *, model: str = "", tools: Iterable = (), tool_choice=None,
             reasoning_effort: Optional[str] = None, stop: Sequence[str] = (),
             stop_token_ids: Sequence[int] = (), return_token_ids: bool = False,
             response_format=None, timeout: Optional[float] = None, **sampling) -> Stream:
        """Streams a chat reply. messages: dicts in OpenAI's shape ({"role",
        "content", "reasoning", "tool_calls", "tool_call_id", "name"}) or
        ChatMessage; tools: {"name", "description", "parameters", "strict"} (or
        OpenAI's {"type": "function", "function": {...}}); tool_choice: "auto",
        "none", "required" or a function name; response_format: OpenAI's dict
        ({"type": "json_schema", "json_schema": {"name", "schema"}} or
        {"type": "json_object"}), enforced while the answer is generated;
        sampling: temperature, top_p, top_k, min_p, seed, max_tokens, ... as in
        SamplingParams."""
        if reasoning_effort is not None and reasoning_effort not in _EFFORTS:
            raise ValueError(f"reasoning_effort must be one of {sorted(_EFFORTS)}, not {reasoning_effort!r}")
        request = flotilla_pb2.ChatRequest(
            model=model, messages=[_message(m) for m in messages], tools=[_tool(t) for t in tools],
            reasoning_effort=_EFFORTS.get(reasoning_effort, 0), stop=list(stop),
            sampling=_sampling(stop_token_ids, **sampling), return_token_ids=return_token_ids)
        if tool_choice is not None:
            request.tool_choice.CopyFrom(_tool_choice(tool_choice))
        if response_format is not None:
            request.response_format.CopyFrom(_response_format(response_format))
        call = self._stub.Chat(request, metadata=self._metadata, timeout=self._deadline(timeout))
        return Stream(call, _chat_events)

    def generate(self, prompt: Union[str, Sequence[int]], *, model: str = "",
                 stop_token_ids: Sequence[int] = (), timeout: Optional[float] = None, **sampling) -> Stream:
        """Streams tokens for a prompt given as text or as token ids."""
        request = flotilla_pb2.GenerateRequest(model=model, sampling=_sampling(stop_token_ids, **sampling))
        if isinstance(prompt, str):
            request.text = prompt
        else:
            request.prompt_ids.ids.extend(prompt)
        call = self._stub.Generate(request, metadata=self._metadata, timeout=self._deadline(timeout))
        return Stream(call, _generate_events)

    def cancel(self, request_id: str, *, timeout: Optional[float] = None) -> bool:
        """Cancels a running request of this key by id; False when none is
        running under that id. The request's stream ends with CANCELLED."""
        try:
            reply = self._stub.Cancel(flotilla_pb2.CancelRequest(request_id=request_id),
                                      metadata=self._metadata, timeout=self._deadline(timeout))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise _error(e) from None
        return reply.found
