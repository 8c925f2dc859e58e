// Requests that do not parse get INVALID_ARGUMENT saying so.
//
// gRPC's callback server (1.51, the version Debian ships) answers a request
// whose bytes do not parse with UNIMPLEMENTED and no message, dropping the
// parse error. For the request messages of the client and admin APIs the
// SerializationTraits specializations that flotilla_decoding.h and
// admin_decoding.h declare never fail instead: a message that does not parse
// reaches its handler empty, carrying the error in an unknown field
// (kDecodeErrorField), and every handler answers it with RequestDecodeStatus's
// INVALID_ARGUMENT. The generated *.grpc.pb.h include those headers (protoc's
// additional_header_includes, see tools/cmake/flotilla.cmake), so every user
// of a stub or a service sees the same traits.
#pragma once

#include <string>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include "absl/status/status.h"

namespace flotilla::proto_decoding {

// The largest field number protobuf allows: no message of ours declares it.
inline constexpr int kDecodeErrorField = (1 << 29) - 1;

template <class M>
grpc::Status DeserializeOrMark(grpc::ByteBuffer* buffer, M* msg) {
  grpc::Status st = grpc::GenericDeserialize<grpc::ProtoBufferReader, M>(buffer, msg);
  if (st.ok()) return st;
  msg->Clear();
  msg->GetReflection()->MutableUnknownFields(msg)->AddLengthDelimited(
      kDecodeErrorField, "the request's bytes are not a valid " + M::descriptor()->full_name() +
                             " message (protobuf wire format)");
  return grpc::Status::OK;
}

}  // namespace flotilla::proto_decoding

namespace flotilla {

// OK, or INVALID_ARGUMENT when `request` arrived as bytes that do not parse.
inline absl::Status RequestDecodeStatus(const google::protobuf::Message& request) {
  const google::protobuf::UnknownFieldSet& unknown =
      request.GetReflection()->GetUnknownFields(request);
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::UnknownField& f = unknown.field(i);
    if (f.number() == proto_decoding::kDecodeErrorField &&
        f.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      return absl::InvalidArgumentError(f.length_delimited());
    }
  }
  return absl::OkStatus();
}

}  // namespace flotilla

// Declares the tolerant traits of one request message type (at global scope).
#define FLOTILLA_TOLERANT_REQUEST(Type)                                                  \
  template <>                                                                             \
  class grpc::SerializationTraits<Type, void> {                                           \
   public:                                                                                \
    static grpc::Status Serialize(const Type& msg, grpc::ByteBuffer* bb, bool* own) {     \
      return grpc::GenericSerialize<grpc::ProtoBufferWriter, Type>(msg, bb, own);         \
    }                                                                                     \
    static grpc::Status Deserialize(grpc::ByteBuffer* buffer, Type* msg) {                \
      return flotilla::proto_decoding::DeserializeOrMark(buffer, msg);                    \
    }                                                                                     \
  };
