#include "tests/comm/collective_checks.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status.h"

namespace flotilla::comm::testing {
namespace {

uint8_t Byte(int from, int to, size_t i) {
  return static_cast<uint8_t>(from * 31 + to * 17 + static_cast<int>(i % 251) * 3 + 1);
}

// Bytes rank `from` sends rank `to` in the uneven all-to-all (often zero).
size_t UnevenCount(int from, int to) {
  return static_cast<size_t>((from * 7 + to * 3) % 5) * 13;
}

absl::Status Mismatch(const Communicator& c, absl::string_view what, size_t at) {
  return absl::InternalError(
      absl::StrCat("rank ", c.rank(), ": ", what, " differs from the expected value at ", at));
}

absl::Status CheckBroadcast(Communicator& c) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4097}}) {
    for (int root = 0; root < c.size(); ++root) {
      std::vector<uint8_t> buf(bytes, 0);
      if (c.rank() == root) {
        for (size_t i = 0; i < bytes; ++i) buf[i] = Byte(root, 99, i);
      }
      FLOTILLA_RETURN_IF_ERROR(c.Broadcast(buf.data(), bytes, root));
      for (size_t i = 0; i < bytes; ++i) {
        if (buf[i] != Byte(root, 99, i)) return Mismatch(c, "Broadcast", i);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAllGather(Communicator& c) {
  const size_t w = static_cast<size_t>(c.size());
  for (size_t bytes : {size_t{0}, size_t{3}, size_t{1000}}) {
    for (bool in_place : {false, true}) {
      std::vector<uint8_t> out(bytes * w, 0);
      std::vector<uint8_t> in(bytes);
      for (size_t i = 0; i < bytes; ++i) in[i] = Byte(c.rank(), 7, i);
      const uint8_t* src = in.data();
      if (in_place) {
        std::memcpy(out.data() + static_cast<size_t>(c.rank()) * bytes, in.data(), bytes);
        src = out.data() + static_cast<size_t>(c.rank()) * bytes;
      }
      FLOTILLA_RETURN_IF_ERROR(c.AllGather(src, out.data(), bytes));
      for (size_t r = 0; r < w; ++r) {
        for (size_t i = 0; i < bytes; ++i) {
          if (out[r * bytes + i] != Byte(static_cast<int>(r), 7, i)) {
            return Mismatch(c, "AllGather", r * bytes + i);
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAllReduce(Communicator& c) {
  const int w = c.size();
  for (size_t n : {size_t{0}, size_t{1}, static_cast<size_t>(w > 1 ? w - 1 : 1), size_t{1031}}) {
    // f32: values whose sums are exact, so the expectation is exact too.
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) f[i] = (c.rank() + 1) * 0.5f + static_cast<float>(i) * 0.25f;
    FLOTILLA_RETURN_IF_ERROR(c.AllReduce(f.data(), n, DataType::kF32));
    for (size_t i = 0; i < n; ++i) {
      const float want = 0.25f * w * (w + 1) + static_cast<float>(w) * i * 0.25f;
      if (f[i] != want) return Mismatch(c, "AllReduce(f32)", i);
    }
    // bf16: small integers stay exact.
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = FloatToBf16(static_cast<float>(c.rank() + 1 + i % 7));
    FLOTILLA_RETURN_IF_ERROR(c.AllReduce(b.data(), n, DataType::kBf16));
    for (size_t i = 0; i < n; ++i) {
      const float want = 0.5f * w * (w + 1) + static_cast<float>(w * (i % 7));
      if (Bf16ToFloat(b[i]) != want) return Mismatch(c, "AllReduce(bf16)", i);
    }
    // bf16 with rounding: one rounding of the float sum taken in rank order.
    for (size_t i = 0; i < n; ++i) b[i] = FloatToBf16(1.0f / static_cast<float>(c.rank() + 3 + i));
    FLOTILLA_RETURN_IF_ERROR(c.AllReduce(b.data(), n, DataType::kBf16));
    for (size_t i = 0; i < n; ++i) {
      float sum = 0.f;
      for (int r = 0; r < w; ++r) sum += Bf16ToFloat(FloatToBf16(1.0f / static_cast<float>(r + 3 + i)));
      if (b[i] != FloatToBf16(sum)) return Mismatch(c, "AllReduce(bf16, rounded)", i);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAllToAllV(Communicator& c, bool all_zero) {
  const int w = c.size();
  const int me = c.rank();
  std::vector<size_t> sc(static_cast<size_t>(w)), so(static_cast<size_t>(w)),
      rc(static_cast<size_t>(w)), ro(static_cast<size_t>(w));
  // Offsets leave gaps of 5 bytes so that offsets are really honoured.
  size_t sat = 0, rat = 0;
  for (int p = 0; p < w; ++p) {
    const size_t q = static_cast<size_t>(p);
    sc[q] = all_zero ? 0 : UnevenCount(me, p);
    rc[q] = all_zero ? 0 : UnevenCount(p, me);
    so[q] = sat;
    ro[q] = rat;
    sat += sc[q] + 5;
    rat += rc[q] + 5;
  }
  std::vector<uint8_t> send(sat, 0xEE), recv(rat, 0xEE);
  for (int p = 0; p < w; ++p) {
    for (size_t i = 0; i < sc[static_cast<size_t>(p)]; ++i) send[so[static_cast<size_t>(p)] + i] = Byte(me, p, i);
  }
  FLOTILLA_RETURN_IF_ERROR(c.AllToAllV(send.data(), sc, so, recv.data(), rc, ro));
  for (int p = 0; p < w; ++p) {
    const size_t q = static_cast<size_t>(p);
    for (size_t i = 0; i < rc[q]; ++i) {
      if (recv[ro[q] + i] != Byte(p, me, i)) return Mismatch(c, "AllToAllV", ro[q] + i);
    }
    for (size_t i = 0; i < 5; ++i) {
      if (recv[ro[q] + rc[q] + i] != 0xEE) return Mismatch(c, "AllToAllV gap", ro[q] + rc[q] + i);
    }
  }

  // The same exchange with receivers that do not know the counts.
  std::vector<uint8_t> packed(rat, 0);
  std::vector<size_t> got_counts, got_offsets;
  FLOTILLA_RETURN_IF_ERROR(AllToAllVExchangingCounts(c, send.data(), sc, so, packed.data(),
                                                     packed.size(), &got_counts, &got_offsets));
  size_t at = 0;
  for (int p = 0; p < w; ++p) {
    const size_t q = static_cast<size_t>(p);
    if (got_counts[q] != rc[q] || got_offsets[q] != at) {
      return Mismatch(c, "AllToAllVExchangingCounts counts", q);
    }
    for (size_t i = 0; i < rc[q]; ++i) {
      if (packed[at + i] != Byte(p, me, i)) return Mismatch(c, "AllToAllVExchangingCounts", at + i);
    }
    at += rc[q];
  }
  return absl::OkStatus();
}

absl::Status CheckArgumentErrors(Communicator& c) {
  // Rejected before anything is sent, so the group stays in step.
  std::vector<size_t> short_list(static_cast<size_t>(c.size()) + 1, 0);
  std::vector<size_t> ok(static_cast<size_t>(c.size()), 0);
  uint8_t byte = 0;
  absl::Status st = c.AllToAllV(&byte, short_list, ok, &byte, ok, ok);
  if (!absl::IsInvalidArgument(st)) {
    return absl::InternalError(absl::StrCat("rank ", c.rank(),
                                            ": AllToAllV with too many counts gave ", st.ToString()));
  }
  st = c.Broadcast(&byte, 1, c.size());
  if (!absl::IsInvalidArgument(st)) {
    return absl::InternalError(absl::StrCat("rank ", c.rank(),
                                            ": Broadcast from a root out of range gave ", st.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunCollectiveChecks(Communicator& c) {
  FLOTILLA_RETURN_IF_ERROR(c.Barrier());
  FLOTILLA_RETURN_IF_ERROR(CheckArgumentErrors(c));
  FLOTILLA_RETURN_IF_ERROR(CheckBroadcast(c));
  FLOTILLA_RETURN_IF_ERROR(CheckAllGather(c));
  FLOTILLA_RETURN_IF_ERROR(CheckAllReduce(c));
  FLOTILLA_RETURN_IF_ERROR(CheckAllToAllV(c, /*all_zero=*/false));
  FLOTILLA_RETURN_IF_ERROR(CheckAllToAllV(c, /*all_zero=*/true));
  return c.Barrier();
}

}  // namespace flotilla::comm::testing
