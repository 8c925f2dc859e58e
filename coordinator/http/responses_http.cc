#include "coordinator/http/responses_http.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "coordinator/access_log.h"
#include "coordinator/http/held_stream.h"
#include "coordinator/http/openai_pipeline.h"
#include "coordinator/http/responses_request.h"
#include "coordinator/http/responses_stream.h"
#include "coordinator/input_limits.h"
#include "coordinator/request_registry.h"
#include "coordinator/served_models.h"
#include "coordinator/session_request.h"
#include "spdlog/spdlog.h"

namespace flotilla::coordinator {
namespace {

// One response being generated: the serializer of its RequestSession's
// events, which the session delivers on a transport thread.
struct ResponseGeneration : HttpAnswer {
  std::unique_ptr<ResponsesStream> builder;
  // background: true: answered when it starts; the store has it from then
  // on, with how to cancel it, and the client's leaving does not cancel it.
  bool background = false;
  // Kept in `store` under `id` for `owner` once finished (null: not stored).
  ResponseStore* store = nullptr;
  std::string id;
  std::string owner;
  Json conversation;  // the history and this request's input items
  std::weak_ptr<RequestSession> session;  // what a cancel stops
};

ApiError ResponsesError(const absl::Status& status) {
  ApiError e = ErrorFromStatus(status);
  if (e.code == kContextLengthExceeded) e.param = "input";
  if (e.param == "previous_response_id") e.code = "previous_response_not_found";
  return e;
}

std::string ResponseEvents(const std::vector<Json>& events) {
  std::string text;
  for (const Json& e : events) {
    absl::StrAppend(&text, "event: ", e["type"].get<std::string>(), "\ndata: ", DumpJson(e),
                    "\n\n");
  }
  return text;
}

// Stores the response as it now is: `cancel` set while it runs in the background.
void StoreLocked(ResponseGeneration& g, std::function<Json()> cancel = nullptr) {
  Json items = g.conversation;
  if (g.builder->finished()) {
    for (const Json& item : g.builder->output()) items.push_back(item);
  }
  g.store->Put(g.id, g.owner,
               ResponseStore::Stored{g.builder->Response(), std::move(items), std::move(cancel)});
}

// A background response that ended without a finish says so in its status
// (it has no request left to answer with an error): "cancelled" when its
// owner cancelled it, else "failed" with `error` (a worker lost, the server
// stopping); its stream gets the items' closing events.
void AbortBackgroundLocked(ResponseGeneration& g, const char* status, Json error) {
  std::vector<Json> closing = g.builder->Abort(status, std::move(error));
  if (g.stream) EmitLocked(g, ResponseEvents(closing));
}

// The `error` of a failed background response.
Json FailureJson(const absl::Status& status) {
  const ApiError e = ResponsesError(status);
  return Json{{"code", e.code.empty() ? "server_error" : e.code}, {"message", e.message}};
}

// Ends the answer (under g.mu): OK after a finish, else the error that ended it.
void EndResponseLocked(ResponseGeneration& g, const absl::Status& status) {
  if (g.ended) return;
  g.ended = true;
  if (!status.ok() && g.background) AbortBackgroundLocked(g, "failed", FailureJson(status));
  if (g.store != nullptr && (status.ok() || g.background)) StoreLocked(g);
  if (g.stream) {
    if (!status.ok()) {
      const ApiError e = ResponsesError(status);
      EmitLocked(g, ResponseEvents({g.builder->ErrorEvent(e.code, e.message, e.param)}));
    }
    if (g.begun) g.exchange->End();
    return;
  }
  if (g.background) return;  // answered when it started
  HttpResponse res;
  if (!status.ok()) {
    res = ErrorResponse(ResponsesError(status));
  } else {
    res.status = 200;
    res.set_content(DumpJson(g.builder->Response()), "application/json");
  }
  g.TagIgnored(res);
  g.exchange->Send(std::move(res));
}

// Sends the SSE head and what was produced before it.
void BeginStream(ResponseGeneration& g) {
  HttpResponse head;
  head.content_type = "text/event-stream";
  head.set_header("Cache-Control", "no-cache");
  head.set_header("X-Accel-Buffering", "no");
  g.TagIgnored(head);
  std::lock_guard<std::mutex> l(g.mu);
  g.exchange->BeginStream(std::move(head));
  std::string text = std::exchange(g.held, std::string());
  g.begun = true;
  if (!text.empty()) g.exchange->Write(std::move(text));
  if (g.ended) g.exchange->End();
}

// The request, its history and the prepared submission; errors as answered.
struct Prepared {
  ResponsesRequest request;
  Json history = Json::array();
  PreparedRequest chat;
};

absl::StatusOr<Prepared> Prepare(const ResponsesHttpContext& context, const HttpRequest& req,
                                 const std::string& owner) {
  absl::StatusOr<Json> body = ParseBody(req.body);
  if (!body.ok()) return body.status();
  absl::StatusOr<ResponsesRequest> request =
      ParseResponsesRequest(*body, context.cipher, context.unknown_fields);
  if (!request.ok()) return request.status();
  Prepared out;
  out.request = *std::move(request);
  if (!out.request.previous_response_id.empty()) {
    absl::StatusOr<ResponseStore::Stored> previous =
        context.store->Get(out.request.previous_response_id, owner);
    if (!previous.ok()) return previous.status();
    if (previous->cancel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "previous_response_id: response '", out.request.previous_response_id,
          "' is still being generated in the background; poll GET /v1/responses/",
          out.request.previous_response_id, " until its status is no longer in_progress"));
    }
    out.history = std::move(previous->items);
  }
  const Json* model = body->contains("model") ? &(*body)["model"] : nullptr;
  const std::string& model_id =
      model != nullptr && model->is_string()
          ? ResolveModelName(context.served_model_names, model->get_ref<const std::string&>())
          : context.model_id;
  absl::StatusOr<PreparedRequest> chat =
      PrepareResponsesRequest(out.request, out.history, model_id, *context.tokenizer,
                              context.harmony, context.max_prompt_text_bytes);
  if (!chat.ok()) return chat.status();
  out.chat = *std::move(chat);
  return out;
}

std::shared_ptr<ResponseGeneration> NewGeneration(const ResponsesHttpContext& context,
                                                  std::shared_ptr<HttpExchange> exchange,
                                                  const std::string& id, const std::string& owner,
                                                  Prepared& p) {
  auto g = std::make_shared<ResponseGeneration>();
  g->Open(std::move(exchange), p.chat.ignored_fields);
  g->stream = p.request.stream;
  g->background = p.request.background;
  g->id = id;
  g->access->set_request_id(id);
  g->access->set_prompt_tokens(static_cast<uint32_t>(p.chat.prompt.size()));
  g->builder = std::make_unique<ResponsesStream>(
      id, context.model_id, ResponseSettings(p.request), absl::ToUnixSeconds(absl::Now()),
      p.request.encrypted_reasoning ? context.cipher : nullptr);
  if (p.request.store) {
    g->store = context.store;
    g->owner = owner;
    g->conversation = std::move(p.history);
    for (const Json& item : p.request.input_items) g->conversation.push_back(item);
  }
  return g;
}

// POST /v1/responses/{id}/cancel of a background response: ends it as
// cancelled (stored so, its stream closed) unless it ended first, then
// stops its sequences; the response as it then is.
Json CancelGeneration(const std::shared_ptr<ResponseGeneration>& g) {
  std::shared_ptr<RequestSession> session;
  Json response;
  {
    std::lock_guard<std::mutex> l(g->mu);
    if (!g->ended) {
      g->ended = true;
      AbortBackgroundLocked(*g, "cancelled", nullptr);
      StoreLocked(*g);
      if (g->stream) {
        EmitLocked(*g, ResponseEvents({g->builder->ErrorEvent(
                           "response_cancelled",
                           "the response was cancelled (POST /v1/responses/{id}/cancel)", "")}));
        if (g->begun) g->exchange->End();
      }
      session = g->session.lock();
    }
    response = g->builder->Response();
  }
  if (session) session->Cancel("cancelled with POST /v1/responses/{id}/cancel");
  return response;
}

// A background response whose session started: stored as in progress (with
// how to cancel it) unless it already ended, and answered at once (or its
// stream begun). The client's leaving does not cancel it.
void StartBackground(const std::shared_ptr<ResponseGeneration>& g,
                     std::shared_ptr<RequestSession> session) {
  {
    std::lock_guard<std::mutex> l(g->mu);
    g->session = session;
    if (!g->ended) StoreLocked(*g, [g] { return CancelGeneration(g); });
    if (!g->stream) {
      HttpResponse res;
      res.set_content(DumpJson(g->builder->Response()), "application/json");
      g->TagIgnored(res);
      g->exchange->Send(std::move(res));
    }
  }
  if (g->stream) BeginStream(*g);
}

// `stream=true` in the query of GET /v1/responses/{id} (OpenAI's resumed stream).
bool AsksForStream(const std::string& target) {
  const size_t query = target.find('?');
  if (query == std::string::npos) return false;
  for (absl::string_view param : absl::StrSplit(target.substr(query + 1), '&')) {
    if (param == "stream=true" || param == "stream=1") return true;
  }
  return false;
}

}  // namespace

void ServeResponses(const ResponsesHttpContext& context, std::shared_ptr<HttpExchange> exchange,
                    const std::string& owner, std::optional<absl::Time> deadline,
                    SessionHooks hooks) {
  absl::StatusOr<Prepared> prepared = Prepare(context, exchange->request(), owner);
  if (!prepared.ok()) return exchange->Send(ErrorResponse(ResponsesError(prepared.status())));
  const std::string id = absl::StrCat("resp_", RandomId());
  std::shared_ptr<ResponseGeneration> g = NewGeneration(context, exchange, id, owner, *prepared);
  if (g->stream) g->held = ResponseEvents(g->builder->Begin());

  ++*context.in_flight;
  // One Harmony choice; the response id seeds the call ids, as chat's does.
  // A background response outlives its request, and the request's deadline.
  // prompt_cache_key, else the x-session-id header: routed together.
  SessionContext session_context;
  session_context.call_id_seed = id;
  session_context.deadline = g->background ? std::nullopt : deadline;
  session_context.cache_domain =
      CacheDomain(prepared->chat.cache_salt, owner, context.cache_domains);
  session_context.default_route_key = exchange->request().get_header_value("x-session-id");
  SessionRequest request = SessionRequestOf(prepared->chat, std::move(session_context));
  absl::StatusOr<std::shared_ptr<RequestSession>> started = RequestSession::Start(
      context.backend, context.tokenizer, std::move(request),
      [g](const std::vector<RequestEvent>& events) {
        ConsumeEvents(*g, events, ResponseEvents, EndResponseLocked);
      },
      std::move(hooks));
  if (!started.ok()) {
    --*context.in_flight;
    return exchange->Send(ErrorResponse(ResponsesError(started.status())));
  }
  std::shared_ptr<RequestSession> session = *std::move(started);
  if (g->background) return StartBackground(g, std::move(session));
  if (g->stream) BeginStream(*g);
  // A client that goes away cancels its request.
  exchange->OnClientGone([session] { session->Cancel("the HTTP client disconnected"); });
}

HttpResponse RetrieveResponse(const ResponsesHttpContext& context, const std::string& id,
                              const std::string& owner, const std::string& target) {
  absl::StatusOr<ResponseStore::Stored> stored = context.store->Get(id, owner, "response_id");
  if (!stored.ok()) return ErrorResponse(ResponsesError(stored.status()));
  if (AsksForStream(target)) {
    return ErrorResponse(ResponsesError(absl::InvalidArgumentError(
        "stream: resuming a response's stream is not supported; poll GET /v1/responses/{id} "
        "without stream until its status is no longer in_progress")));
  }
  HttpResponse res;
  res.set_content(DumpJson(stored->response), "application/json");
  return res;
}

HttpResponse DeleteResponse(const ResponsesHttpContext& context, const std::string& id,
                            const std::string& owner) {
  absl::StatusOr<ResponseStore::Stored> stored = context.store->Get(id, owner, "response_id");
  if (!stored.ok()) return ErrorResponse(ResponsesError(stored.status()));
  // A running background response stops first, so its end does not store it again.
  if (stored->cancel) stored->cancel();
  if (absl::Status st = context.store->Delete(id, owner); !st.ok())
    return ErrorResponse(ResponsesError(st));
  HttpResponse res;
  res.set_content(DumpJson(Json{{"id", id}, {"object", "response"}, {"deleted", true}}),
                  "application/json");
  return res;
}

HttpResponse CancelResponse(const ResponsesHttpContext& context, const std::string& id,
                            const std::string& owner) {
  absl::StatusOr<ResponseStore::Stored> stored = context.store->Get(id, owner, "response_id");
  if (!stored.ok()) return ErrorResponse(ResponsesError(stored.status()));
  HttpResponse res;
  if (stored->cancel) {
    res.set_content(DumpJson(stored->cancel()), "application/json");
    return res;
  }
  const Json& response = stored->response;
  if (response.value("background", false) != true) {
    return ErrorResponse(ResponsesError(absl::InvalidArgumentError(absl::StrCat(
        "response_id: response '", id,
        "' was not created with background: true; only background responses can be cancelled"))));
  }
  if (response.value("status", "") != "cancelled") {
    return ErrorResponse(ResponsesError(absl::InvalidArgumentError(
        absl::StrCat("response_id: response '", id, "' cannot be cancelled: its status is ",
                     response.value("status", Json()).dump()))));
  }
  res.set_content(DumpJson(response), "application/json");  // cancelling twice: the same answer
  return res;
}

}  // namespace flotilla::coordinator
