"""A gRPC server-reflection client: lists a server's services and describes a
service or message from the descriptors the server sends, with no .proto
files at hand.

    python3 -m flotilla_client.reflection HOST:PORT list
    python3 -m flotilla_client.reflection HOST:PORT describe flotilla.v1.Flotilla
"""
import argparse
import sys
from typing import List, Optional

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool

from ._pb import grpc_reflection_v1_pb2, grpc_reflection_v1alpha_pb2

# The two versions of the protocol: the same messages in two packages.
_VERSIONS = {
    "v1": (grpc_reflection_v1_pb2, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
    "v1alpha": (grpc_reflection_v1alpha_pb2,
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
}


class ReflectionError(Exception):
    """The server could not answer a reflection request."""


class ReflectionClient:
    """Asks one server about its services over grpc.reflection.v1 or, on
    servers without it, v1alpha (version=None, the default); version="v1" or
    "v1alpha" asks that one only."""

    def __init__(self, channel: grpc.Channel, *, timeout: Optional[float] = 10.0, metadata=(),
                 version: Optional[str] = None):
        if version is not None and version not in _VERSIONS:
            raise ValueError(f"version {version!r}: use v1 or v1alpha")
        self._channel = channel
        self._timeout = timeout
        self._metadata = metadata
        self._fallback = version is None
        self._use(version or "v1")

    def _use(self, version: str):
        self.version = version
        module, method = _VERSIONS[version]
        self._pb = module
        self._call = self._channel.stream_stream(
            method, request_serializer=module.ServerReflectionRequest.SerializeToString,
            response_deserializer=module.ServerReflectionResponse.FromString)

    def _request(self, **fields):
        return self._pb.ServerReflectionRequest(**fields)

    def _ask(self, request):
        try:
            return self._ask_once(request)
        except grpc.RpcError as e:
            if not self._fallback or e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
        self._fallback = False
        self._use("v1alpha")
        return self._ask_once(self._pb.ServerReflectionRequest.FromString(request.SerializeToString()))

    def _ask_once(self, request):
        responses = list(self._call(iter([request]), timeout=self._timeout, metadata=self._metadata))
        if len(responses) != 1:
            raise ReflectionError(f"expected one answer, got {len(responses)}")
        response = responses[0]
        if response.WhichOneof("message_response") == "error_response":
            asked = request.WhichOneof("message_request")
            raise ReflectionError(f"{asked} {getattr(request, asked)!r}: {response.error_response.error_message} "
                                  f"(code {response.error_response.error_code})")
        return response

    def list_services(self) -> List[str]:
        """The fully qualified names of the server's services, sorted."""
        response = self._ask(self._request(list_services="*"))
        return sorted(s.name for s in response.list_services_response.service)

    def pool_for(self, symbol: str) -> descriptor_pool.DescriptorPool:
        """A descriptor pool holding the file that defines `symbol` and every
        file it imports, as the server describes them."""
        pool = descriptor_pool.DescriptorPool()
        files = {}
        pending = [("symbol", symbol)]
        while pending:
            kind, name = pending.pop()
            if kind == "symbol":
                request = self._request(file_containing_symbol=name)
            else:
                request = self._request(file_by_filename=name)
            for raw in self._ask(request).file_descriptor_response.file_descriptor_proto:
                proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
                files.setdefault(proto.name, proto)
            for proto in list(files.values()):
                pending.extend(("file", dep) for dep in proto.dependency if dep not in files)
        added = set()

        def add(name):
            if name in added:
                return
            for dep in files[name].dependency:
                add(dep)
            pool.AddSerializedFile(files[name].SerializeToString())
            added.add(name)

        for name in files:
            add(name)
        return pool

    def describe(self, symbol: str) -> str:
        """A service's methods or a message's fields, in .proto syntax."""
        pool = self.pool_for(symbol)
        try:
            return describe_service(pool.FindServiceByName(symbol))
        except KeyError:
            pass
        try:
            return describe_message(pool.FindMessageTypeByName(symbol))
        except KeyError:
            raise ReflectionError(f"{symbol} is neither a service nor a message") from None


def describe_service(service) -> str:
    lines = [f"{service.full_name} is a service:", f"service {service.name} {{"]
    for method in service.methods:
        proto = descriptor_pb2.MethodDescriptorProto()
        method.CopyToProto(proto)
        request = ("stream " if proto.client_streaming else "") + "." + method.input_type.full_name
        response = ("stream " if proto.server_streaming else "") + "." + method.output_type.full_name
        lines.append(f"  rpc {method.name} ( {request} ) returns ( {response} );")
    lines.append("}")
    return "\n".join(lines)


def _field_type(field) -> str:
    if field.message_type is not None:
        return "." + field.message_type.full_name
    if field.enum_type is not None:
        return "." + field.enum_type.full_name
    names = {v: k[len("TYPE_"):].lower() for k, v in descriptor_pb2.FieldDescriptorProto.Type.items()}
    return names[field.type]


def describe_message(message) -> str:
    lines = [f"{message.full_name} is a message:", f"message {message.name} {{"]
    for field in message.fields:
        label = "repeated " if field.label == field.LABEL_REPEATED else ""
        oneof = f"  // oneof {field.containing_oneof.name}" if field.containing_oneof else ""
        lines.append(f"  {label}{_field_type(field)} {field.name} = {field.number};{oneof}")
    lines.append("}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="gRPC server reflection: list services, describe symbols")
    parser.add_argument("target", help="HOST:PORT")
    parser.add_argument("command", choices=["list", "describe"])
    parser.add_argument("symbol", nargs="?", help="for describe: a service or message name")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    args = parser.parse_args(argv)
    if args.command == "describe" and not args.symbol:
        parser.error("describe needs a symbol, e.g. flotilla.v1.Flotilla")
    with grpc.insecure_channel(args.target) as channel:
        client = ReflectionClient(channel, timeout=args.timeout)
        try:
            if args.command == "list":
                print("\n".join(client.list_services()))
            else:
                print(client.describe(args.symbol))
        except (ReflectionError, grpc.RpcError) as e:
            print(f"reflection: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
