// Runs one function on the ranks of a LocalCommunicator group, one thread
// each: the comm tests' way of playing W ranks in one process.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "comm/local/local_communicator.h"

namespace flotilla::comm::testing {

// Runs `body(comm)` for ranks 0..w-1 of one LocalRendezvous, each on its own
// thread with its own LocalCommunicator (made with `options`), and returns
// each rank's status: why its communicator could not be made, else what
// `body` returned.
inline std::vector<absl::Status> RunLocalRanks(
    int w, LocalOptions options, const std::function<absl::Status(LocalCommunicator&)>& body) {
  auto rendezvous = LocalRendezvous::Create(w);
  EXPECT_TRUE(rendezvous.ok()) << rendezvous.status();
  std::vector<absl::Status> results(static_cast<size_t>(w));
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      auto comm = LocalCommunicator::Create(*rendezvous, r, options);
      results[static_cast<size_t>(r)] = comm.ok() ? body(**comm) : comm.status();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace flotilla::comm::testing
