#include "worker/expert_store.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace flotilla::worker {
namespace {

uint64_t ExpertViewBytes(const ExpertWeights& x) {
  auto matrix = [](const Mxfp4Matrix& m) {
    return static_cast<uint64_t>(m.rows) * (m.cols / 32) * 17;  // 16 block bytes + 1 scale
  };
  return matrix(x.gate_up) + matrix(x.down) +
         2 * static_cast<uint64_t>(x.gate_up_bias.size + x.down_bias.size);
}

// Reads every page of a view so the first step that runs it does not fault
// them in from disk (memory-mapped checkpoints).
uint64_t TouchPages(const uint8_t* data, uint64_t bytes) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < bytes; i += 4096) sum += data[i];
  return sum;
}

void TouchExpert(const ExpertWeights& x) {
  volatile uint64_t sink = 0;
  const auto blocks = [](const Mxfp4Matrix& m) {
    return static_cast<uint64_t>(m.rows) * (m.cols / 32) * 16;
  };
  sink = sink + TouchPages(x.gate_up.blocks, blocks(x.gate_up));
  sink = sink + TouchPages(x.down.blocks, blocks(x.down));
}

}  // namespace

ExpertStore::ExpertStore(const ModelSource* model, int rank, int tp_rank, int tp_size,
                         const ExpertMap& initial, int slots, Stager stage)
    : model_(model),
      rank_(rank),
      tp_rank_(tp_rank),
      tp_size_(tp_size),
      slots_(slots),
      stage_(std::move(stage)),
      current_(initial) {
  for (int l = 0; l < initial.num_layers(); ++l) {
    for (int e : initial.ExpertsOnRank(l, rank)) held_.insert({l, e});
  }
}

ExpertStore::~ExpertStore() { Join(); }

void ExpertStore::Join() {
  if (loader_.joinable()) loader_.join();
}

absl::Status ExpertStore::Prepare(ExpertMap map) {
  for (int l = 0; l < map.num_layers(); ++l) {
    for (int e = 0; e < map.num_experts(); ++e) {
      for (const ExpertLocation& at : map.replicas(l, e)) {
        if (at.rank == rank_ && at.slot >= slots_) {
          return absl::InvalidArgumentError(
              absl::StrCat("expert map ", map.version(), ": layer ", l, " expert ", e, " in slot ",
                           at.slot, " of rank ", rank_, ", which has ", slots_, " slots"));
        }
      }
    }
  }
  Join();  // a load in flight finishes first (it is dropped as stale)
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = ++generation_;
    finished_.reset();
    prepared_.reset();
  }
  loader_ = std::thread([this, current = current_, map = std::move(map), generation]() mutable {
    Load(std::move(current), std::move(map), generation);
  });
  return absl::OkStatus();
}

void ExpertStore::Load(ExpertMap current, ExpertMap map, uint64_t generation) {
  const absl::Time start = absl::Now();
  std::set<int> wanted;
  for (int l = 0; l < map.num_layers(); ++l) {
    for (int e : map.ExpertsOnRank(l, rank_)) {
      if (!held_.count({l, e})) wanted.insert(e);
    }
  }
  Finished done;
  done.version = map.version();
  ModelWeights experts;
  experts.config = model_->config();
  experts.layers.resize(map.num_layers());
  if (!wanted.empty()) {
    ShardSpec spec;
    spec.tp_rank = tp_rank_;
    spec.tp_size = tp_size_;
    spec.experts.assign(wanted.begin(), wanted.end());
    spec.load_embedding = false;
    spec.load_lm_head = false;
    absl::StatusOr<ModelWeights> loaded = model_->LoadShard(spec);
    if (!loaded.ok()) {
      done.status = loaded.status();
    } else {
      // Keep only the (layer, expert) pairs the map places here and the rank lacks.
      for (int l = 0; l < map.num_layers(); ++l) {
        const std::vector<int> on_rank = map.ExpertsOnRank(l, rank_);
        for (const ExpertWeights& x : loaded->layers[l].experts) {
          if (held_.count({l, x.expert_id}) ||
              std::find(on_rank.begin(), on_rank.end(), x.expert_id) == on_rank.end()) {
            continue;
          }
          TouchExpert(x);
          done.bytes += ExpertViewBytes(x);
          experts.layers[l].experts.push_back(x);
        }
      }
      experts.keepalive = loaded->keepalive;
    }
  }
  if (done.status.ok() && stage_) done.status = stage_(current, map, experts);
  done.load_ms = absl::ToInt64Milliseconds(absl::Now() - start);
  std::lock_guard<std::mutex> lock(mu_);
  if (generation != generation_) return;  // replaced or aborted meanwhile
  if (done.status.ok()) prepared_ = Committed{std::move(map), std::move(experts)};
  finished_ = done;
}

std::optional<ExpertStore::Finished> ExpertStore::TakeFinished() {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<Finished> out = std::move(finished_);
  finished_.reset();
  return out;
}

absl::StatusOr<ExpertStore::Committed> ExpertStore::Commit(uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!prepared_ || prepared_->map.version() != version) {
    return absl::FailedPreconditionError(
        absl::StrCat("expert map ", version, " was not prepared on rank ", rank_));
  }
  Committed out = std::move(*prepared_);
  prepared_.reset();
  current_ = out.map;
  for (size_t l = 0; l < out.experts.layers.size(); ++l) {
    for (const ExpertWeights& x : out.experts.layers[l].experts) {
      held_.insert({static_cast<int>(l), x.expert_id});
    }
  }
  return out;
}

void ExpertStore::Abort(uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  if (prepared_ && prepared_->map.version() != version) return;
  ++generation_;  // a load still running is dropped when it ends
  prepared_.reset();
  finished_.reset();
  spdlog::info("rank {}: expert map {} aborted", rank_, version);
}

}  // namespace flotilla::worker
