// The admin API (AdminService): thin edges over ClusterManager. Every call
// is authorised (reads with any client key, changes with an admin key), then
// answered with what the manager returns, through Answer.
#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "coordinator/grpc_auth.h"
#include "coordinator/services.h"

namespace flotilla::coordinator {
namespace {

// Authorises with `check`, then answers with what `call` returns.
template <typename Response, typename Check, typename Call>
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, Check check, Call call,
                                 Response* response) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status allowed = check(); !allowed.ok()) {
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  absl::StatusOr<Response> got = call();
  if (got.ok()) *response = std::move(*got);
  reactor->Finish(ToGrpcStatus(got.status()));
  return reactor;
}

// Drain and Undrain act on a worker's DP group or, with `instance`, on a
// whole instance.
absl::StatusOr<admin::DrainResult> DrainTarget(ClusterManager& manager,
                                               const admin::DrainRequest& request, bool drained) {
  if (request.has_instance()) {
    return manager.DrainInstance(static_cast<int>(request.instance()), drained);
  }
  return manager.Drain(request.worker_id(), drained);
}

// MeasureEngine answers when the worker has measured, the deadline passed
// or the client went away, whichever comes first.
class MeasureEngineReactor final : public grpc::ServerUnaryReactor {
 public:
  MeasureEngineReactor(ClusterManager* manager, grpc::CallbackServerContext* context,
                       const cluster::MeasureEngineRequest& request,
                       cluster::EngineMeasurement* response)
      : state_(std::make_shared<State>(this, response)) {
    // Serving pauses while the worker measures: bound how long a call may ask for.
    absl::Time deadline = absl::Now() + absl::Minutes(10);
    if (context->deadline() != std::chrono::system_clock::time_point::max()) {
      deadline = std::min(deadline, absl::FromChrono(context->deadline()));
    }
    std::shared_ptr<State> state = state_;
    manager->MeasureEngine(request, deadline,
                           [state](absl::StatusOr<cluster::EngineMeasurement> m) {
                             std::lock_guard<std::mutex> lock(state->mu);
                             if (state->finished) return;
                             state->finished = true;
                             if (m.ok()) *state->response = *std::move(m);
                             state->reactor->Finish(ToGrpcStatus(m.status()));
                           });
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->finished) return;
    state_->finished = true;
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
  }
  void OnDone() override { delete this; }

 private:
  struct State {
    State(MeasureEngineReactor* r, cluster::EngineMeasurement* out) : reactor(r), response(out) {}
    std::mutex mu;
    bool finished = false;  // under mu; reactor and response are used only before
    MeasureEngineReactor* reactor;
    cluster::EngineMeasurement* response;
  };
  std::shared_ptr<State> state_;
};

}  // namespace

grpc::ServerUnaryReactor* AdminService::GetStatus(grpc::CallbackServerContext* context,
                                                  const admin::GetStatusRequest* request,
                                                  admin::ClusterStatus* response) {
  return Answer(
      context, [&] { return AuthenticateCall(auth_, context, *request).status(); },
      [&]() -> absl::StatusOr<admin::ClusterStatus> { return manager_->Status(); }, response);
}

grpc::ServerUnaryReactor* AdminService::GetPlacement(grpc::CallbackServerContext* context,
                                                     const admin::GetPlacementRequest* request,
                                                     admin::PlacementInfo* response) {
  return Answer(
      context, [&] { return AuthenticateCall(auth_, context, *request).status(); },
      [&] { return manager_->GetPlacement(static_cast<int>(request->instance())); }, response);
}

grpc::ServerUnaryReactor* AdminService::GetExpertMap(grpc::CallbackServerContext* context,
                                                     const admin::GetExpertMapRequest* request,
                                                     cluster::ExpertMap* response) {
  return Answer(
      context, [&] { return AuthenticateCall(auth_, context, *request).status(); },
      [&] { return manager_->GetExpertMap(static_cast<int>(request->instance())); }, response);
}

grpc::ServerUnaryReactor* AdminService::SetExpertMap(grpc::CallbackServerContext* context,
                                                     const cluster::ExpertMap* request,
                                                     cluster::ExpertMap* response) {
  return Answer(
      context, [&] { return AuthenticateAdminCall(auth_, context, *request).status(); },
      [&] { return manager_->SetExpertMap(*request); }, response);
}

grpc::ServerUnaryReactor* AdminService::MeasureEngine(grpc::CallbackServerContext* context,
                                                      const cluster::MeasureEngineRequest* request,
                                                      cluster::EngineMeasurement* response) {
  // Serving pauses while the engine is measured: an admin call.
  if (absl::StatusOr<Caller> caller = AuthenticateAdminCall(auth_, context, *request);
      !caller.ok()) {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  return new MeasureEngineReactor(manager_, context, *request, response);
}

grpc::ServerUnaryReactor* AdminService::GetExpertLoad(grpc::CallbackServerContext* context,
                                                      const admin::ExpertLoadRequest* request,
                                                      admin::ExpertLoadReport* response) {
  return Answer(
      context, [&] { return AuthenticateCall(auth_, context, *request).status(); },
      [&] { return manager_->ExpertLoad(*request); }, response);
}

grpc::ServerUnaryReactor* AdminService::Rebalance(grpc::CallbackServerContext* context,
                                                  const admin::RebalanceRequest* request,
                                                  admin::RebalanceResult* response) {
  return Answer(
      context, [&] { return AuthenticateAdminCall(auth_, context, *request).status(); },
      [&] { return manager_->Rebalance(*request); }, response);
}

grpc::ServerUnaryReactor* AdminService::Drain(grpc::CallbackServerContext* context,
                                              const admin::DrainRequest* request,
                                              admin::DrainResult* response) {
  return Answer(
      context, [&] { return AuthenticateAdminCall(auth_, context, *request).status(); },
      [&] { return DrainTarget(*manager_, *request, true); }, response);
}

grpc::ServerUnaryReactor* AdminService::Undrain(grpc::CallbackServerContext* context,
                                                const admin::DrainRequest* request,
                                                admin::DrainResult* response) {
  return Answer(
      context, [&] { return AuthenticateAdminCall(auth_, context, *request).status(); },
      [&] { return DrainTarget(*manager_, *request, false); }, response);
}

}  // namespace flotilla::coordinator
