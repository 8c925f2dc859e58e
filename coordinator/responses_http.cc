#include "coordinator/responses_http.h"

#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grammar/constraint_proto.h"
#include "coordinator/access_log.h"
#include "coordinator/input_limits.h"
#include "coordinator/openai_pipeline.h"
#include "coordinator/request_registry.h"
#include "coordinator/responses_request.h"
#include "coordinator/responses_stream.h"
#include "coordinator/served_models.h"

namespace flotilla::coordinator {
namespace {

// One response being generated. The manager's callbacks only queue updates
// (they run on a worker session's gRPC thread); Pump turns them into bytes
// on a transport thread. Everything below `mu` is guarded by it.
struct ResponseGeneration {
  std::mutex mu;
  std::deque<cluster::SequenceUpdate> updates;  // not yet pumped
  bool pumping = false;
  bool done = false;  // on_done came, with done_status
  absl::Status done_status;
  std::shared_ptr<HttpExchange> exchange;
  std::shared_ptr<AccessRecord> access;
  std::unique_ptr<ResponsesStream> builder;
  std::atomic<uint64_t> request_id{0};
  uint32_t prompt_tokens = 0;
  bool stream = false;
  bool begun = false;  // streams: the head went out
  std::string held;    // streams: events produced before the head
  bool ended = false;  // the whole answer was produced
  // Kept in `store` under the response id once finished (null: not stored).
  ResponseStore* store = nullptr;
  Json conversation;  // the history and this request's input items
};

ApiError ResponsesError(const absl::Status& status) {
  ApiError e = ErrorFromStatus(status);
  if (e.code == kContextLengthExceeded) e.param = "input";
  if (e.param == "previous_response_id") e.code = "previous_response_not_found";
  return e;
}

HttpResponse ErrorResponse(const absl::Status& status) {
  const ApiError e = ResponsesError(status);
  HttpResponse res;
  res.status = e.http_status;
  res.set_content(DumpJson(ErrorJson(e)), "application/json");
  return res;
}

std::string Events(const std::vector<Json>& events) {
  std::string text;
  for (const Json& e : events) {
    absl::StrAppend(&text, "event: ", e["type"].get<std::string>(), "\ndata: ", DumpJson(e),
                    "\n\n");
  }
  return text;
}

// Streams: sends `text` now, or holds it until the head went out.
void EmitLocked(ResponseGeneration& g, std::string text) {
  if (text.empty()) return;
  if (!g.begun) {
    g.held += text;
    return;
  }
  g.exchange->Write(std::move(text));
}

// Ends the answer (under g.mu): OK after a finish, else the error that ended it.
void EndLocked(ResponseGeneration& g, const absl::Status& status) {
  if (g.ended) return;
  g.ended = true;
  if (status.ok() && g.store != nullptr) {
    Json items = g.conversation;
    for (const Json& item : g.builder->output()) items.push_back(item);
    g.store->Put(g.builder->Response()["id"].get<std::string>(), std::move(items));
  }
  if (g.stream) {
    if (!status.ok()) {
      const ApiError e = ResponsesError(status);
      EmitLocked(g, Events({g.builder->ErrorEvent(e.code, e.message, e.param)}));
    }
    if (g.begun) g.exchange->End();
    return;
  }
  if (!status.ok()) return g.exchange->Send(ErrorResponse(status));
  HttpResponse res;
  res.status = 200;
  res.set_content(DumpJson(g.builder->Response()), "application/json");
  g.exchange->Send(std::move(res));
}

// Feeds one update; returns the events it produced.
std::vector<Json> DrainUpdate(ResponseGeneration& g, const cluster::SequenceUpdate& u) {
  if (g.builder->finished() || u.finish_reason() == common::ERROR) return {};
  std::vector<Json> out = g.builder->FeedUpdate(u);
  if (u.finish_reason() == common::FINISH_REASON_UNSPECIFIED) return out;
  std::optional<tokenizer::TokenId> stop;
  if (u.has_stop_token()) stop = static_cast<tokenizer::TokenId>(u.stop_token());
  std::vector<Json> last = g.builder->Finish(
      u.finish_reason(), stop, u.prompt_tokens() ? u.prompt_tokens() : g.prompt_tokens,
      u.completion_tokens());
  out.insert(out.end(), std::make_move_iterator(last.begin()), std::make_move_iterator(last.end()));
  g.access->set_output_tokens(u.completion_tokens());
  g.access->set_finish_reason(u.finish_reason() == common::LENGTH ? "length" : "stop");
  return out;
}

// Turns the queued updates (and the end, once on_done came) into the answer;
// one Pump at a time per generation.
void Pump(const std::shared_ptr<ResponseGeneration>& g) {
  std::lock_guard<std::mutex> l(g->mu);
  while (!g->updates.empty() || (g->done && !g->ended)) {
    std::deque<cluster::SequenceUpdate> updates;
    updates.swap(g->updates);
    std::string text;
    for (const cluster::SequenceUpdate& u : updates) {
      if (g->ended) break;
      text += Events(DrainUpdate(*g, u));
    }
    if (!g->ended && g->stream) EmitLocked(*g, std::move(text));
    if (g->builder->finished()) {
      EndLocked(*g, absl::OkStatus());
    } else if (g->done) {
      EndLocked(*g, g->done_status.ok()
                        ? absl::InternalError("the request ended without a finish reason")
                        : g->done_status);
    }
  }
  g->pumping = false;
}

// Schedules a Pump unless one is pending (call without g->mu held).
void SchedulePump(const std::shared_ptr<ResponseGeneration>& g) {
  {
    std::lock_guard<std::mutex> l(g->mu);
    if (g->pumping) return;
    g->pumping = true;
  }
  g->exchange->Defer([g] { Pump(g); });
}

RequestCallbacks Callbacks(const ResponsesHttpContext& context,
                           const std::shared_ptr<ResponseGeneration>& g) {
  RequestCallbacks cb;
  cb.on_accepted = [track = context.track, g](uint64_t request_id) {
    g->request_id = request_id;
    track(request_id);
  };
  cb.on_update = [g](const cluster::SequenceUpdate& u) {
    g->access->AddOutputTokens(static_cast<uint32_t>(u.token_ids_size()), absl::Now());
    {
      std::lock_guard<std::mutex> l(g->mu);
      if (g->ended) return;
      g->updates.push_back(u);
    }
    SchedulePump(g);
  };
  cb.on_done = [untrack = context.untrack, in_flight = context.in_flight,
                g](const absl::Status& st) {
    {
      std::lock_guard<std::mutex> l(g->mu);
      g->done = true;
      g->done_status = st;
      if (!g->builder->finished()) {
        g->access->set_finish_reason(st.code() == absl::StatusCode::kCancelled ? "cancelled"
                                     : st.code() == absl::StatusCode::kDeadlineExceeded ? "deadline"
                                                                                        : "error");
      }
    }
    SchedulePump(g);
    --*in_flight;
    untrack(g->request_id);
  };
  return cb;
}

// Sends the SSE head and what was produced before it.
void BeginStream(ResponseGeneration& g) {
  HttpResponse head;
  head.content_type = "text/event-stream";
  head.set_header("Cache-Control", "no-cache");
  head.set_header("X-Accel-Buffering", "no");
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

absl::StatusOr<Prepared> Prepare(const ResponsesHttpContext& context, const HttpRequest& req) {
  absl::StatusOr<Json> body = ParseBody(req.body);
  if (!body.ok()) return body.status();
  absl::StatusOr<ResponsesRequest> request = ParseResponsesRequest(*body);
  if (!request.ok()) return request.status();
  Prepared out;
  out.request = *std::move(request);
  if (!out.request.previous_response_id.empty()) {
    absl::StatusOr<Json> history = context.store->Get(out.request.previous_response_id);
    if (!history.ok()) return history.status();
    out.history = *std::move(history);
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

cluster::SubmitSequence Submission(const PreparedRequest& prepared,
                                   std::optional<absl::Time> deadline) {
  cluster::SubmitSequence submit;
  for (tokenizer::TokenId t : prepared.prompt) submit.add_prompt_ids(static_cast<int32_t>(t));
  *submit.mutable_sampling() = prepared.sampling;
  if (prepared.constraint) grammar::ToProto(*prepared.constraint, submit.mutable_constraint());
  if (deadline) submit.set_deadline_unix_ms(absl::ToUnixMillis(*deadline));
  return submit;
}

std::shared_ptr<ResponseGeneration> NewGeneration(const ResponsesHttpContext& context,
                                                  std::shared_ptr<HttpExchange> exchange,
                                                  Prepared& p) {
  const HttpRequest& req = exchange->request();
  auto g = std::make_shared<ResponseGeneration>();
  g->exchange = std::move(exchange);
  g->access = req.access ? req.access : std::make_shared<AccessRecord>(req.path, req.received);
  g->prompt_tokens = static_cast<uint32_t>(p.chat.prompt.size());
  g->stream = p.request.stream;
  const std::string id = absl::StrCat("resp_", RandomId());
  g->access->set_request_id(id);
  g->access->set_prompt_tokens(g->prompt_tokens);
  g->builder = std::make_unique<ResponsesStream>(context.tokenizer, id, context.model_id,
                                                 ResponseSettings(p.request),
                                                 absl::ToUnixSeconds(absl::Now()));
  if (p.request.store) {
    g->store = context.store;
    g->conversation = std::move(p.history);
    for (const Json& item : p.request.input_items) g->conversation.push_back(item);
  }
  return g;
}

}  // namespace

void ServeResponses(const ResponsesHttpContext& context, std::shared_ptr<HttpExchange> exchange,
                    std::optional<absl::Time> deadline) {
  absl::StatusOr<Prepared> prepared = Prepare(context, exchange->request());
  if (!prepared.ok()) return exchange->Send(ErrorResponse(prepared.status()));
  std::shared_ptr<ResponseGeneration> g = NewGeneration(context, exchange, *prepared);
  if (g->stream) g->held = Events(g->builder->Begin());

  ++*context.in_flight;
  absl::StatusOr<uint64_t> submitted =
      context.manager->Submit(Submission(prepared->chat, deadline), Callbacks(context, g));
  if (!submitted.ok()) {
    --*context.in_flight;
    return exchange->Send(ErrorResponse(submitted.status()));
  }
  ClusterManager* manager = context.manager;
  if (g->stream) {
    BeginStream(*g);
  } else if (deadline) {
    // A deadline the workers missed ends the request here (504).
    exchange->After(*deadline - absl::Now() + absl::Seconds(1), [g, manager] {
      {
        std::lock_guard<std::mutex> l(g->mu);
        if (g->ended) return;
        g->access->set_finish_reason("deadline");
        EndLocked(*g, absl::DeadlineExceededError("the request's deadline passed"));
      }
      manager->Cancel(g->request_id, "the request's deadline passed");
    });
  }
  // A client that goes away cancels its request.
  exchange->OnClientGone(
      [g, manager] { manager->Cancel(g->request_id, "the HTTP client disconnected"); });
}

}  // namespace flotilla::coordinator
