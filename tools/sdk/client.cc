#include "tools/sdk/client.h"

#include <cstdlib>
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
  if (options.api_key.empty()) {
    const char* env = std::getenv("FLOTILLA_API_KEY");
    if (env != nullptr) options.api_key = env;
  }
  for (char c : options.api_key) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError("client: the API key must be printable ASCII, no spaces");
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  return std::unique_ptr<Client>(new Client(std::move(options), *std::move(credentials)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials)
    : options_(std::move(options)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  channel_ = grpc::CreateCustomChannel(options_.address, credentials, args);
  stub_ = v1::Flotilla::NewStub(channel_);
}

void Client::Prepare(grpc::ClientContext& ctx,
                     std::chrono::system_clock::time_point deadline) const {
  ctx.set_deadline(deadline);
  if (!options_.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + options_.api_key);
}

template <typename Request, typename Response, typename StartFn>
absl::Status Client::Stream(const Request& request, StartFn start,
                            const std::function<void(const Response&)>& on_chunk,
                            CancelHandle* cancel) {
  const auto deadline =
      std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options_.deadline);
  absl::Duration backoff = options_.retry_backoff;
  absl::Status last;
  for (int attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    grpc::ClientContext ctx;
    Prepare(ctx, deadline);
    if (cancel) cancel->Attach(&ctx);
    auto reader = start(&ctx, request);
    bool got_any = false;
    Response resp;
    while (reader->Read(&resp)) {
      got_any = true;
      on_chunk(resp);
    }
    grpc::Status st = reader->Finish();
    if (cancel) cancel->Detach();
    last = FromGrpc(st);
    // Retry only what cannot have produced tokens: UNAVAILABLE before the first message.
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

absl::Status Client::GenerateStream(
    const v1::GenerateRequest& request,
    const std::function<void(const v1::GenerateResponse&)>& on_chunk, CancelHandle* cancel) {
  return Stream<v1::GenerateRequest, v1::GenerateResponse>(
      request,
      [this](grpc::ClientContext* ctx, const v1::GenerateRequest& r) {
        return stub_->Generate(ctx, r);
      },
      on_chunk, cancel);
}

absl::Status Client::ChatStream(const v1::ChatRequest& request,
                                const std::function<void(const v1::ChatResponse&)>& on_chunk,
                                CancelHandle* cancel) {
  return Stream<v1::ChatRequest, v1::ChatResponse>(
      request,
      [this](grpc::ClientContext* ctx, const v1::ChatRequest& r) { return stub_->Chat(ctx, r); },
      on_chunk, cancel);
}

absl::StatusOr<ChatResult> Client::Chat(const v1::ChatRequest& request) {
  ChatResult r;
  absl::Status st = ChatStream(request, [&r](const v1::ChatResponse& resp) { r.Add(resp); });
  if (!st.ok()) return st;
  return r;
}

void ChatResult::Add(const v1::ChatResponse& resp) {
  if (!resp.request_id().empty()) request_id = resp.request_id();
  for (const v1::ChatDelta& d : resp.deltas()) {
    switch (d.delta_case()) {
      case v1::ChatDelta::kReasoning:
        reasoning += d.reasoning();
        break;
      case v1::ChatDelta::kContent:
        content += d.content();
        break;
      case v1::ChatDelta::kToolCall: {
        const v1::ToolCallDelta& t = d.tool_call();
        if (t.index() >= tool_calls.size()) tool_calls.resize(t.index() + 1);
        ChatToolCall& c = tool_calls[t.index()];
        if (!t.id().empty()) c.id = t.id();
        if (!t.name().empty()) c.name = t.name();
        c.arguments += t.arguments();
        break;
      }
      default:
        break;
    }
  }
  logprobs.insert(logprobs.end(), resp.logprobs().begin(), resp.logprobs().end());
  token_ids.insert(token_ids.end(), resp.token_ids().begin(), resp.token_ids().end());
  if (resp.finish_reason() != v1::ChatResponse::FINISH_REASON_UNSPECIFIED) {
    finish_reason = resp.finish_reason();
    prompt_tokens = resp.usage().prompt_tokens();
    completion_tokens = resp.usage().completion_tokens();
  }
}

v1::ChatMessage ChatResult::AsMessage() const {
  v1::ChatMessage m;
  m.set_role(v1::ChatMessage::ASSISTANT);
  m.set_content(content);
  m.set_reasoning(reasoning);
  for (const ChatToolCall& c : tool_calls) {
    v1::ToolCall* t = m.add_tool_calls();
    t->set_id(c.id);
    t->set_name(c.name);
    t->set_arguments(c.arguments);
  }
  return m;
}

v1::ChatMessage MakeChatMessage(v1::ChatMessage::Role role, std::string content) {
  v1::ChatMessage m;
  m.set_role(role);
  m.set_content(std::move(content));
  return m;
}

v1::ChatMessage MakeToolResult(std::string call_id, std::string content, std::string name) {
  v1::ChatMessage m;
  m.set_role(v1::ChatMessage::TOOL);
  m.set_tool_call_id(std::move(call_id));
  m.set_content(std::move(content));
  m.set_name(std::move(name));
  return m;
}

absl::StatusOr<GenerateResult> Client::Generate(const v1::GenerateRequest& request) {
  GenerateResult r;
  absl::Status st = GenerateStream(request, [&](const v1::GenerateResponse& resp) {
    if (!resp.request_id().empty()) r.request_id = resp.request_id();
    r.token_ids.insert(r.token_ids.end(), resp.token_ids().begin(), resp.token_ids().end());
    r.text += resp.text();
    r.logprobs.insert(r.logprobs.end(), resp.logprobs().begin(), resp.logprobs().end());
    r.prompt_logits.insert(r.prompt_logits.end(), resp.prompt_logits().begin(),
                           resp.prompt_logits().end());
    if (resp.finish_reason() != common::FINISH_REASON_UNSPECIFIED) {
      r.finish_reason = resp.finish_reason();
      r.prompt_tokens = resp.usage().prompt_tokens();
      r.completion_tokens = resp.usage().completion_tokens();
      if (resp.has_stop_token()) r.stop_token = resp.stop_token();
    }
  });
  if (!st.ok()) return st;
  return r;
}

absl::StatusOr<bool> Client::Cancel(const std::string& request_id) {
  grpc::ClientContext ctx;
  Prepare(ctx, std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::CancelRequest req;
  req.set_request_id(request_id);
  v1::CancelResponse resp;
  grpc::Status st = stub_->Cancel(&ctx, req, &resp);
  if (st.error_code() == grpc::StatusCode::NOT_FOUND) return false;
  if (!st.ok()) return FromGrpc(st);
  return resp.found();
}

absl::StatusOr<v1::ListModelsResponse> Client::ListModels() {
  grpc::ClientContext ctx;
  Prepare(ctx, std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListModelsResponse resp;
  grpc::Status st = stub_->ListModels(&ctx, v1::ListModelsRequest(), &resp);
  if (!st.ok()) return FromGrpc(st);
  return resp;
}

}  // namespace flotilla::client
