// ExpertStore: a rank's expert slots and their hot swap. The rank starts
// with the experts its assignment placed on it and `slots` slots per layer
// (those plus --redundant-experts spares). A PREPARE names a new expert map;
// the store loads, on a thread of its own, every expert the map places on
// this rank that it does not hold yet (views of the checkpoint with their
// pages touched, or the synthetic model's values generated), so the engine
// loop keeps stepping meanwhile. Commit hands the loaded experts over (the
// engine installs them) and the map to switch to; Abort drops them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "common/expert_map.h"
#include "worker/model/model_source.h"
#include "worker/model/weights.h"

namespace flotilla::worker {

class ExpertStore {
 public:
  // Called on the loader thread with the map in force, the prepared map and
  // the experts loaded for it (Engine::StageExperts: a GPU rank copies them
  // into its free slots there, off the step loop). An error fails the preparation.
  using Stager = std::function<absl::Status(const ExpertMap& current, const ExpertMap& next,
                                            const ModelWeights& experts)>;
  // `model` outlives the store. `initial`: the map the rank loaded;
  // `slots`: expert slots per layer this rank has; `stage` may be empty.
  ExpertStore(const ModelSource* model, int rank, int tp_rank, int tp_size,
              const ExpertMap& initial, int slots, Stager stage = nullptr);
  ~ExpertStore();

  int slots() const { return slots_; }

  // Checks that `map` fits this rank's slots and starts loading what it
  // lacks. One preparation at a time: a new one replaces an unfinished one.
  absl::Status Prepare(ExpertMap map);

  struct Finished {
    uint64_t version = 0;
    absl::Status status;
    uint64_t bytes = 0;  // expert bytes loaded
    int64_t load_ms = 0;
  };
  // A preparation that finished since the last call (polled between steps).
  std::optional<Finished> TakeFinished();

  struct Committed {
    ExpertMap map;
    ModelWeights experts;  // the newly loaded experts, by layer
  };
  // The prepared map `version` and its experts; afterwards the store counts
  // them as held. FAILED_PRECONDITION when that version is not prepared.
  absl::StatusOr<Committed> Commit(uint64_t version);
  // Drops the preparation of `version` (loaded or still loading).
  void Abort(uint64_t version);

 private:
  void Load(ExpertMap current, ExpertMap map, uint64_t generation);
  void Join();

  const ModelSource* model_;
  const int rank_, tp_rank_, tp_size_, slots_;
  const Stager stage_;
  ExpertMap current_;  // the map in force (the last committed); engine loop only
  // (layer, expert) pairs this rank holds weights for.
  std::set<std::pair<int, int>> held_;

  std::mutex mu_;
  std::thread loader_;
  uint64_t generation_ = 0;  // of the newest Prepare; stale loads are dropped
  std::optional<Finished> finished_;
  std::optional<Committed> prepared_;
};

}  // namespace flotilla::worker
