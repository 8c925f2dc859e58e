// WorkerRuntime's part in expert balancing: the two phases of an expert-map
// change (the ExpertStore loads in the background, the StepExecutor switches
// at a step boundary all ranks agree on) and the expert load it reports.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/expert_map_proto.h"
#include "spdlog/spdlog.h"
#include "worker/worker_runtime.h"

namespace flotilla::worker {
namespace {

// How often the engine loop sends the expert counts it gathered.
constexpr int64_t kExpertLoadIntervalMs = 200;
// How often the engine's expert counters are read: a CUDA engine's read-back
// (a copy to the host and a reset, queued behind a step) and the host's
// slot-to-expert table cost ~50 us a step when taken every step (H200s).
// While a new expert map is pending they are read every step, so that the
// last read under the old map ends at the step before the switch.
constexpr int64_t kExpertCountsIntervalMs = 50;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

cluster::WorkerMessage Prepared(uint64_t version, const absl::Status& status, uint64_t bytes,
                                int64_t load_ms) {
  cluster::WorkerMessage m;
  cluster::ExpertMapPrepared* p = m.mutable_expert_map_prepared();
  p->set_version(version);
  if (!status.ok()) p->set_error(std::string(status.message()));
  p->set_bytes_loaded(bytes);
  p->set_load_ms(static_cast<uint32_t>(load_ms));
  return m;
}

cluster::WorkerMessage CommitError(uint64_t version, const absl::Status& status) {
  cluster::WorkerMessage m;
  m.mutable_error()->set_message(
      absl::StrCat("commit of expert map ", version, " failed: ", status.message()));
  return m;
}

}  // namespace

void WorkerRuntime::HandleExpertMap(const cluster::ExpertMapUpdate& update) {
  using Update = cluster::ExpertMapUpdate;
  const uint64_t version = update.map().version();
  if (!executor_ || !expert_store_) {
    if (update.phase() == Update::PREPARE) {
      client_->Send(
          Prepared(version, absl::FailedPreconditionError("the rank is not serving"), 0, 0));
    }
    return;
  }
  switch (update.phase()) {
    case Update::DIRECT: {
      absl::StatusOr<ExpertMap> map = ExpertMapFromProto(update.map());
      if (map.ok()) executor_->OfferExpertMap(std::move(*map));
      break;
    }
    case Update::PREPARE: {
      absl::StatusOr<ExpertMap> map = ExpertMapFromProto(update.map());
      absl::Status st = map.ok() ? expert_store_->Prepare(std::move(*map)) : map.status();
      if (!st.ok()) client_->Send(Prepared(version, st, 0, 0));
      break;
    }
    case Update::COMMIT: {
      absl::StatusOr<ExpertStore::Committed> c = expert_store_->Commit(version);
      absl::Status st = c.status();
      if (st.ok()) st = rank_engine_.engine->InstallExperts(c->map, std::move(c->experts));
      if (!st.ok()) {
        // The others may switch without this rank only if it never joins the
        // version; it keeps stepping on v, and they wait on it: report loudly.
        spdlog::error("commit of expert map {} failed: {}", version, st.ToString());
        client_->Send(CommitError(version, st));
        break;
      }
      executor_->OfferExpertMap(std::move(c->map));
      break;
    }
    case Update::ABORT:
      expert_store_->Abort(version);
      break;
    default:
      break;
  }
}

void WorkerRuntime::PollExpertStore() {
  if (!expert_store_) return;
  std::optional<ExpertStore::Finished> done = expert_store_->TakeFinished();
  if (!done) return;
  spdlog::info("expert map {} prepared: {} KiB of experts in {} ms{}", done->version,
               done->bytes >> 10, done->load_ms,
               done->status.ok() ? "" : absl::StrCat(" (failed: ", done->status.message(), ")"));
  client_->Send(Prepared(done->version, done->status, done->bytes, done->load_ms));
}

void WorkerRuntime::CollectExpertCounts() {
  const uint64_t version = executor_->map_version();
  const int64_t now = NowMs();
  if (version == expert_load_version_ && !executor_->map_pending() &&
      now - last_expert_counts_ms_ < kExpertCountsIntervalMs) {
    return;  // the counters keep counting on the engine
  }
  last_expert_counts_ms_ = now;
  if (version != expert_load_version_) {
    // Counts go out tagged with the map they ran under.
    MaybeSendExpertLoad(/*force=*/true);
    expert_load_version_ = version;
  }
  std::vector<uint64_t> counts = rank_engine_.engine->TakeExpertCounts();
  if (counts.empty()) return;
  if (expert_load_.size() != counts.size()) expert_load_.assign(counts.size(), 0);
  for (size_t i = 0; i < counts.size(); ++i) expert_load_[i] += counts[i];
}

void WorkerRuntime::MaybeSendExpertLoad(bool force) {
  const int64_t now = NowMs();
  if (expert_load_.empty() || (!force && now - last_expert_load_ms_ < kExpertLoadIntervalMs)) {
    return;
  }
  last_expert_load_ms_ = now;
  bool any = false;
  for (uint64_t n : expert_load_) any |= n > 0;
  if (!any) return;
  const ModelConfig& c = rank_engine_.engine->config();
  cluster::WorkerMessage m;
  cluster::Heartbeat* hb = m.mutable_heartbeat();
  hb->set_unix_ms(static_cast<uint64_t>(now));
  cluster::ExpertLoad* load = hb->mutable_expert_load();
  load->set_num_layers(c.num_hidden_layers);
  load->set_num_experts(c.num_local_experts);
  load->set_map_version(expert_load_version_);
  load->mutable_tokens()->Assign(expert_load_.begin(), expert_load_.end());
  std::fill(expert_load_.begin(), expert_load_.end(), 0);
  client_->Send(std::move(m));
}

}  // namespace flotilla::worker
