#include "tools/sdk/client.h"

#include <thread>

#include "absl/strings/str_cat.h"

namespace flotilla::client {
namespace {

absl::Status FromGrpc(const grpc::Status& st) {
  if (st.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
}

}  // namespace

void CancelHandle::Cancel() {
  cancelled_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (ctx_) ctx_->TryCancel();
}

void CancelHandle::Attach(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_ = ctx;
  if (cancelled_) ctx_->TryCancel();
}

void CancelHandle::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_ = nullptr;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  if (options.address.empty()) return absl::InvalidArgumentError("client: empty address");
  if (options.max_attempts < 1) return absl::InvalidArgumentError("client: max_attempts < 1");
  return std::unique_ptr<Client>(new Client(std::move(options)));
}

Client::Client(ClientOptions options) : options_(std::move(options)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  channel_ = grpc::CreateCustomChannel(options_.address, grpc::InsecureChannelCredentials(), args);
  stub_ = v1::Flotilla::NewStub(channel_);
}

absl::Status Client::GenerateStream(const v1::GenerateRequest& request,
                                    const std::function<void(const v1::GenerateResponse&)>& on_chunk,
                                    CancelHandle* cancel) {
  const auto deadline =
      std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options_.deadline);
  absl::Duration backoff = options_.retry_backoff;
  absl::Status last;
  for (int attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    if (cancel) cancel->Attach(&ctx);
    auto reader = stub_->Generate(&ctx, request);
    bool got_any = false;
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      got_any = true;
      on_chunk(resp);
    }
    grpc::Status st = reader->Finish();
    if (cancel) cancel->Detach();
    last = FromGrpc(st);
    // Retry only what cannot have produced tokens: UNAVAILABLE before the first one.
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE || got_any ||
        (cancel && cancel->cancelled()) || attempt == options_.max_attempts ||
        std::chrono::system_clock::now() + absl::ToChronoMilliseconds(backoff) > deadline) {
      return last;
    }
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
    backoff *= 2;
  }
  return last;
}

absl::StatusOr<GenerateResult> Client::Generate(const v1::GenerateRequest& request) {
  GenerateResult r;
  absl::Status st = GenerateStream(request, [&](const v1::GenerateResponse& resp) {
    if (!resp.request_id().empty()) r.request_id = resp.request_id();
    r.token_ids.insert(r.token_ids.end(), resp.token_ids().begin(), resp.token_ids().end());
    r.text += resp.text();
    r.logprobs.insert(r.logprobs.end(), resp.logprobs().begin(), resp.logprobs().end());
    if (resp.finish_reason() != common::FINISH_REASON_UNSPECIFIED) {
      r.finish_reason = resp.finish_reason();
      r.prompt_tokens = resp.usage().prompt_tokens();
      r.completion_tokens = resp.usage().completion_tokens();
      if (resp.has_stop_token()) r.stop_token = resp.stop_token();
      r.prompt_logits.assign(resp.prompt_logits().begin(), resp.prompt_logits().end());
    }
  });
  if (!st.ok()) return st;
  return r;
}

absl::StatusOr<bool> Client::Cancel(const std::string& request_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::CancelRequest req;
  req.set_request_id(request_id);
  v1::CancelResponse resp;
  grpc::Status st = stub_->Cancel(&ctx, req, &resp);
  if (!st.ok()) return FromGrpc(st);
  return resp.found();
}

absl::StatusOr<v1::ListModelsResponse> Client::ListModels() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListModelsResponse resp;
  grpc::Status st = stub_->ListModels(&ctx, v1::ListModelsRequest(), &resp);
  if (!st.ok()) return FromGrpc(st);
  return resp;
}

}  // namespace flotilla::client
