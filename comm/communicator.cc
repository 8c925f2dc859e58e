#include "comm/communicator.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla::comm {

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kF32:
      return 4;
    case DataType::kBf16:
      return 2;
  }
  return 0;
}

absl::string_view DataTypeName(DataType type) {
  switch (type) {
    case DataType::kF32:
      return "f32";
    case DataType::kBf16:
      return "bf16";
  }
  return "unknown";
}

absl::Status Communicator::ExchangeCounts(absl::Span<const size_t> send_counts,
                                          absl::Span<size_t> recv_counts) {
  const size_t n = static_cast<size_t>(size());
  if (send_counts.size() != n || recv_counts.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("ExchangeCounts: expected ", n,
                                                   " counts per side, got ", send_counts.size(),
                                                   " to send and ", recv_counts.size(),
                                                   " to receive"));
  }
  std::vector<size_t> each(n, sizeof(size_t));
  std::vector<size_t> offsets = PackedOffsets(each);
  return AllToAllV(send_counts.data(), each, offsets, recv_counts.data(), each, offsets);
}

absl::Status ValidateAllToAllV(int size, absl::Span<const size_t> send_counts,
                               absl::Span<const size_t> send_offsets,
                               absl::Span<const size_t> recv_counts,
                               absl::Span<const size_t> recv_offsets) {
  const size_t n = static_cast<size_t>(size);
  if (send_counts.size() != n || send_offsets.size() != n || recv_counts.size() != n ||
      recv_offsets.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllToAllV: every count and offset list needs one entry per rank (", n,
        "); got send_counts=", send_counts.size(), " send_offsets=", send_offsets.size(),
        " recv_counts=", recv_counts.size(), " recv_offsets=", recv_offsets.size()));
  }
  return absl::OkStatus();
}

std::vector<size_t> PackedOffsets(absl::Span<const size_t> counts) {
  std::vector<size_t> offsets(counts.size());
  size_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    offsets[i] = at;
    at += counts[i];
  }
  return offsets;
}

absl::Status AllToAllVExchangingCounts(Communicator& comm, const void* send,
                                       absl::Span<const size_t> send_counts,
                                       absl::Span<const size_t> send_offsets, void* recv,
                                       size_t recv_capacity, std::vector<size_t>* recv_counts,
                                       std::vector<size_t>* recv_offsets, void* stream) {
  recv_counts->assign(static_cast<size_t>(comm.size()), 0);
  FLOTILLA_RETURN_IF_ERROR(comm.ExchangeCounts(send_counts, absl::MakeSpan(*recv_counts)));
  *recv_offsets = PackedOffsets(*recv_counts);
  size_t total = 0;
  for (size_t c : *recv_counts) total += c;
  if (total > recv_capacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat("AllToAllVExchangingCounts: peers send ", total,
                     " bytes but the receive buffer holds ", recv_capacity));
  }
  return comm.AllToAllV(send, send_counts, send_offsets, recv, *recv_counts, *recv_offsets,
                        stream);
}

}  // namespace flotilla::comm
