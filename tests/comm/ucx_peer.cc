// One rank of a UCX group in its own process, started by comm_ucx_test.
// Ranks exchange their bootstrap bytes through files in --dir:
//   addr.<rank>   this rank's UcxWorker::Address() (written atomically)
//   ready.<rank>  written by the victim of --scenario=die once it is idle
// Scenarios:
//   checks  every collective (RunCollectiveChecks); exit 0 when all match
//   die     after a barrier the last rank idles until killed; the others run an
//           all-to-all and must get UNAVAILABLE (twice: the group stays broken)
//   die-sending  after a barrier the last rank starts an all-to-all of large
//           messages (UCX rendezvous) and writes ready.<rank> while inside it;
//           the test kills it and writes killed.<rank>; only then do the others
//           run the same all-to-all, so they meet messages announced by a dead
//           process, and must get UNAVAILABLE (not crash)
//   keyed   as checks, every rank keying its message tags with one secret
//   mismatch  every rank has its own secret: no message may match, so the
//           group must not form (Create gives UNAVAILABLE; exit 0 then)
// Exit status: 0 success, 1 failure (message on stderr), 2 usage.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/ucx/ucx_communicator.h"
#include "tests/comm/collective_checks.h"

namespace fs = std::filesystem;
using flotilla::comm::UcxCommunicator;
using flotilla::comm::UcxOptions;
using flotilla::comm::UcxWorker;

namespace {

int Fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"UCX communicator test peer"};
  int rank = -1, size = 0, timeout_ms = 10000;
  std::string dir, scenario = "checks";
  app.add_option("--rank", rank)->required();
  app.add_option("--size", size)->required();
  app.add_option("--dir", dir)->required();
  app.add_option("--scenario", scenario)
      ->check(CLI::IsMember({"checks", "die", "die-sending", "keyed", "mismatch"}));
  app.add_option("--timeout-ms", timeout_ms);
  bool detect = true;
  app.add_option("--detect-peer-failure", detect,
                 "false: shared-memory transports, dead peers found by the timeout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  UcxOptions options;
  options.timeout = absl::Milliseconds(timeout_ms);
  options.detect_peer_failure = detect;
  if (scenario == "keyed") options.peer_secret = "this group's secret";
  if (scenario == "mismatch") options.peer_secret = "secret of rank " + std::to_string(rank);

  auto worker = UcxWorker::Create(options);
  if (!worker.ok()) return Fail(rank, worker.status().ToString());
  const fs::path base(dir);
  {
    const fs::path tmp = base / ("addr." + std::to_string(rank) + ".tmp");
    std::ofstream(tmp, std::ios::binary) << (*worker)->Address();
    fs::rename(tmp, base / ("addr." + std::to_string(rank)));
  }
  std::vector<std::string> addresses(static_cast<size_t>(size));
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (int p = 0; p < size; ++p) {
    const fs::path f = base / ("addr." + std::to_string(p));
    while (!fs::exists(f)) {
      if (std::chrono::steady_clock::now() > give_up)
        return Fail(rank, "no address from rank " + std::to_string(p));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    addresses[static_cast<size_t>(p)] = ss.str();
  }
  auto comm = UcxCommunicator::Create(std::move(*worker), rank, addresses, options);
  if (scenario == "mismatch") {
    if (comm.ok()) return Fail(rank, "ranks with different secrets formed a group");
    if (!absl::IsUnavailable(comm.status())) return Fail(rank, comm.status().ToString());
    std::printf("rank %d: refused: %s\n", rank, comm.status().ToString().c_str());
    return 0;
  }
  if (!comm.ok()) return Fail(rank, comm.status().ToString());

  if (scenario == "checks" || scenario == "keyed") {
    absl::Status st = flotilla::comm::testing::RunCollectiveChecks(**comm);
    if (!st.ok()) return Fail(rank, st.ToString());
    std::printf("rank %d: all collectives ok\n", rank);
    return 0;
  }

  // die, die-sending
  if (absl::Status st = (*comm)->Barrier(); !st.ok()) return Fail(rank, st.ToString());
  const bool sending = scenario == "die-sending";
  // die-sending: the last rank's messages are large enough for UCX's
  // rendezvous protocol (the sender only announces a message; the receiver
  // fetches it when it matches), the others' are small.
  const size_t small = 64, large = sending ? size_t{512} << 10 : small;
  auto bytes = [&](int from) { return from == size - 1 ? large : small; };
  std::vector<size_t> send_counts(static_cast<size_t>(size)), recv_counts(send_counts),
      offsets(send_counts);
  for (int p = 0; p < size; ++p) {
    send_counts[static_cast<size_t>(p)] = bytes(rank);
    recv_counts[static_cast<size_t>(p)] = bytes(p);
    offsets[static_cast<size_t>(p)] = static_cast<size_t>(p) * large;
  }
  std::vector<uint8_t> send(static_cast<size_t>(size) * large, 1), recv(send.size());
  const std::string victim = std::to_string(size - 1);
  if (sending) {
    // Once in full first, as on an instance that has served a while: the
    // survivors have then mapped what they need to read the last rank's
    // announcements.
    absl::Status st =
        (*comm)->AllToAllV(send.data(), send_counts, offsets, recv.data(), recv_counts, offsets);
    if (st.ok()) st = (*comm)->Barrier();
    if (!st.ok()) return Fail(rank, st.ToString());
  }
  if (rank == size - 1) {
    if (!sending) {
      std::ofstream(base / ("ready." + victim)) << "idle\n";
      for (;;) pause();  // until SIGKILL
    }
    // The messages are announced to every peer on entry; the peers are not
    // in the call yet, so it waits there until killed.
    std::thread([base, victim] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::ofstream(base / ("ready." + victim)) << "sending\n";
    }).detach();
    (void)(*comm)->AllToAllV(send.data(), send_counts, offsets, recv.data(), recv_counts, offsets);
    for (;;) pause();
  }
  if (sending) {
    const fs::path killed = base / ("killed." + victim);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(killed)) {
      if (std::chrono::steady_clock::now() > until) return Fail(rank, "the victim was not killed");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st =
      (*comm)->AllToAllV(send.data(), send_counts, offsets, recv.data(), recv_counts, offsets);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!absl::IsUnavailable(st)) return Fail(rank, "expected UNAVAILABLE, got " + st.ToString());
  std::printf("rank %d: UNAVAILABLE after %.1f ms: %s\n", rank, ms,
              std::string(st.message()).c_str());
  absl::Status again = (*comm)->Barrier();
  if (!absl::IsUnavailable(again)) return Fail(rank, "second call gave " + again.ToString());
  return 0;
}
