// RankCollectives over a comm::Communicator spanning the whole instance:
// the attention all-reduce inside a TP group and the MoE all-to-all dispatch
// and combine over all ranks (expert parallelism). Every rank of the instance
// calls every hook of every layer in the same order (lockstep), also with no
// tokens, so the world-wide collectives always match.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "common/expert_map.h"
#include "common/parallel_config.h"
#include "worker/engine/rank_collectives.h"

namespace flotilla::worker {

class DistributedCollectives final : public RankCollectives {
 public:
  // `comm` spans all ranks and outlives this object; `map` gives where each
  // expert lives.
  DistributedCollectives(comm::Communicator* comm, ParallelConfig parallel, ExpertMap map);

  // Replaces the expert map at a step boundary.
  void SetExpertMap(ExpertMap map) { map_ = std::move(map); }
  const ExpertMap& expert_map() const { return map_; }

  absl::Status AllReduceAttention(int layer, float* data, int64_t count) override;
  bool DispatchesTokens() const override { return true; }
  absl::Status RunMoe(int layer, const float* normed, int64_t tokens, int64_t hidden,
                      const int32_t* topk_idx, const float* topk_w, int k, LocalExperts& local,
                      float* y) override;

 private:
  // Sends `bytes` of `data` to every other rank of this TP group and receives
  // theirs into `gathered` (tp * bytes, in TP-rank order, own part included).
  absl::Status ExchangeInGroup(const void* data, size_t bytes_out, std::vector<size_t> bytes_in,
                               std::vector<char>* gathered, std::vector<size_t>* offsets);

  comm::Communicator* comm_;
  ParallelConfig parallel_;
  ExpertMap map_;
  int rank_;
  // Workspaces reused across layers and steps.
  std::vector<char> send_, recv_, back_, gathered_;
  std::vector<float> rows_, out_;
  std::vector<int32_t> experts_;
};

}  // namespace flotilla::worker
