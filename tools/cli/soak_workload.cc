#include "tools/cli/soak_workload.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flotilla::cli {
namespace {

v1::GenerateRequest RandomRequest(const SoakRequestOptions& options, std::mt19937_64& rng) {
  v1::GenerateRequest request;
  const int prompt = std::uniform_int_distribution<int>(1, 32)(rng);
  for (int i = 0; i < prompt; ++i) {
    request.mutable_prompt_ids()->add_ids(
        std::uniform_int_distribution<int>(0, options.vocab - 1)(rng));
  }
  request.mutable_sampling()->set_max_tokens(
      std::uniform_int_distribution<uint32_t>(1, options.max_tokens)(rng));
  return request;
}

// Something the server must refuse with INVALID_ARGUMENT before any work.
v1::GenerateRequest MalformedRequest(const SoakRequestOptions& options, std::mt19937_64& rng) {
  v1::GenerateRequest request = RandomRequest(options, rng);
  switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
    case 0:
      request.mutable_prompt_ids()->clear_ids();  // empty prompt
      break;
    case 1:
      request.mutable_prompt_ids()->set_ids(0, -7);  // negative token id
      break;
    default:
      request.mutable_prompt_ids()->set_ids(0, 1 << 30);  // past any vocabulary
      break;
  }
  return request;
}

void CountError(const absl::Status& status, SoakTally* tally) {
  if (absl::IsDeadlineExceeded(status)) {
    ++tally->hung;
  } else {
    ++tally->failed[absl::StatusCodeToString(status.code())];
  }
}

void RunStream(client::Client& client, const v1::GenerateRequest& request, bool cancel,
               SoakTally* tally) {
  common::FinishReason finish = common::FINISH_REASON_UNSPECIFIED;
  std::string request_id;
  bool cancel_sent = false;
  const absl::Status status = client.GenerateStream(request, [&](const v1::GenerateResponse& r) {
    if (!r.request_id().empty()) request_id = r.request_id();
    if (r.finish_reason() != common::FINISH_REASON_UNSPECIFIED) finish = r.finish_reason();
    if (cancel && !cancel_sent && r.token_ids_size() > 0 && !request_id.empty()) {
      cancel_sent = true;
      (void)client.Cancel(request_id);  // the stream then ends CANCELLED
    }
  });
  // A Generate stream cancelled through Cancel ends with the CANCELLED status.
  if (cancel_sent && absl::IsCancelled(status)) {
    ++tally->cancelled;
    return;
  }
  if (!status.ok()) return CountError(status, tally);
  if (finish == common::FINISH_REASON_UNSPECIFIED) {
    ++tally->lost;
  } else if (finish == common::CANCELLED) {
    ++tally->cancelled;
  } else if (finish == common::ERROR) {
    ++tally->failed["ERROR_FINISH"];
  } else {
    ++tally->ok;
  }
}

}  // namespace

void SoakTally::Add(const SoakTally& other) {
  requests += other.requests;
  ok += other.ok;
  cancelled += other.cancelled;
  refused += other.refused;
  lost += other.lost;
  hung += other.hung;
  wrong += other.wrong;
  for (const auto& [code, n] : other.failed) failed[code] += n;
}

int64_t SoakTally::failed_total() const {
  int64_t n = 0;
  for (const auto& [code, count] : failed) n += count;
  return n;
}

nlohmann::json SoakTally::ToJson() const {
  return {{"requests", requests},
          {"ok", ok},
          {"cancelled", cancelled},
          {"refused", refused},
          {"lost", lost},
          {"hung", hung},
          {"wrong", wrong},
          {"failed", failed_total()},
          {"failed_by_code", failed}};
}

SoakKind DrawSoakKind(std::mt19937_64& rng) {
  const int roll = std::uniform_int_distribution<int>(0, 99)(rng);
  if (roll < 70) return SoakKind::kStream;
  if (roll < 85) return SoakKind::kCancel;
  return SoakKind::kMalformed;
}

void RunSoakRequest(client::Client& client, SoakKind kind, const SoakRequestOptions& options,
                    std::mt19937_64& rng, SoakTally* tally) {
  ++tally->requests;
  if (kind != SoakKind::kMalformed) {
    return RunStream(client, RandomRequest(options, rng), kind == SoakKind::kCancel, tally);
  }
  absl::StatusOr<client::GenerateResult> got = client.Generate(MalformedRequest(options, rng));
  if (absl::IsInvalidArgument(got.status())) {
    ++tally->refused;
  } else if (absl::IsDeadlineExceeded(got.status())) {
    ++tally->hung;
  } else {
    ++tally->wrong;
  }
}

}  // namespace flotilla::cli
