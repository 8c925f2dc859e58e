#include "comm/file/file_communicator.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace flotilla::comm {

namespace fs = std::filesystem;

absl::StatusOr<std::unique_ptr<FileCommunicator>> FileCommunicator::Create(
    std::string dir, int rank, int size, const FileOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("FileCommunicator: rank ", rank, " is outside a group of ", size));
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("FileCommunicator: ", dir, " is no directory"));
  }
  return std::unique_ptr<FileCommunicator>(
      new FileCommunicator(std::move(dir), rank, size, options));
}

std::string FileCommunicator::PathOf(uint64_t tag, int from, int to) const {
  return absl::StrCat(dir_, "/msg.", tag, ".", from, ".", to);
}

absl::Status FileCommunicator::Exchange(uint64_t tag, absl::Span<const SendOp> sends,
                                        absl::Span<const RecvOp> recvs) {
  for (const SendOp& s : sends) {
    const std::string path = PathOf(tag, rank(), s.peer);
    {
      std::ofstream out(path + ".tmp", std::ios::binary | std::ios::trunc);
      out.write(static_cast<const char*>(s.data), static_cast<std::streamsize>(s.bytes));
      if (!out)
        return absl::UnavailableError(absl::StrCat("FileCommunicator: cannot write ", path));
    }
    std::error_code ec;
    fs::rename(path + ".tmp", path, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("FileCommunicator: rename: ", ec.message()));
  }
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(options_.timeout);
  for (const RecvOp& r : recvs) {
    const std::string path = PathOf(tag, r.peer, rank());
    std::error_code ec;
    while (!fs::exists(path, ec)) {
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::UnavailableError(absl::StrCat("FileCommunicator: rank ", rank(),
                                                   ": no message from rank ", r.peer, " within ",
                                                   absl::FormatDuration(options_.timeout)));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fs::remove(path, ec);
    if (bytes.size() != r.bytes) {
      return absl::InvalidArgumentError(absl::StrCat("FileCommunicator: rank ", r.peer, " sent ",
                                                     bytes.size(), " bytes, expected ", r.bytes));
    }
    std::copy(bytes.begin(), bytes.end(), static_cast<char*>(r.data));
  }
  return absl::OkStatus();
}

}  // namespace flotilla::comm
