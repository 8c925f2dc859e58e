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
  absl::StatusOr<nlohmann::ordered_json> schema = ParseJson<nlohmann::ordered_json>(text, what);
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
  c->StartHeader(c->at_, false);
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

void OutputConstraint::StartHeader(Cursor& c, bool after_message) const {
  c.phase = Phase::kHeader;
  const size_t half = forms_.size() / 2;
  uint64_t forms = 0;
  for (size_t i = 0; i < half; ++i) {
    const size_t f = after_message ? half + i : i;
    if (forms_[f].analysis && c.reasoning_used >= reasoning_budget_) continue;
    forms |= 1ull << f;
  }
  c.header = HeaderState{forms, 0};
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
  const std::string key =
      absl::StrCat(header_cache_id_, ":", at_.header.alive, ":", at_.header.pos);
  if (cache_->Lookup(key, bits, index_->words())) return;
  for (size_t f = 0; f < forms_.size(); ++f) {
    if (!((at_.header.alive >> f) & 1)) continue;
    const std::vector<int32_t>& s = forms_[f].symbols;
    if (at_.header.pos < static_cast<int>(s.size()) && s[at_.header.pos] >= kSpecial) {
      SetBit(bits, s[at_.header.pos] - kSpecial);
    }
  }
  index_->AllowAccepted(
      at_.header, [this](HeaderState& h, uint8_t b) { return FeedHeader(h, b); }, &header_scratch_,
      bits);
  cache_->Insert(key, bits, index_->words());
}

void OutputConstraint::BodyMask(uint32_t* bits) {
  const Form& form = forms_[at_.form];
  if (form.body == Body::kFree) {
    SetBit(bits, form.end_token);
    if (!(form.analysis && at_.reasoning_used >= reasoning_budget_)) index_->AllowAllOrdinary(bits);
    return;
  }
  const JsonMatcher& m = *matchers_[form.schema];
  const std::string key = absl::StrCat(form.cache_id, ":", at_.json.Key());
  if (cache_->Lookup(key, bits, index_->words())) return;
  if (m.CanEnd(at_.json)) SetBit(bits, form.end_token);
  auto feed = [&m](MatchState& s, uint8_t b) { return m.Feed(s, b); };
  int64_t room = 0;
  if (m.PlainStringRoom(at_.json, &room)) {  // inside a string: most tokens are text
    index_->AllowPlainText(room, bits);
    index_->AllowAcceptedNotPlain(at_.json, feed, &json_scratch_, bits);
  } else {
    index_->AllowAccepted(at_.json, feed, &json_scratch_, bits);
  }
  cache_->Insert(key, bits, index_->words());
}

const uint32_t* OutputConstraint::Mask() {
  if (at_.phase == Phase::kDone) return nullptr;
  if (mask_fresh_) return mask_.data();
  std::fill(mask_.begin(), mask_.end(), 0u);
  if (at_.phase == Phase::kHeader) {
    HeaderMask(mask_.data());
  } else {
    BodyMask(mask_.data());
  }
  mask_fresh_ = true;
  return mask_.data();
}

absl::Status OutputConstraint::Advance(int32_t token) {
  if (at_.phase == Phase::kDone) {
    return absl::FailedPreconditionError("structured output: the turn is already complete");
  }
  const uint32_t* allowed = Mask();
  if (token < 0 || token >= index_->vocab().vocab_size || !TestBit(allowed, token)) {
    return absl::InternalError(
        absl::StrCat("structured output: token ", token, " is not allowed here"));
  }
  mask_fresh_ = false;
  if (!Take(at_, token)) {
    return absl::InternalError("structured output: the matcher refused an allowed token");
  }
  return absl::OkStatus();
}

bool OutputConstraint::Take(Cursor& c, int32_t token) const {
  if (c.phase == Phase::kDone || token < 0 || token >= index_->vocab().vocab_size) return false;
  return c.phase == Phase::kHeader ? TakeHeader(c, token) : TakeBody(c, token);
}

bool OutputConstraint::TakeHeader(Cursor& c, int32_t token) const {
  const std::string& bytes = index_->vocab().bytes[token];
  if (bytes.empty()) {
    if (!FeedHeader(c.header, kSpecial + token)) return false;
  } else {
    for (char ch : bytes) {
      if (!FeedHeader(c.header, static_cast<uint8_t>(ch))) return false;
    }
  }
  for (size_t f = 0; f < forms_.size(); ++f) {
    if (((c.header.alive >> f) & 1) && c.header.pos == static_cast<int>(forms_[f].symbols.size())) {
      OpenBody(c, static_cast<int>(f));
      break;
    }
  }
  return true;
}

void OutputConstraint::OpenBody(Cursor& c, int form) const {
  c.form = form;
  c.phase = Phase::kBody;
  if (forms_[form].body == Body::kJson) c.json = matchers_[forms_[form].schema]->Start();
}

bool OutputConstraint::TakeBody(Cursor& c, int32_t token) const {
  const Form& form = forms_[c.form];
  const JsonMatcher* m = form.body == Body::kJson ? matchers_[form.schema].get() : nullptr;
  if (token == form.end_token) {
    if (m != nullptr && !m->CanEnd(c.json)) return false;
    if (form.analysis) {
      StartHeader(c, true);
    } else {
      c.phase = Phase::kDone;
    }
    return true;
  }
  const std::string& bytes = index_->vocab().bytes[token];
  if (bytes.empty()) return false;  // a special token the body does not end with
  if (form.analysis) {
    if (c.reasoning_used >= reasoning_budget_) return false;
    ++c.reasoning_used;
  }
  if (m != nullptr) {
    for (char ch : bytes) {
      if (!m->Feed(c.json, static_cast<uint8_t>(ch))) return false;
    }
  }
  return true;
}

size_t OutputConstraint::AcceptedPrefix(const std::vector<int32_t>& tokens) const {
  Cursor c = at_;
  size_t n = 0;
  while (n < tokens.size() && Take(c, tokens[n])) ++n;
  return n;
}

int32_t OutputConstraint::OnlyNext(const Cursor& c) const {
  if (c.phase == Phase::kHeader) {
    // The forms still matching must all continue with the same symbol.
    int32_t next = -1;
    for (size_t f = 0; f < forms_.size(); ++f) {
      if (!((c.header.alive >> f) & 1)) continue;
      const std::vector<int32_t>& s = forms_[f].symbols;
      if (c.header.pos >= static_cast<int>(s.size())) return -1;
      if (next >= 0 && s[c.header.pos] != next) return -1;
      next = s[c.header.pos];
    }
    return next;
  }
  if (c.phase != Phase::kBody) return -1;
  const Form& form = forms_[c.form];
  if (form.body == Body::kJson) return OnlyNextJson(c);
  // Free text: only the end token once the reasoning budget is spent.
  const bool spent = form.analysis && c.reasoning_used >= reasoning_budget_;
  return spent ? kSpecial + form.end_token : -1;
}

int32_t OutputConstraint::OnlyNextJson(const Cursor& c) const {
  const Form& form = forms_[c.form];
  const JsonMatcher& m = *matchers_[form.schema];
  int64_t room = 0;
  if (m.PlainStringRoom(c.json, &room) && room != 0) return -1;  // free string content
  const bool can_end = m.CanEnd(c.json);
  int32_t next = -1;
  MatchState probe;
  for (int b = 0; b < 256; ++b) {
    probe.CopyFrom(c.json);
    if (!m.Feed(probe, static_cast<uint8_t>(b))) continue;
    if (next >= 0 || can_end) return -1;  // a choice
    next = b;
  }
  if (next >= 0) return next;
  return can_end ? kSpecial + form.end_token : -1;
}

std::vector<ForcedPiece> OutputConstraint::Forced(int max_symbols) const {
  std::vector<ForcedPiece> pieces;
  Cursor c = at_;
  for (int n = 0; n < max_symbols; ++n) {
    const int32_t next = OnlyNext(c);
    if (next < 0) break;
    if (next >= kSpecial) {
      const int32_t token = next - kSpecial;
      if (!Take(c, token)) break;
      pieces.push_back(ForcedPiece{"", token});
      continue;
    }
    // A byte: fed on its own (the header and the matcher read bytes).
    if (c.phase == Phase::kHeader) {
      FeedHeader(c.header, next);
    } else if (!matchers_[forms_[c.form].schema]->Feed(c.json, static_cast<uint8_t>(next))) {
      break;
    }
    if (pieces.empty() || pieces.back().special >= 0) pieces.push_back(ForcedPiece{});
    pieces.back().bytes.push_back(static_cast<char>(next));
  }
  return pieces;
}

}  // namespace flotilla::grammar
