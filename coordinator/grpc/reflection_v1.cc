#include "coordinator/grpc/reflection_v1.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include "absl/strings/str_cat.h"

namespace flotilla::coordinator {
namespace {

namespace pb = google::protobuf;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

void SetError(ServerReflectionResponse& response, grpc::StatusCode code, std::string message) {
  response.mutable_error_response()->set_error_code(static_cast<int>(code));
  response.mutable_error_response()->set_error_message(std::move(message));
}

// `file` and those of its imports (transitively) not yet in `sent`.
void AddFiles(const pb::FileDescriptor* file, std::set<std::string>* sent,
              ServerReflectionResponse& response) {
  if (!sent->insert(file->name()).second) return;
  pb::FileDescriptorProto proto;
  file->CopyTo(&proto);
  response.mutable_file_descriptor_response()->add_file_descriptor_proto(
      proto.SerializeAsString());
  for (int i = 0; i < file->dependency_count(); ++i) AddFiles(file->dependency(i), sent, response);
}

// The file asked for always goes out, even if sent before on this stream.
void AnswerFile(const pb::FileDescriptor* file, std::set<std::string>* sent,
                ServerReflectionResponse& response) {
  sent->erase(file->name());
  AddFiles(file, sent, response);
}

// The stream: each request read is answered before the next is read.
class Reactor final
    : public grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse> {
 public:
  explicit Reactor(const ReflectionV1Service* service) : service_(service) { StartRead(&request_); }

  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);  // the client ended its side
    response_ = service_->Answer(request_, &sent_);
    StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the client went away"));
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  const ReflectionV1Service* service_;
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
  std::set<std::string> sent_;
};

}  // namespace

ReflectionV1Service::ReflectionV1Service(std::vector<std::string> services)
    : services_(std::move(services)) {}

grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>*
ReflectionV1Service::ServerReflectionInfo(grpc::CallbackServerContext*) {
  return new Reactor(this);
}

ServerReflectionResponse ReflectionV1Service::Answer(const ServerReflectionRequest& request,
                                                     std::set<std::string>* sent) const {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        response.mutable_list_services_response()->add_service()->set_name(name);
      }
      break;
    case ServerReflectionRequest::kFileByFilename:
      if (const pb::FileDescriptor* file = pool->FindFileByName(request.file_by_filename())) {
        AnswerFile(file, sent, response);
      } else {
        SetError(response, grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("no file named '", request.file_by_filename(), "'"));
      }
      break;
    case ServerReflectionRequest::kFileContainingSymbol:
      if (const pb::FileDescriptor* file =
              pool->FindFileContainingSymbol(request.file_containing_symbol())) {
        AnswerFile(file, sent, response);
      } else {
        SetError(response, grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("no symbol '", request.file_containing_symbol(), "'"));
      }
      break;
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& asked = request.file_containing_extension();
      const pb::Descriptor* type = pool->FindMessageTypeByName(asked.containing_type());
      const pb::FieldDescriptor* extension =
          type ? pool->FindExtensionByNumber(type, asked.extension_number()) : nullptr;
      if (extension != nullptr) {
        AnswerFile(extension->file(), sent, response);
      } else {
        SetError(response, grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("no extension ", asked.extension_number(), " of '",
                              asked.containing_type(), "'"));
      }
      break;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const pb::Descriptor* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(response, grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("no message type '", request.all_extension_numbers_of_type(), "'"));
        break;
      }
      std::vector<const pb::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* numbers = response.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const pb::FieldDescriptor* e : extensions) numbers->add_extension_number(e->number());
      break;
    }
    default:
      SetError(response, grpc::StatusCode::INVALID_ARGUMENT,
               "the request names no question (file_by_filename, file_containing_symbol, "
               "file_containing_extension, all_extension_numbers_of_type or list_services)");
  }
  return response;
}

}  // namespace flotilla::coordinator
