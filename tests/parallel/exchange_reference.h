// Host side of the device context tests: the data every rank of a scenario
// can generate for any DP group (so each rank checks its results alone),
// and what Dispatch, Combine and the TP all-reduce must produce from it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/expert_map.h"

namespace flotilla::parallel::testing {

struct Scenario {
  int world = 2;
  int tp = 1;
  int hidden = 2880;
  int top_k = 4;
  int experts = 16;
  int layers = 2;
  int64_t max_tokens = 64;
};

// Layer 0: contiguous blocks; the other layers: experts scattered over the
// ranks, every third with a second replica on the next rank.
ExpertMap ScenarioMap(const Scenario& s);

// One DP group's tokens of one layer of one step.
struct GroupData {
  int tokens = 0;
  std::vector<uint16_t> x;   // bf16 [tokens, hidden]
  std::vector<int32_t> ids;  // [tokens, top_k], distinct experts per token
  std::vector<float> w;      // [tokens, top_k]
};

// Tokens of group `group` in step `step`: uneven, 0 and max_tokens included;
// steps 2 and 3 of every 4 at most 8 (combined as flagged lines).
int GroupTokens(const Scenario& s, uint64_t step, int group);
GroupData MakeGroupData(const Scenario& s, uint64_t step, int layer, int group, int tokens);

// The rows `rank` must receive in `layer`: per source rank, in order, the
// (source token, slot) of each row. `groups[g]` is group g's data.
struct ExpectedRow {
  int token;
  int slot;
};
std::vector<std::vector<ExpectedRow>> ExpectedRows(const Scenario& s, const ExpertMap& map,
                                                   int layer, int rank,
                                                   const std::vector<GroupData>& groups);

// slot -> expert of `rank` in `layer` (-1 for unused slots).
std::vector<int32_t> ExpertOfSlot(const ExpertMap& map, int layer, int rank);

// y [tokens, hidden] for one group: per token the sum, in ascending expert
// id, of weight * FakeExpert(x).
std::vector<float> ExpectedY(const Scenario& s, const GroupData& data);

// A rank's all-reduce input, and the sum its TP group must produce.
std::vector<float> ReduceInput(uint64_t seed, int rank, int64_t count);
std::vector<float> ExpectedReduce(const Scenario& s, uint64_t seed, int rank, int64_t count);

}  // namespace flotilla::parallel::testing
