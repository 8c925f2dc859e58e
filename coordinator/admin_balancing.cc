// The admin API's expert-balancing and drain calls: thin edges over
// ClusterManager (authorisation, then the call, then the status).
#include <utility>

#include "common/grpc_status.h"
#include "coordinator/grpc_auth.h"
#include "coordinator/services.h"

namespace flotilla::coordinator {
namespace {

// Drain and Undrain act on a worker's DP group or, with `instance`, on a
// whole instance.
absl::StatusOr<admin::DrainResult> DrainTarget(ClusterManager& manager,
                                               const admin::DrainRequest& request, bool drained) {
  if (request.has_instance()) {
    return manager.DrainInstance(static_cast<int>(request.instance()), drained);
  }
  return manager.Drain(request.worker_id(), drained);
}

}  // namespace
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

}  // namespace

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
