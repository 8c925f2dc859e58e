#include "worker/engine_probe.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla::worker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kDefaultContext = 1024, kDefaultSteps = 32, kDefaultWarmup = 4,
                   kDefaultRepeats = 3;
constexpr uint32_t kMaxSteps = 4096, kMaxRepeats = 64, kMaxLengths = 16;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Engine sequences that exist only for the probe; freed on every path out.
class TemporarySequences {
 public:
  explicit TemporarySequences(Engine& engine) : engine_(engine) {}
  ~TemporarySequences() { Clear(); }
  int64_t Add() { return ids_.emplace_back(engine_.NewSequence()); }
  const std::vector<int64_t>& ids() const { return ids_; }
  void Clear() {
    for (int64_t id : ids_) (void)engine_.FreeSequence(id);
    ids_.clear();
  }

 private:
  Engine& engine_;
  std::vector<int64_t> ids_;
};

// The request with defaults filled in, batch sizes sorted, clamped and unique.
struct ProbePlan {
  std::vector<uint32_t> batches;
  uint32_t context = 0, steps = 0, warmup = 0, repeats = 0;
  std::vector<uint32_t> prefill;
  int64_t decode_length = 0;  // longest a decode sequence gets
};

absl::StatusOr<ProbePlan> PlanProbe(const Engine& engine, const cluster::MeasureEngineRequest& r,
                                    const ProbeLimits& limits) {
  ProbePlan p;
  p.context = r.context_tokens() == 0 ? kDefaultContext : r.context_tokens();
  p.steps = r.steps() == 0 ? kDefaultSteps : r.steps();
  p.warmup = r.warmup_steps() == 0 ? kDefaultWarmup : r.warmup_steps();
  p.repeats = r.prefill_repeats() == 0 ? kDefaultRepeats : r.prefill_repeats();
  if (p.steps > kMaxSteps || p.warmup > kMaxSteps || p.repeats > kMaxRepeats ||
      r.batch_sizes_size() > static_cast<int>(kMaxLengths) ||
      r.prefill_tokens_size() > static_cast<int>(kMaxLengths)) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", kMaxSteps, " steps, ", kMaxRepeats, " prefill repeats and ",
                     kMaxLengths, " batch sizes and prompt lengths per measurement"));
  }
  const uint32_t cap = static_cast<uint32_t>(std::max<int64_t>(1, limits.max_sequences));
  for (uint32_t b : r.batch_sizes()) p.batches.push_back(std::clamp<uint32_t>(b, 1, cap));
  if (p.batches.empty()) p.batches.push_back(1);
  std::sort(p.batches.begin(), p.batches.end());
  p.batches.erase(std::unique(p.batches.begin(), p.batches.end()), p.batches.end());
  p.prefill.assign(r.prefill_tokens().begin(), r.prefill_tokens().end());
  // Every batch size adds warm-up and timed tokens to the shared sequences.
  p.decode_length = p.context + static_cast<int64_t>(p.batches.size()) * (p.warmup + p.steps);
  const int64_t max_len = engine.MaxSequenceLength();
  if (p.decode_length > max_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode at context ", p.context, " for ", p.batches.size(), " batch sizes reaches ",
        p.decode_length, " tokens; the engine holds at most ", max_len, " per sequence"));
  }
  for (uint32_t n : p.prefill) {
    if (n == 0 || n > max_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefill length ", n, " is outside [1, ", max_len, "]"));
    }
  }
  return p;
}

// The probe's peak KV use: prefills run one at a time, before the decode sequences exist.
absl::Status CheckKv(const Engine& engine, const ProbePlan& p, const ProbeLimits& limits) {
  int64_t prefill_need = 0;
  for (uint32_t n : p.prefill) prefill_need = std::max(prefill_need, engine.KvBlocksForLength(n));
  const int64_t decode_need = p.batches.back() * engine.KvBlocksForLength(p.decode_length);
  const int64_t need = std::max(prefill_need, decode_need);
  if (need > limits.kv_blocks_available) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the measurement needs ", need, " KV blocks (", p.batches.back(), " sequences of ",
        p.decode_length, " tokens) but ", limits.kv_blocks_available,
        " are free beside the running requests; lower the batch or the context, or retry idle"));
  }
  return absl::OkStatus();
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int vocab, int64_t n) {
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = token(rng);
  return out;
}

absl::StatusOr<cluster::PrefillTiming> TimePrefill(Engine& engine, uint32_t length,
                                                   const ProbePlan& p, const ProbeLimits& limits,
                                                   const ProbeLockstep& lockstep,
                                                   std::mt19937& rng) {
  const std::vector<int32_t> prompt = RandomTokens(rng, engine.config().vocab_size, length);
  std::vector<double> ms;
  for (uint32_t i = 0; i <= p.repeats; ++i) {  // the first one warms up
    TemporarySequences seq(engine);
    const int64_t id = seq.Add();
    const Clock::time_point start = Clock::now();
    FLOTILLA_RETURN_IF_ERROR(ProbePrefill(engine, id, prompt, limits.max_batch_tokens, lockstep));
    if (i > 0) ms.push_back(MsSince(start));
  }
  cluster::PrefillTiming t;
  t.set_prompt_tokens(length);
  t.set_chunk_tokens(static_cast<uint32_t>(limits.max_batch_tokens));
  t.set_repeats(p.repeats);
  t.set_ms_p50(Median(ms));
  t.set_ms_min(*std::min_element(ms.begin(), ms.end()));
  return t;
}

// Warm-up then timed steps of the first `batch` sequences, one token each.
absl::StatusOr<cluster::DecodeTiming> TimeDecode(Engine& engine, const std::vector<int64_t>& all,
                                                 uint32_t batch, const ProbePlan& p,
                                                 const ProbeLockstep& lockstep,
                                                 std::mt19937& rng) {
  const std::vector<int64_t> sequences(all.begin(), all.begin() + batch);
  int64_t context = 0;  // summed, then the mean (earlier batch sizes grew the first sequences)
  for (int64_t s : sequences) {
    FLOTILLA_ASSIGN_OR_RETURN(const int64_t length, engine.SequenceLength(s));
    context += length;
  }
  context /= batch;
  std::vector<double> ms;
  for (uint32_t i = 0; i < p.warmup + p.steps; ++i) {
    const std::vector<int32_t> tokens = RandomTokens(rng, engine.config().vocab_size, batch);
    const Clock::time_point start = Clock::now();
    FLOTILLA_RETURN_IF_ERROR(ProbeDecodeStep(engine, sequences, tokens, lockstep));
    if (i >= p.warmup) ms.push_back(MsSince(start));
  }
  cluster::DecodeTiming t;
  t.set_batch(batch);
  t.set_context_tokens(static_cast<uint32_t>(context));
  t.set_steps(p.steps);
  t.set_step_ms_p50(Median(ms));
  t.set_step_ms_mean(std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size());
  t.set_step_ms_min(*std::min_element(ms.begin(), ms.end()));
  t.set_step_ms_max(*std::max_element(ms.begin(), ms.end()));
  return t;
}

// Fills the largest batch's sequences to the context once; each batch size
// then times steps on a prefix of them (so contexts grow by the steps run).
absl::Status MeasureDecode(Engine& engine, const ProbePlan& p, const ProbeLimits& limits,
                           const ProbeLockstep& lockstep, std::mt19937& rng,
                           cluster::EngineMeasurement* out) {
  TemporarySequences seqs(engine);
  for (uint32_t i = 0; i < p.batches.back(); ++i) {
    const int64_t id = seqs.Add();
    FLOTILLA_RETURN_IF_ERROR(ProbePrefill(engine, id,
                                          RandomTokens(rng, engine.config().vocab_size, p.context),
                                          limits.max_batch_tokens, lockstep));
  }
  for (uint32_t batch : p.batches) {
    FLOTILLA_ASSIGN_OR_RETURN(*out->add_decode(),
                              TimeDecode(engine, seqs.ids(), batch, p, lockstep, rng));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Tokens are drawn the way the serving loop draws them: on the engine's
// device by a greedy sampler, no logit rows returned.
std::unique_ptr<Sampler> ProbeSampler(const Engine& engine) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.seed = 0;
  params.max_tokens = 1 << 30;
  return std::move(Sampler::Create(params, engine.config().vocab_size)).value();
}

}  // namespace

absl::Status ProbeDecodeStep(Engine& engine, const std::vector<int64_t>& sequences,
                             const std::vector<int32_t>& tokens, const ProbeLockstep& lockstep) {
  std::vector<std::unique_ptr<Sampler>> samplers;
  std::vector<StepItem> items(sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i) {
    samplers.push_back(ProbeSampler(engine));
    items[i].sequence = sequences[i];
    items[i].tokens = {tokens[i]};
    items[i].logits = LogitsMode::kNone;
    if (lockstep.sample) items[i].sampler = samplers.back().get();
    items[i].group_logits =
        lockstep.group_logits && sequences.size() <= static_cast<size_t>(kMaxGroupLogitRows);
  }
  if (lockstep.before_step) {
    FLOTILLA_RETURN_IF_ERROR(lockstep.before_step(static_cast<int64_t>(tokens.size())));
  }
  return engine.Step(items).status();
}

absl::Status ProbePrefill(Engine& engine, int64_t sequence, const std::vector<int32_t>& prompt,
                          int64_t chunk_tokens, const ProbeLockstep& lockstep) {
  const int64_t chunk = std::max<int64_t>(1, chunk_tokens);
  for (size_t done = 0; done < prompt.size();) {
    const size_t n = std::min<size_t>(chunk, prompt.size() - done);
    StepItem item;
    item.sequence = sequence;
    item.tokens.assign(prompt.begin() + done, prompt.begin() + done + n);
    done += n;
    item.logits = LogitsMode::kNone;
    std::unique_ptr<Sampler> sampler = ProbeSampler(engine);
    if (done == prompt.size() && lockstep.sample) item.sampler = sampler.get();
    item.group_logits = done == prompt.size() && lockstep.group_logits;
    if (lockstep.before_step) FLOTILLA_RETURN_IF_ERROR(lockstep.before_step(n));
    FLOTILLA_RETURN_IF_ERROR(engine.Step({item}).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<cluster::EngineMeasurement> MeasureEngine(
    Engine& engine, const cluster::MeasureEngineRequest& request, const ProbeLimits& limits,
    const ProbeLockstep& lockstep) {
  FLOTILLA_ASSIGN_OR_RETURN(const ProbePlan plan, PlanProbe(engine, request, limits));
  FLOTILLA_RETURN_IF_ERROR(CheckKv(engine, plan, limits));
  const Clock::time_point start = Clock::now();
  std::mt19937 rng(20240806);
  cluster::EngineMeasurement out;
  for (uint32_t n : plan.prefill) {
    FLOTILLA_ASSIGN_OR_RETURN(*out.add_prefill(),
                              TimePrefill(engine, n, plan, limits, lockstep, rng));
  }
  FLOTILLA_RETURN_IF_ERROR(MeasureDecode(engine, plan, limits, lockstep, rng, &out));
  out.set_wall_ms(MsSince(start));
  return out;
}

}  // namespace flotilla::worker
