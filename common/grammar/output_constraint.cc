#include "common/grammar/output_constraint.h"

#include <functional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_parse.h"

namespace flotilla::grammar {
namespace {

// A name for `text` in cache keys: its length and two unrelated 64-bit
// hashes (the standard library's and FNV-1a).
std::string Fingerprint(std::string_view text) {
  uint64_t fnv = 14695981039346656037ull;
  for (unsigned char c : text) fnv = (fnv ^ c) * 1099511628211ull;
  return absl::StrCat(text.size(), ".", std::hash<std::string_view>{}(text), ".", fnv);
}

constexpr size_t kMaxTools = 30;  // two header sets of (tools + 2) forms fit 64 bits

absl::StatusOr<CompiledSchema> CompileText(const std::string& text, const std::string& what) {
  if (text.empty()) return AnyObjectSchema();
  absl::StatusOr<nlohmann::json> schema = ParseJson(text, what);
  if (!schema.ok()) return schema.status();
  absl::StatusOr<CompiledSchema> compiled = CompileSchema(*schema);
  if (!compiled.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", compiled.status().message()));
  }
  return compiled;
}

}  // namespace

absl::Status CheckSpec(const ConstraintSpec& spec) {
  if (spec.tools.size() > kMaxTools) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", kMaxTools, " tools can be constrained, got ", spec.tools.size()));
  }
  if (spec.tool_required && spec.tools.empty()) {
    return absl::InvalidArgumentError("a required tool call needs at least one tool");
  }
  if (spec.json_final) {
    absl::StatusOr<CompiledSchema> s = CompileText(spec.final_schema, "response_format schema");
    if (!s.ok()) return s.status();
  }
  for (const ConstraintSpec::Tool& tool : spec.tools) {
    if (tool.name.empty()) return absl::InvalidArgumentError("a constrained tool has no name");
    if (!tool.constrained) continue;
    absl::StatusOr<CompiledSchema> s =
        CompileText(tool.schema, absl::StrCat("parameters of tool '", tool.name, "'"));
    if (!s.ok()) return s.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<OutputConstraint>> OutputConstraint::Create(
    const ConstraintSpec& spec, std::shared_ptr<const VocabularyIndex> index) {
  if (index == nullptr) return absl::InvalidArgumentError("constraint: no vocabulary");
  if (absl::Status st = CheckSpec(spec); !st.ok()) return st;
  std::unique_ptr<OutputConstraint> c(new OutputConstraint(std::move(index)));
  if (absl::Status st = c->Build(spec); !st.ok()) return st;
  c->StartHeader(false);
  return c;
}

absl::Status OutputConstraint::Build(const ConstraintSpec& spec) {
  const TokenVocabulary& v = index_->vocab();
  for (int32_t id : {v.channel, v.message, v.end, v.start, v.return_, v.constrain, v.call}) {
    if (id < 0 || id >= v.vocab_size) {
      return absl::FailedPreconditionError(
          "constraint: the vocabulary lacks a Harmony special token it needs");
    }
  }
  std::vector<std::string> schema_texts;  // by schemas_ index
  auto add_schema = [&](const std::string& text) -> absl::StatusOr<int> {
    absl::StatusOr<CompiledSchema> s = CompileText(text, "schema");
    if (!s.ok()) return s.status();
    schemas_.push_back(std::make_unique<CompiledSchema>(*std::move(s)));
    schema_texts.push_back(text);
    matchers_.push_back(std::make_unique<JsonMatcher>(schemas_.back().get()));
    return static_cast<int>(schemas_.size()) - 1;
  };
  int final_schema = -1;
  if (spec.json_final) {
    absl::StatusOr<int> s = add_schema(spec.final_schema);
    if (!s.ok()) return s.status();
    final_schema = *s;
  }
  std::vector<int> tool_schema;
  for (const ConstraintSpec::Tool& tool : spec.tools) {
    int s = -1;
    if (tool.constrained) {
      absl::StatusOr<int> compiled = add_schema(tool.schema);
      if (!compiled.ok()) return compiled.status();
      s = *compiled;
    }
    tool_schema.push_back(s);
  }
  reasoning_budget_ = spec.reasoning_budget;
  // Two sets: the first header, and the headers after an analysis message.
  for (bool after : {false, true}) {
    std::vector<int32_t> prefix;
    if (after) {
      prefix.push_back(kSpecial + v.start);
      for (char ch : std::string("assistant")) prefix.push_back(static_cast<uint8_t>(ch));
    }
    auto form = [&](const std::string& text, std::vector<int32_t> tail) {
      Form f;
      f.symbols = prefix;
      f.symbols.push_back(kSpecial + v.channel);
      for (char ch : text) f.symbols.push_back(static_cast<uint8_t>(ch));
      for (int32_t t : tail) f.symbols.push_back(kSpecial + t);
      return f;
    };
    Form analysis = form("analysis", {v.message});
    analysis.analysis = true;
    analysis.end_token = v.end;
    forms_.push_back(analysis);
    if (!spec.tool_required) {
      Form final = form("final", {v.message});
      final.end_token = v.return_;
      if (final_schema >= 0) final.body = Body::kJson, final.schema = final_schema;
      forms_.push_back(final);
    }
    for (size_t i = 0; i < spec.tools.size(); ++i) {
      Form call = form("commentary to=functions." + spec.tools[i].name, {v.constrain});
      for (char ch : std::string("json")) call.symbols.push_back(static_cast<uint8_t>(ch));
      call.symbols.push_back(kSpecial + v.message);
      call.end_token = v.call;
      if (tool_schema[i] >= 0) call.body = Body::kJson, call.schema = tool_schema[i];
      forms_.push_back(call);
    }
  }
  // Cache keys: a JSON body's masks depend on its schema and end token, a
  // header's on every form's symbols.
  std::string symbols;
  for (Form& f : forms_) {
    if (f.body == Body::kJson) {
      f.cache_id = absl::StrCat("b", f.end_token, ":", Fingerprint(schema_texts[f.schema]));
    }
    absl::StrAppend(&symbols, absl::StrJoin(f.symbols, ","), ";");
  }
  header_cache_id_ = absl::StrCat("h", Fingerprint(symbols));
  cache_ = MaskCache::For(index_);
  mask_.assign(index_->words(), 0);
  return absl::OkStatus();
}

void OutputConstraint::StartHeader(bool after_message) {
  phase_ = Phase::kHeader;
  const size_t half = forms_.size() / 2;
  header_forms_ = 0;
  for (size_t i = 0; i < half; ++i) {
    const size_t f = after_message ? half + i : i;
    if (forms_[f].analysis && reasoning_used_ >= reasoning_budget_) continue;
    header_forms_ |= 1ull << f;
  }
  header_ = HeaderState{header_forms_, 0};
  mask_fresh_ = false;
}

bool OutputConstraint::FeedHeader(HeaderState& h, int32_t symbol) const {
  uint64_t alive = 0;
  for (size_t f = 0; f < forms_.size(); ++f) {
    if (!((h.alive >> f) & 1)) continue;
    const std::vector<int32_t>& s = forms_[f].symbols;
    if (h.pos < static_cast<int>(s.size()) && s[h.pos] == symbol) alive |= 1ull << f;
  }
  h.alive = alive;
  ++h.pos;
  return alive != 0;
}

void OutputConstraint::HeaderMask(uint32_t* bits) {
  const std::string key = absl::StrCat(header_cache_id_, ":", header_.alive, ":", header_.pos);
  if (cache_->Lookup(key, bits, index_->words())) return;
  for (size_t f = 0; f < forms_.size(); ++f) {
    if (!((header_.alive >> f) & 1)) continue;
    const std::vector<int32_t>& s = forms_[f].symbols;
    if (header_.pos < static_cast<int>(s.size()) && s[header_.pos] >= kSpecial) {
      SetBit(bits, s[header_.pos] - kSpecial);
    }
  }
  index_->AllowAccepted(
      header_, [this](HeaderState& h, uint8_t b) { return FeedHeader(h, b); }, &header_scratch_,
      bits);
  cache_->Insert(key, bits, index_->words());
}

void OutputConstraint::BodyMask(uint32_t* bits) {
  const Form& form = forms_[form_];
  if (form.body == Body::kFree) {
    SetBit(bits, form.end_token);
    if (!(form.analysis && reasoning_used_ >= reasoning_budget_)) index_->AllowAllOrdinary(bits);
    return;
  }
  const JsonMatcher& m = *matchers_[form.schema];
  const std::string key = absl::StrCat(form.cache_id, ":", json_.Key());
  if (cache_->Lookup(key, bits, index_->words())) return;
  if (m.CanEnd(json_)) SetBit(bits, form.end_token);
  auto feed = [&m](MatchState& s, uint8_t b) { return m.Feed(s, b); };
  int64_t room = 0;
  if (m.PlainStringRoom(json_, &room)) {  // inside a string: most tokens are text
    index_->AllowPlainText(room, bits);
    index_->AllowAcceptedNotPlain(json_, feed, &json_scratch_, bits);
  } else {
    index_->AllowAccepted(json_, feed, &json_scratch_, bits);
  }
  cache_->Insert(key, bits, index_->words());
}

const uint32_t* OutputConstraint::Mask() {
  if (phase_ == Phase::kDone) return nullptr;
  if (mask_fresh_) return mask_.data();
  std::fill(mask_.begin(), mask_.end(), 0u);
  if (phase_ == Phase::kHeader) {
    HeaderMask(mask_.data());
  } else {
    BodyMask(mask_.data());
  }
  mask_fresh_ = true;
  return mask_.data();
}

absl::Status OutputConstraint::Advance(int32_t token) {
  if (phase_ == Phase::kDone) {
    return absl::FailedPreconditionError("structured output: the turn is already complete");
  }
  const uint32_t* allowed = Mask();
  if (token < 0 || token >= index_->vocab().vocab_size || !TestBit(allowed, token)) {
    return absl::InternalError(
        absl::StrCat("structured output: token ", token, " is not allowed here"));
  }
  mask_fresh_ = false;
  return phase_ == Phase::kHeader ? AdvanceHeader(token) : AdvanceBody(token);
}

absl::Status OutputConstraint::AdvanceHeader(int32_t token) {
  const std::string& bytes = index_->vocab().bytes[token];
  if (bytes.empty()) {
    FeedHeader(header_, kSpecial + token);
  } else {
    for (char ch : bytes) FeedHeader(header_, static_cast<uint8_t>(ch));
  }
  for (size_t f = 0; f < forms_.size(); ++f) {
    if (((header_.alive >> f) & 1) && header_.pos == static_cast<int>(forms_[f].symbols.size())) {
      OpenBody(static_cast<int>(f));
      break;
    }
  }
  return absl::OkStatus();
}

void OutputConstraint::OpenBody(int form) {
  form_ = form;
  phase_ = Phase::kBody;
  if (forms_[form].body == Body::kJson) json_ = matchers_[forms_[form].schema]->Start();
}

absl::Status OutputConstraint::AdvanceBody(int32_t token) {
  const Form& form = forms_[form_];
  if (token == form.end_token) {
    if (form.analysis) {
      StartHeader(true);
    } else {
      phase_ = Phase::kDone;
    }
    return absl::OkStatus();
  }
  if (form.analysis) ++reasoning_used_;
  if (form.body == Body::kJson) {
    const JsonMatcher& m = *matchers_[form.schema];
    for (char ch : index_->vocab().bytes[token]) {
      if (!m.Feed(json_, static_cast<uint8_t>(ch))) {
        return absl::InternalError("structured output: the matcher refused an allowed token");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace flotilla::grammar
