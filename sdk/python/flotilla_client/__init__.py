"""Python client of Flotilla's gRPC API (flotilla.v1.Flotilla).

    from flotilla_client import Client, Content
    with Client("127.0.0.1:50051", timeout=60) as client:
        for event in client.chat([{"role": "user", "content": "Hi"}], max_tokens=64):
            if isinstance(event, Content):
                print(event.text, end="", flush=True)

The generated modules are in flotilla_client._pb (flotilla_pb2,
flotilla_pb2_grpc, common_pb2, admin_pb2, ...) for everything the wrapper
does not cover.
"""
from .client import (Client, Content, Event, Finish, FlotillaError, Reasoning, Reply, Stream, Tokens,
                     ToolCallDelta)


def __getattr__(name):
    # The reflection client loads on first use, so that
    # `python3 -m flotilla_client.reflection` runs it as a fresh module.
    if name in ("ReflectionClient", "ReflectionError"):
        from . import reflection
        return getattr(reflection, name)
    raise AttributeError(f"module 'flotilla_client' has no attribute {name!r}")


__all__ = ["Client", "Content", "Event", "Finish", "FlotillaError", "Reasoning", "Reply", "Stream",
           "Tokens", "ToolCallDelta", "ReflectionClient", "ReflectionError"]
