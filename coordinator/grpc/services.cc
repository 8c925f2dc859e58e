#include "coordinator/grpc/services.h"

#include <atomic>
#include <mutex>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_token.h"
#include "common/grpc_status.h"
#include "common/tokenizer/streaming_detokenizer.h"
#include "coordinator/access_log.h"
#include "coordinator/grpc/chat_pipeline.h"
#include "coordinator/grpc/generate_request.h"
#include "coordinator/grpc/grpc_auth.h"
#include "coordinator/grpc/prompt_logits_credit.h"
#include "coordinator/grpc/stream_queue.h"
#include "coordinator/request_session.h"
#include "coordinator/served_models.h"
#include "coordinator/session_request.h"
#include "spdlog/spdlog.h"

namespace flotilla::coordinator {
namespace {

// The access log's view of a request's events: tokens as they come, then
// each choice's finish.
void NoteEvent(AccessRecord& access, const RequestEvent& e) {
  if (e.kind == RequestEvent::Kind::kTokens) {
    access.AddOutputTokens(static_cast<uint32_t>(e.update->token_ids_size()), absl::Now());
  } else if (e.kind == RequestEvent::Kind::kFinish) {
    access.set_finish_reason(e.finish_reason);
  }
}

// The access log line of a call that ended with `st`.
void LogDone(AccessRecord& access, const absl::Status& st) {
  if (!st.ok()) access.set_finish_reason(FailedFinishReason(st));
  access.Log(absl::StatusCodeToString(st.code()), absl::Now());
}

std::string GrpcCodeName(const grpc::Status& status) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
}

using SessionReactorBase = grpc::ServerBidiReactor<cluster::WorkerMessage, cluster::CoordinatorMessage>;

// One worker's Session stream.
class SessionReactor final : public SessionReactorBase {
 public:
  explicit SessionReactor(ClusterManager* manager) : manager_(manager) {
    state_ = std::make_shared<State>(this);
    id_ = manager_->OnSessionOpened(state_);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The worker ended its side (or vanished): the manager marks it dead.
      closed_ = true;
      manager_->OnSessionClosed(id_);
      state_->queue.Close(grpc::Status::OK);
      return;
    }
    manager_->OnWorkerMessage(id_, in_);
    StartRead(&in_);
  }
  void OnWriteDone(bool ok) override { state_->queue.WriteDone(ok); }
  void OnDone() override {
    state_->queue.Detach();
    if (!closed_ && !state_->closed_by_manager) manager_->OnSessionClosed(id_);
    delete this;
  }

 private:
  struct State : WorkerSession {
    explicit State(SessionReactor* r) : queue(r) {}
    void Send(const cluster::CoordinatorMessage& m) override { queue.Send(m); }
    void Close(const absl::Status& status) override {
      closed_by_manager = true;
      queue.Close(ToGrpcStatus(status));
    }
    StreamQueue<SessionReactorBase, cluster::CoordinatorMessage> queue;
    std::atomic<bool> closed_by_manager{false};
  };

  ClusterManager* manager_;
  std::shared_ptr<State> state_;
  uint64_t id_ = 0;
  cluster::WorkerMessage in_;
  std::atomic<bool> closed_{false};
};

// A Session refused before it reached the manager (no cluster token).
class RefusedSession final : public SessionReactorBase {
 public:
  explicit RefusedSession(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// The deadline of a gRPC call, if it has one.
std::optional<absl::Time> CallDeadline(grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return std::nullopt;
  return absl::FromChrono(deadline);
}

// How close to its deadline a cancel counts as the deadline. The client's
// deadline passes first (the server's starts when the call arrives), and the
// client then cancels the stream: that cancel reaches the server about when
// the server's own deadline would pass, a little before or after.
constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(500);

// Why gRPC called OnCancel: a call that ended at its deadline is reported as
// a cancel, and is counted and logged as a deadline instead.
absl::Status ClientEnded(grpc::CallbackServerContext* context) {
  const std::optional<absl::Time> deadline = CallDeadline(context);
  if (deadline && absl::Now() + kDeadlineSlack >= *deadline) {
    return absl::DeadlineExceededError("the call's deadline passed");
  }
  return absl::CancelledError("the client cancelled the stream");
}

// The access log's view of a request's end.
void NoteEnd(AccessRecord& access, const RequestEvent& end) {
  access.set_output_tokens(end.usage.completion_tokens);
  LogDone(access, end.kind == RequestEvent::Kind::kError ? end.status : absl::OkStatus());
}

// The session a client stream feeds from, held weakly: a stream the bounds
// end (its client does not read) fails the session if it still runs.
class SessionLink {
 public:
  void Set(const std::shared_ptr<RequestSession>& session) {
    std::lock_guard<std::mutex> lock(mu_);
    session_ = session;
  }
  void Fail(const absl::Status& status) {
    std::shared_ptr<RequestSession> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live = session_.lock();
    }
    if (live) live->Fail(status);
  }
  void GrantPromptLogits(uint32_t choice, uint64_t allowed_bytes) {
    std::shared_ptr<RequestSession> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live = session_.lock();
    }
    if (live) live->GrantPromptLogits(choice, allowed_bytes);
  }

 private:
  std::mutex mu_;
  std::weak_ptr<RequestSession> session_;  // under mu_
};

// Starts the session of a client stream's `state` (a reactor's State: its
// backend, access record, reserved request id, queue and session link). When
// it cannot start, the id is released, the access log written and the stream
// closed with the error: null then.
template <typename State>
std::shared_ptr<RequestSession> StartSession(State& state, RequestRegistry* requests,
                                             const tokenizer::Tokenizer* tok,
                                             SessionRequest request, RequestSession::Sink sink,
                                             SessionHooks hooks) {
  absl::StatusOr<std::shared_ptr<RequestSession>> session = RequestSession::Start(
      &state.backend, tok, std::move(request), std::move(sink), std::move(hooks));
  if (!session.ok()) {
    requests->Remove(state.request_id);
    LogDone(*state.access, session.status());
    state.queue.Close(ToGrpcStatus(session.status()));
    return nullptr;
  }
  state.session.Set(*session);
  return *std::move(session);
}

using GenerateReactorBase = grpc::ServerWriteReactor<v1::GenerateResponse>;

// One client Generate stream: a RequestSession of plain text; each worker
// update of each of the n sequences becomes one response.
class GenerateReactor final : public GenerateReactorBase {
 public:
  GenerateReactor(ClusterManager* manager, grpc::CallbackServerContext* context,
                  const v1::GenerateRequest& request, const std::string& model_id,
                  const tokenizer::Tokenizer* tok, RequestRegistry* requests, const Caller& caller,
                  ClientBuffers* buffers, std::shared_ptr<void> admission, uint64_t cache_domain,
                  const DecodePool& decode)
      : context_(context), state_(std::make_shared<State>(this, context, manager)) {
    state_->admission = std::move(admission);
    if (buffers) state_->queue.SetAccount(buffers->Open(state_));
    state_->access->set_key(caller.key_id);
    absl::StatusOr<PreparedRequest> prepared = PrepareGenerate(request, model_id, *tok);
    if (!prepared.ok()) {
      Refuse(ToGrpcStatus(prepared.status()));
      return;
    }
    SessionContext session_context;
    session_context.deadline = CallDeadline(context);
    session_context.cache_domain = cache_domain;
    SessionRequest session_request = SessionRequestOf(*prepared, std::move(session_context));
    if (buffers != nullptr && request.return_prompt_logits()) {
      // The stream's window, shared by its choices.
      state_->credit = std::make_unique<PromptLogitsCredit>(PromptLogitsWindow(buffers->options()) /
                                                            session_request.n);
      session_request.submit.set_prompt_logits_credit_bytes(state_->credit->window());
    }
    state_->access->set_prompt_tokens(static_cast<uint32_t>(prepared->prompt.size()));
    state_->request_id = requests->Reserve(caller);
    state_->access->set_request_id(state_->request_id);
    std::shared_ptr<State> state = state_;
    SessionHooks hooks;
    hooks.run = decode.Runner();
    auto bound = std::make_shared<std::atomic<bool>>(false);
    hooks.on_accepted = [state, requests, bound](uint64_t id) {
      // Cancel by the public id reaches the first sequence; the session then ends them all.
      if (!bound->exchange(true)) requests->Bind(state->request_id, id);
    };
    auto sink = [state, requests](const std::vector<RequestEvent>& events) {
      for (const RequestEvent& e : events) {
        NoteEvent(*state->access, e);
        state->Handle(e, requests);
      }
      state->Flush();
    };
    session_ = StartSession(*state_, requests, tok, std::move(session_request), std::move(sink),
                            std::move(hooks));
  }

  void OnWriteDone(bool ok) override { state_->queue.WriteDone(ok); }
  void OnCancel() override {
    if (session_) session_->Fail(ClientEnded(context_));
  }
  void OnDone() override {
    state_->queue.Detach();
    delete this;
  }

 private:
  void Refuse(const grpc::Status& status) {
    state_->access->Log(GrpcCodeName(status), absl::Now());
    Finish(status);
  }
  struct State : BufferedStream {
    State(GenerateReactor* r, grpc::CallbackServerContext* context, ClusterManager* manager)
        : backend(manager), queue(r, context) {}
    // The client does not read: the stream ends now, then the request (its
    // kError finds the stream closed).
    void EndStalled(const absl::Status& status) override {
      queue.Abort(ToGrpcStatus(status));
      session.Fail(status);
    }
    void Drop() override { queue.Cancel(); }
    // One event of the session; responses wait in `pending` until Flush.
    void Handle(const RequestEvent& e, RequestRegistry* requests) {
      switch (e.kind) {
        case RequestEvent::Kind::kTokens: {
          // A stream being ended takes nothing more: no copy of its logits.
          if (!queue.accepting()) break;
          v1::GenerateResponse& r = pending.emplace_back();
          r.set_request_id(request_id);
          r.set_index(e.choice);
          *r.mutable_token_ids() = e.update->token_ids();
          *r.mutable_logprobs() = e.update->logprobs();
          // Prompt logits come in bounded chunks before the first token; each
          // chunk is one response.
          *r.mutable_prompt_logits() = e.update->prompt_logits();
          if (e.update->has_stop_token()) r.set_stop_token(e.update->stop_token());
          if (credit) Received(e.choice, *e.update);
          break;
        }
        case RequestEvent::Kind::kContent:
          if (v1::GenerateResponse* r = Last(e.choice)) r->mutable_text()->append(e.text);
          break;
        case RequestEvent::Kind::kFinish:
          if (v1::GenerateResponse* r = Last(e.choice)) {
            r->set_finish_reason(e.worker_reason);
            r->mutable_usage()->set_prompt_tokens(e.usage.prompt_tokens);
            r->mutable_usage()->set_completion_tokens(e.usage.completion_tokens);
          }
          break;
        case RequestEvent::Kind::kUsage:
        case RequestEvent::Kind::kError:
          Flush();
          requests->Remove(request_id);
          NoteEnd(*access, e);
          queue.Close(ToGrpcStatus(e.kind == RequestEvent::Kind::kError ? e.status
                                                                         : absl::OkStatus()));
          break;
        default:
          break;  // no reasoning or calls in plain text
      }
    }
    // The response being built for `choice`, if any.
    v1::GenerateResponse* Last(uint32_t choice) {
      for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
        if (it->index() == choice) return &*it;
      }
      return nullptr;
    }
    void Flush() {
      for (v1::GenerateResponse& r : pending) {
        const uint64_t logits_bytes = static_cast<uint64_t>(r.prompt_logits_size()) * sizeof(float);
        if (!credit || logits_bytes == 0) {
          queue.Send(std::move(r));
          continue;
        }
        // The state outlives the queue's messages (both end in OnDone).
        const uint32_t choice = r.index();
        queue.Send(std::move(r), [this, choice, logits_bytes] { Taken(choice, logits_bytes); });
      }
      pending.clear();
    }
    // Prompt-logits credit, per choice: an update of its sequence arrived;
    // the client took a message of its prompt logits.
    void Received(uint32_t choice, const cluster::SequenceUpdate& u) {
      const bool prompt_done = u.token_ids_size() > 0 || u.has_stop_token() ||
                               u.finish_reason() != common::FINISH_REASON_UNSPECIFIED;
      credit->Received(choice, static_cast<uint64_t>(u.prompt_logits_size()) * sizeof(float),
                       prompt_done);
      queue.SetProducerWaiting(credit->waiting());
    }
    void Taken(uint32_t choice, uint64_t bytes) {
      if (const uint64_t allowed = credit->Taken(choice, bytes); allowed != 0) {
        session.GrantPromptLogits(choice, allowed);
      }
      queue.SetProducerWaiting(credit->waiting());
    }
    std::shared_ptr<AccessRecord> access =
        std::make_shared<AccessRecord>("grpc Generate", absl::Now());
    // The session's backend: here, not in the reactor, since the stream may
    // end (a client that does not read) while the session still runs.
    ClusterBackend backend;
    StreamQueue<GenerateReactorBase, v1::GenerateResponse> queue;
    std::vector<v1::GenerateResponse> pending;  // used from the session's sink, one call at a time
    // With return_prompt_logits (and flow control): each choice's credit.
    std::unique_ptr<PromptLogitsCredit> credit;
    std::string request_id;                     // the client's (random) id; set before Start
    std::shared_ptr<void> admission;            // counts the request open until the stream ends
    SessionLink session;
  };
  grpc::CallbackServerContext* const context_;  // lives until OnDone
  std::shared_ptr<State> state_;
  std::shared_ptr<RequestSession> session_;
};

using ChatReactorBase = grpc::ServerWriteReactor<v1::ChatResponse>;

// One client Chat stream: the request goes through the OpenAI pipeline
// (Harmony renderer) into a RequestSession, whose events become the stream
// (ChatStream); each worker update becomes at most one response.
class ChatReactor final : public ChatReactorBase {
 public:
  ChatReactor(ClusterManager* manager, grpc::CallbackServerContext* context,
              const v1::ChatRequest& request, const std::string& model_id,
              const tokenizer::Tokenizer* tok, const harmony::OpenAiRequestOptions& harmony,
              const std::string& call_id_salt, RequestRegistry* requests, const Caller& caller,
              size_t max_prompt_text_bytes, ClientBuffers* buffers, std::shared_ptr<void> admission,
              uint64_t cache_domain, const DecodePool& decode)
      : context_(context) {
    auto access = std::make_shared<AccessRecord>("grpc Chat", absl::Now());
    access->set_key(caller.key_id);
    absl::StatusOr<PreparedRequest> prepared =
        PrepareChat(request, model_id, *tok, harmony, max_prompt_text_bytes);
    if (!prepared.ok()) {
      LogDone(*access, prepared.status());
      Finish(ToGrpcStatus(prepared.status()));
      return;
    }
    const std::string request_id = requests->Reserve(caller);
    const std::string call_id_seed = absl::StrCat("chat-", call_id_salt, "-", request_id);
    state_ = std::make_shared<State>(this, context, manager, request_id,
                                     ChatStream(tok, request_id, call_id_seed, prepared->stop,
                                                static_cast<uint32_t>(prepared->prompt.size()),
                                                request.return_token_ids(), prepared->n));
    state_->admission = std::move(admission);
    if (buffers) state_->queue.SetAccount(buffers->Open(state_));
    state_->access = access;
    access->set_request_id(request_id);
    access->set_prompt_tokens(static_cast<uint32_t>(prepared->prompt.size()));
    SessionContext session_context;
    session_context.call_id_seed = call_id_seed;
    session_context.deadline = CallDeadline(context);
    session_context.cache_domain = cache_domain;
    SessionRequest session_request = SessionRequestOf(*prepared, std::move(session_context));
    std::shared_ptr<State> state = state_;
    SessionHooks hooks;
    hooks.run = decode.Runner();
    hooks.on_accepted = [state, requests](uint64_t id) { requests->Bind(state->request_id, id); };
    auto sink = [state, requests](const std::vector<RequestEvent>& events) {
      for (const RequestEvent& e : events) NoteEvent(*state->access, e);
      std::lock_guard<std::mutex> lock(state->mu);
      state->StartLocked();
      for (v1::ChatResponse& r : state->stream.Consume(events)) state->queue.Send(std::move(r));
      const RequestEvent& last = events.back();
      if (last.kind == RequestEvent::Kind::kUsage || last.kind == RequestEvent::Kind::kError) {
        requests->Remove(state->request_id);
        NoteEnd(*state->access, last);
        state->EndLocked(last);
      }
    };
    session_ = StartSession(*state_, requests, tok, std::move(session_request), std::move(sink),
                            std::move(hooks));
    if (!session_) return;
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->StartLocked();
  }

  void OnWriteDone(bool ok) override { state_->queue.WriteDone(ok); }
  void OnCancel() override {
    if (state_) state_->client_gone = true;
    if (session_) session_->Fail(ClientEnded(context_));
  }
  void OnDone() override {
    if (state_) state_->queue.Detach();
    delete this;
  }

 private:
  struct State : BufferedStream {
    State(ChatReactor* r, grpc::CallbackServerContext* context, ClusterManager* manager,
          std::string request_id, ChatStream stream)
        : backend(manager),
          queue(r, context),
          request_id(std::move(request_id)),
          stream(std::move(stream)) {}
    // As GenerateReactor's: the stream ends now, then the request.
    void EndStalled(const absl::Status& status) override {
      queue.Abort(ToGrpcStatus(status));
      session.Fail(status);
    }
    void Drop() override { queue.Cancel(); }
    // The request was submitted: the stream begins (once) with a message naming it.
    void StartLocked() {
      if (started) return;
      started = true;
      queue.Send(stream.Begin());
    }
    // The session's terminal event ends the stream.
    void EndLocked(const RequestEvent& end) {
      if (end.kind == RequestEvent::Kind::kUsage || stream.finished()) {
        queue.Close(grpc::Status::OK);
      } else if (end.status.code() == absl::StatusCode::kCancelled && !client_gone) {
        // Cancelled by id while this stream is still open: say so in-band.
        queue.Send(stream.Cancelled());
        queue.Close(grpc::Status::OK);
      } else {
        queue.Close(ToGrpcStatus(end.status));
      }
    }
    ClusterBackend backend;  // as GenerateReactor's: outlives the stream
    StreamQueue<ChatReactorBase, v1::ChatResponse> queue;
    const std::string request_id;  // the client's (random) id
    std::shared_ptr<AccessRecord> access;
    std::mutex mu;
    ChatStream stream;     // under mu
    bool started = false;  // under mu
    std::atomic<bool> client_gone{false};
    std::shared_ptr<void> admission;  // counts the request open until the stream ends
    SessionLink session;
  };
  grpc::CallbackServerContext* const context_;  // lives until OnDone
  std::shared_ptr<State> state_;
  std::shared_ptr<RequestSession> session_;
};

}  // namespace

FrontendService::FrontendService(ClusterManager* manager, std::string model_id,
                                 const tokenizer::Tokenizer* tokenizer,
                                 harmony::OpenAiRequestOptions harmony, const Authenticator* auth)
    : manager_(manager),
      model_id_(std::move(model_id)),
      tokenizer_(tokenizer),
      harmony_(std::move(harmony)),
      auth_(auth),
      decode_pool_(std::make_unique<DecodePool>(DecodePool::DefaultThreads())) {
  std::random_device rd;
  call_id_salt_ = absl::StrCat(absl::Hex(static_cast<uint64_t>(rd()) << 32 | rd()));
}

grpc::ServerWriteReactor<v1::ChatResponse>* FrontendService::Chat(
    grpc::CallbackServerContext* context, const v1::ChatRequest* request) {
  absl::StatusOr<Caller> caller = AuthenticateCall(auth_, context, *request);
  if (!caller.ok()) return new RefusedStream<v1::ChatResponse>(ToGrpcStatus(caller.status()));
  absl::Status st = CheckRequestBytes(request->ByteSizeLong(), limits_.max_request_bytes);
  if (st.ok()) st = CheckCacheSalt(request->cache_salt());
  if (!st.ok()) return new RefusedStream<v1::ChatResponse>(ToGrpcStatus(st));
  absl::StatusOr<std::shared_ptr<void>> admission = Admit();
  if (!admission.ok()) return new RefusedStream<v1::ChatResponse>(ToGrpcStatus(admission.status()));
  return new ChatReactor(
      manager_, context, *request, ModelFor(request->model()), tokenizer_, harmony_, call_id_salt_,
      &requests_, *caller, limits_.max_prompt_text_bytes, buffers_.get(), *std::move(admission),
      CacheDomain(request->cache_salt(), caller->key_id, cache_domains_), *decode_pool_);
}

grpc::ServerBidiReactor<cluster::WorkerMessage, cluster::CoordinatorMessage>*
ClusterControlService::Session(grpc::CallbackServerContext* context) {
  if (cluster_token_) {
    const auto& metadata = context->client_metadata();
    auto it = metadata.find(kClusterTokenMetadataKey);
    const bool presented = it != metadata.end();
    if (!presented ||
        !TokensEqual(std::string_view(it->second.data(), it->second.size()), *cluster_token_)) {
      spdlog::warn("refused a worker session from {}: {} cluster token", context->peer(),
                   presented ? "wrong" : "no");
      return new RefusedSession(grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          presented ? "this is not the cluster token of this coordinator"
                    : "this coordinator requires a cluster token (--cluster-token-file)"));
    }
  }
  return new SessionReactor(manager_);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* FrontendService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  absl::StatusOr<Caller> caller = AuthenticateCall(auth_, context, *request);
  if (!caller.ok()) return new RefusedStream<v1::GenerateResponse>(ToGrpcStatus(caller.status()));
  // Sizes first: refusing a 100 MiB text must not cost its tokenisation.
  absl::Status st = CheckRequestBytes(request->ByteSizeLong(), limits_.max_request_bytes);
  if (st.ok() && request->prompt_case() == v1::GenerateRequest::kText) {
    st = CheckPromptTextBytes(request->text().size(), limits_.max_prompt_text_bytes, "prompt text");
  }
  if (st.ok()) st = CheckCacheSalt(request->cache_salt());
  if (!st.ok()) return new RefusedStream<v1::GenerateResponse>(ToGrpcStatus(st));
  absl::StatusOr<std::shared_ptr<void>> admission = Admit();
  if (!admission.ok()) {
    return new RefusedStream<v1::GenerateResponse>(ToGrpcStatus(admission.status()));
  }
  return new GenerateReactor(manager_, context, *request, ModelFor(request->model()), tokenizer_,
                             &requests_, *caller, buffers_.get(), *std::move(admission),
                             CacheDomain(request->cache_salt(), caller->key_id, cache_domains_),
                             *decode_pool_);
}

grpc::ServerUnaryReactor* FrontendService::Cancel(grpc::CallbackServerContext* context,
                                                  const v1::CancelRequest* request,
                                                  v1::CancelResponse* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = AuthenticateCall(auth_, context, *request);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  // Another key's request is answered as an unknown one: its existence is not told.
  std::optional<uint64_t> id = requests_.Find(request->request_id(), *caller);
  if (!id || !manager_->Cancel(*id, "cancelled by the client")) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 "no running request of yours has this request_id"));
    return reactor;
  }
  response->set_found(true);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

absl::StatusOr<std::shared_ptr<void>> FrontendService::Admit() {
  if (!buffers_) return std::shared_ptr<void>();
  return buffers_->Admit();
}

const std::string& FrontendService::ModelFor(const std::string& requested) const {
  return served_names_.empty() ? model_id_ : ResolveModelName(served_names_, requested);
}

grpc::ServerUnaryReactor* FrontendService::ListModels(grpc::CallbackServerContext* context,
                                                      const v1::ListModelsRequest* request,
                                                      v1::ListModelsResponse* response) {
  if (absl::StatusOr<Caller> caller = AuthenticateCall(auth_, context, *request); !caller.ok()) {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  admin::ClusterStatus s = manager_->Status();
  const char* state = "waiting";
  switch (s.state()) {
    case admin::READY: state = "ready"; break;
    case admin::LOADING: state = "loading"; break;
    case admin::DEGRADED: state = "degraded"; break;
    case admin::PLACEMENT_REFUSED: state = "refused"; break;
    default: break;
  }
  for (const std::string& name : served_names_.empty() ? std::vector<std::string>{model_id_} : served_names_) {
    v1::ModelInfo* m = response->add_models();
    m->set_id(name);
    m->set_vocab_size(manager_->options().model.vocab_size);
    m->set_max_context(MaxModelLen(manager_->options()));
    m->set_state(state);
  }
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace flotilla::coordinator
