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
#include "coordinator/grpc/grpc_auth.h"
#include "coordinator/grpc/services.h"

namespace flotilla::coordinator {
namespace {

// Who may make a call: any valid key (reads) or an admin key (changes).
enum class Access { kAnyKey, kAdmin };

absl::Status Authorize(Access access, const Authenticator* auth,
                       const grpc::CallbackServerContext* context,
                       const google::protobuf::Message& request) {
  return access == Access::kAdmin ? AuthenticateAdminCall(auth, context, request).status()
                                  : AuthenticateCall(auth, context, request).status();
}

// Authorises the call for `access`, then answers with what `call` returns.
template <typename Response, typename Call>
grpc::ServerUnaryReactor* Answer(Access access, const Authenticator* auth,
                                 grpc::CallbackServerContext* context,
                                 const google::protobuf::Message& request, Response* response,
                                 Call call) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status allowed = Authorize(access, auth, context, request); !allowed.ok()) {
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
  return Answer(Access::kAnyKey, auth_, context, *request, response,
                [&]() -> absl::StatusOr<admin::ClusterStatus> { return manager_->Status(); });
}

grpc::ServerUnaryReactor* AdminService::GetPlacement(grpc::CallbackServerContext* context,
                                                     const admin::GetPlacementRequest* request,
                                                     admin::PlacementInfo* response) {
  return Answer(Access::kAnyKey, auth_, context, *request, response,
                [&] { return manager_->GetPlacement(static_cast<int>(request->instance())); });
}

grpc::ServerUnaryReactor* AdminService::GetExpertMap(grpc::CallbackServerContext* context,
                                                     const admin::GetExpertMapRequest* request,
                                                     cluster::ExpertMap* response) {
  return Answer(Access::kAnyKey, auth_, context, *request, response,
                [&] { return manager_->GetExpertMap(static_cast<int>(request->instance())); });
}

grpc::ServerUnaryReactor* AdminService::SetExpertMap(grpc::CallbackServerContext* context,
                                                     const cluster::ExpertMap* request,
                                                     cluster::ExpertMap* response) {
  return Answer(Access::kAdmin, auth_, context, *request, response,
                [&] { return manager_->SetExpertMap(*request); });
}

grpc::ServerUnaryReactor* AdminService::MeasureEngine(grpc::CallbackServerContext* context,
                                                      const cluster::MeasureEngineRequest* request,
                                                      cluster::EngineMeasurement* response) {
  // Serving pauses while the engine is measured: an admin call.
  if (absl::Status allowed = Authorize(Access::kAdmin, auth_, context, *request); !allowed.ok()) {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  return new MeasureEngineReactor(manager_, context, *request, response);
}

grpc::ServerUnaryReactor* AdminService::GetExpertLoad(grpc::CallbackServerContext* context,
                                                      const admin::ExpertLoadRequest* request,
                                                      admin::ExpertLoadReport* response) {
  return Answer(Access::kAnyKey, auth_, context, *request, response,
                [&] { return manager_->ExpertLoad(*request); });
}

grpc::ServerUnaryReactor* AdminService::Rebalance(grpc::CallbackServerContext* context,
                                                  const admin::RebalanceRequest* request,
                                                  admin::RebalanceResult* response) {
  return Answer(Access::kAdmin, auth_, context, *request, response,
                [&] { return manager_->Rebalance(*request); });
}

grpc::ServerUnaryReactor* AdminService::Drain(grpc::CallbackServerContext* context,
                                              const admin::DrainRequest* request,
                                              admin::DrainResult* response) {
  return Answer(Access::kAdmin, auth_, context, *request, response,
                [&] { return DrainTarget(*manager_, *request, true); });
}

grpc::ServerUnaryReactor* AdminService::Undrain(grpc::CallbackServerContext* context,
                                                const admin::DrainRequest* request,
                                                admin::DrainResult* response) {
  return Answer(Access::kAdmin, auth_, context, *request, response,
                [&] { return DrainTarget(*manager_, *request, false); });
}

}  // namespace flotilla::coordinator
