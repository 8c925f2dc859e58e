// The coordinator's gRPC services (callback API): the worker Session stream,
// the admin API and the client API. Each is a thin edge over ClusterManager.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/harmony/openai.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/auth.h"
#include "coordinator/cache_domain.h"
#include "coordinator/client_buffers.h"
#include "coordinator/cluster/cluster_manager.h"
#include "coordinator/grpc/decode_pool.h"
#include "coordinator/input_limits.h"
#include "coordinator/request_registry.h"
#include "proto/admin.grpc.pb.h"
#include "proto/cluster.grpc.pb.h"
#include "proto/flotilla.grpc.pb.h"

namespace flotilla::coordinator {

class ClusterControlService final : public cluster::ClusterControl::CallbackService {
 public:
  // With a `cluster_token`, a Session whose metadata does not carry it is
  // ended with UNAUTHENTICATED before the manager hears of it (no worker id,
  // no spare, no rank); without one, any caller may join.
  explicit ClusterControlService(ClusterManager* manager,
                                 std::optional<std::string> cluster_token = std::nullopt)
      : manager_(manager), cluster_token_(std::move(cluster_token)) {}
  grpc::ServerBidiReactor<cluster::WorkerMessage, cluster::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* context) override;

 private:
  ClusterManager* manager_;
  std::optional<std::string> cluster_token_;
};

// The admin API (admin_service.cc): every call authorised, then answered
// with what the manager returns.
class AdminService final : public admin::Admin::CallbackService {
 public:
  // `auth` (null = open) checks every call: reads need any valid key,
  // SetExpertMap, Rebalance, Drain, Undrain and MeasureEngine (which pauses
  // serving) an admin key.
  explicit AdminService(ClusterManager* manager, const Authenticator* auth = nullptr)
      : manager_(manager), auth_(auth) {}
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const admin::GetStatusRequest* request,
                                      admin::ClusterStatus* response) override;
  grpc::ServerUnaryReactor* GetPlacement(grpc::CallbackServerContext* context,
                                         const admin::GetPlacementRequest* request,
                                         admin::PlacementInfo* response) override;
  grpc::ServerUnaryReactor* GetExpertMap(grpc::CallbackServerContext* context,
                                         const admin::GetExpertMapRequest* request,
                                         cluster::ExpertMap* response) override;
  grpc::ServerUnaryReactor* SetExpertMap(grpc::CallbackServerContext* context,
                                         const cluster::ExpertMap* request,
                                         cluster::ExpertMap* response) override;
  grpc::ServerUnaryReactor* MeasureEngine(grpc::CallbackServerContext* context,
                                          const cluster::MeasureEngineRequest* request,
                                          cluster::EngineMeasurement* response) override;
  // Expert balancing and drain: GetExpertLoad needs any
  // valid key, the others an admin key. Rebalance and SetExpertMap wait for
  // the ranks to load their new slots (seconds), on the calling thread.
  grpc::ServerUnaryReactor* GetExpertLoad(grpc::CallbackServerContext* context,
                                          const admin::ExpertLoadRequest* request,
                                          admin::ExpertLoadReport* response) override;
  grpc::ServerUnaryReactor* Rebalance(grpc::CallbackServerContext* context,
                                      const admin::RebalanceRequest* request,
                                      admin::RebalanceResult* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const admin::DrainRequest* request,
                                  admin::DrainResult* response) override;
  grpc::ServerUnaryReactor* Undrain(grpc::CallbackServerContext* context,
                                    const admin::DrainRequest* request,
                                    admin::DrainResult* response) override;

 private:
  ClusterManager* manager_;
  const Authenticator* auth_;
};

class FrontendService final : public v1::Flotilla::CallbackService {
 public:
  // `tokenizer` (o200k_harmony) encodes text prompts and decodes the
  // streamed tokens; it must outlive the service.
  // `harmony` holds the system message defaults of Chat prompts.
  // `auth` (null = open) checks every call's key; Cancel acts only on the
  // caller's own requests (any request for an admin key).
  FrontendService(ClusterManager* manager, std::string model_id,
                  const tokenizer::Tokenizer* tokenizer,
                  harmony::OpenAiRequestOptions harmony = harmony::OpenAiRequestOptions(),
                  const Authenticator* auth = nullptr);
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerWriteReactor<v1::ChatResponse>* Chat(grpc::CallbackServerContext* context,
                                                   const v1::ChatRequest* request) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  // Bounds on client requests (size, prompt text), checked before any work;
  // set before the server starts.
  void SetInputLimits(const InputLimits& limits) { limits_ = limits; }
  // Which requests share cached prompt blocks (cache_domain.h).
  void SetCacheDomains(const CacheDomainPolicy& policy) { cache_domains_ = policy; }
  // Every name requests may give as `model` (ServedModelNames), the model id
  // first; ListModels lists each. Set before the server starts.
  void SetServedModelNames(std::vector<std::string> names) { served_names_ = std::move(names); }
  // Flow control (client_buffers.h): Generate and Chat are admitted by it and
  // their streams counted in it. Null (the default): unbounded. Set before
  // the server starts.
  void SetClientBuffers(std::shared_ptr<ClientBuffers> buffers) { buffers_ = std::move(buffers); }

 private:
  // A token counting the new request open, or why it is refused.
  absl::StatusOr<std::shared_ptr<void>> Admit();
  // The name to check a request's `model` against: itself when served.
  const std::string& ModelFor(const std::string& requested) const;

  ClusterManager* manager_;
  std::string model_id_;
  std::vector<std::string> served_names_;  // empty = {model_id_}
  const tokenizer::Tokenizer* tokenizer_;
  harmony::OpenAiRequestOptions harmony_;
  std::string call_id_salt_;  // per process: tool call ids differ across restarts
  const Authenticator* auth_;
  RequestRegistry requests_;  // the random ids clients see -> the manager's ids
  InputLimits limits_;
  CacheDomainPolicy cache_domains_;
  std::shared_ptr<ClientBuffers> buffers_;
  // Generate's and Chat's decoding and replies run here, not on the thread
  // of the worker stream that delivered the tokens (decode_pool.h).
  std::unique_ptr<DecodePool> decode_pool_;
};

}  // namespace flotilla::coordinator
