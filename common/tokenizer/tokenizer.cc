#include "common/tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <queue>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla::tokenizer {
namespace {

// The o200k_base pre-tokenisation pattern, tiktoken's, with each character
// class spelled out (see BuildPattern): UPPERISH = [Lu Lt Lm Lo M],
// LOWERISH = [Ll Lm Lo M], L = [Lu Ll Lt Lm Lo], N, and WS (White_Space).
//   [^\r\n L N]? UPPERISH* LOWERISH+ (?i:'s|'t|'re|'ve|'m|'ll|'d)?
// | [^\r\n L N]? UPPERISH+ LOWERISH* (?i:'s|'t|'re|'ve|'m|'ll|'d)?
// | N{1,3}
// |  ?[^WS L N]+[\r\n/]*
// | WS*[\r\n]+
// | WS+(?!NOT_WS)
// | WS+
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

void AppendRanges(const Ranges& ranges, std::string& out) {
  char buf[48];
  for (auto [a, b] : ranges) {
    if (a == b) {
      std::snprintf(buf, sizeof(buf), "\\x{%x}", a);
    } else {
      std::snprintf(buf, sizeof(buf), "\\x{%x}-\\x{%x}", a, b);
    }
    out += buf;
  }
}

constexpr char kMagic[8] = {'F', 'L', 'T', 'R', 'A', 'N', 'K', '1'};
constexpr TokenId kNumRanks = kFirstSpecialId;  // o200k_base: ids 0..199997

// Class bits of a code point for the scanner.
constexpr uint8_t kUpperish = 1;  // [Lu Lt Lm Lo M]
constexpr uint8_t kLowerish = 2;  // [Ll Lm Lo M]
constexpr uint8_t kLetter = 4;    // L
constexpr uint8_t kNumber = 8;    // N
constexpr uint8_t kSpace = 16;    // White_Space

// Decodes the code point at `i` of valid UTF-8; sets `len` to its byte count.
inline uint32_t DecodeAt(const unsigned char* s, size_t i, size_t& len) {
  const uint32_t c = s[i];
  if (c < 0x80) {
    len = 1;
    return c;
  }
  if (c < 0xE0) {
    len = 2;
    return ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
  }
  if (c < 0xF0) {
    len = 3;
    return ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
  }
  len = 4;
  return ((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

uint32_t ReadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // the file is little-endian, as is every host we build for
}

// Membership bitmap of a class given as ranges.
std::vector<uint8_t> Bitmap(const Ranges& ranges) {
  std::vector<uint8_t> bits(0x110000, 0);
  for (auto [a, b] : ranges) {
    for (uint32_t c = a; c <= b && c < 0x110000; ++c) bits[c] = 1;
  }
  return bits;
}

Ranges RangesOf(const std::vector<uint8_t>& bits) {
  Ranges out;
  for (uint32_t c = 0; c < bits.size(); ++c) {
    if (!bits[c]) continue;
    if (!out.empty() && out.back().second + 1 == c) {
      out.back().second = c;
    } else {
      out.push_back({c, c});
    }
  }
  return out;
}

void AppendUtf8(uint32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

uint32_t DecodeUtf8At(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  const uint32_t c = b(0);
  if (c < 0x80) return c;
  if (c < 0xE0) return ((c & 0x1F) << 6) | (b(1) & 0x3F);
  if (c < 0xF0) return ((c & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return ((c & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

// Which code points PCRE2's own tables put in `\p{PROP}`: one scan of a string
// holding every scalar value.
absl::StatusOr<std::vector<uint8_t>> Pcre2Membership(const std::string& all, const std::string& prop) {
  const std::string pattern = "\\p{" + prop + "}+";
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_offset, nullptr);
  if (code == nullptr) return absl::InternalError(absl::StrCat("PCRE2 lacks \\p{", prop, "}"));
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  std::vector<uint8_t> bits(0x110000, 0);
  size_t pos = 0;
  while (pos < all.size() &&
         pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(all.data()), all.size(), pos, PCRE2_NO_UTF_CHECK, md,
                     nullptr) > 0) {
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t last = ov[1] - 1;
    while ((static_cast<unsigned char>(all[last]) & 0xC0) == 0x80) --last;
    const uint32_t first_cp = DecodeUtf8At(all, ov[0]);
    const uint32_t last_cp = DecodeUtf8At(all, last);
    for (uint32_t c = first_cp; c <= last_cp; ++c) bits[c] = 1;
    pos = ov[1];
  }
  pcre2_match_data_free(md);
  pcre2_code_free(code);
  return bits;
}

// The pattern, with PCRE2's Unicode classes patched to the reference's tables:
// "\p{Lu}" plus the code points the reference has and PCRE2 lacks (newer
// Unicode), or, if PCRE2 has any the reference lacks, the reference's ranges.
absl::StatusOr<std::string> BuildPattern(const absl::flat_hash_map<std::string, Ranges>& classes) {
  std::string all;
  all.reserve(0x110000 * 4);
  for (uint32_t c = 1; c < 0x110000; ++c) {
    if (c < 0xD800 || c > 0xDFFF) AppendUtf8(c, all);
  }
  absl::flat_hash_map<std::string, std::string> items;
  for (const char* prop : {"Lu", "Ll", "Lt", "Lm", "Lo", "M", "N"}) {
    const Ranges& ref = classes.at(prop);
    FLOTILLA_ASSIGN_OR_RETURN(std::vector<uint8_t> pcre, Pcre2Membership(all, prop));
    std::vector<uint8_t> want = Bitmap(ref), extra(0x110000, 0);
    bool pcre_has_more = false;
    for (uint32_t c = 0; c < 0x110000; ++c) {
      extra[c] = want[c] && !pcre[c];
      pcre_has_more |= pcre[c] && !want[c];
    }
    std::string item;
    if (pcre_has_more) {
      AppendRanges(ref, item);
    } else {
      item = absl::StrCat("\\p{", prop, "}");
      AppendRanges(RangesOf(extra), item);
    }
    items[prop] = std::move(item);
  }
  std::string ws;
  AppendRanges(classes.at("WS"), ws);
  const std::string letters = items["Lu"] + items["Ll"] + items["Lt"] + items["Lm"] + items["Lo"];
  const std::string upperish = "[" + items["Lu"] + items["Lt"] + items["Lm"] + items["Lo"] + items["M"] + "]";
  const std::string lowerish = "[" + items["Ll"] + items["Lm"] + items["Lo"] + items["M"] + "]";
  const std::string prefix = "[^\\r\\n" + letters + items["N"] + "]?";
  const std::string contractions = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?";
  return absl::StrCat(prefix, upperish, "*", lowerish, "+", contractions,                //
                      "|", prefix, upperish, "+", lowerish, "*", contractions,           //
                      "|[", items["N"], "]{1,3}",                                        //
                      "| ?[^", ws, letters, items["N"], "]+[\\r\\n/]*",              //
                      "|[", ws, "]*[\\r\\n]+",                                       //
                      "|[", ws, "]+(?![^", ws, "])",                                     //
                      "|[", ws, "]+");
}

}  // namespace

struct Tokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

size_t ValidUtf8Prefix(std::string_view s, bool* invalid) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  auto fail = [&](bool bad) {
    if (invalid != nullptr) *invalid = bad;
    return i;
  };
  while (i < n) {
    // ASCII fast path, eight bytes at a time.
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return fail(true);
    }
    for (size_t k = 1; k < len; ++k) {
      if (i + k >= n) return fail(false);  // truncated at the end
      const unsigned char b = p[i + k];
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return fail(true);
    }
    i += len;
  }
  return fail(false);
}

absl::Status CheckUtf8(std::string_view bytes, std::string_view what) {
  bool invalid = false;
  const size_t ok = ValidUtf8Prefix(bytes, &invalid);
  if (ok == bytes.size()) return absl::OkStatus();
  const auto b = static_cast<unsigned char>(bytes[ok]);
  static constexpr char kHex[] = "0123456789abcdef";
  const std::string hex = {'0', 'x', kHex[b >> 4], kHex[b & 15]};
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(what), " is not valid UTF-8: ",
      invalid ? "invalid byte " : "incomplete sequence starting with byte ", hex, " at offset ",
      ok));
}

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(const std::string& ranks_path,
                                                             Splitter splitter) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  FLOTILLA_RETURN_IF_ERROR(t->Init(ranks_path, splitter));
  return t;
}

std::string Tokenizer::DefaultRanksPath() {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "share/flotilla/o200k_base.ranks";
  fs::path dir = exe.parent_path();
  fs::path beside = dir / "o200k_base.ranks";
  if (fs::exists(beside, ec)) return beside.string();
  fs::path first_candidate = dir / ".." / "share" / "flotilla" / "o200k_base.ranks";
  for (int up = 0; up <= 4 && !dir.empty(); ++up) {
    fs::path candidate = dir / "share" / "flotilla" / "o200k_base.ranks";
    if (fs::exists(candidate, ec)) return candidate.string();
    if (dir == dir.parent_path()) break;
    dir = dir.parent_path();
  }
  return first_candidate.lexically_normal().string();
}

absl::Status Tokenizer::Init(const std::string& path, Splitter splitter) {
  splitter_ = splitter;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "tokenizer ranks file '", path,
        "' cannot be opened (it is generated at build time from the js-tiktoken npm package; "
        "run tools/setup.sh, rebuild, or pass --tokenizer PATH)"));
  }
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](std::string_view why) {
    return absl::DataLossError(
        absl::StrCat("tokenizer ranks file '", path, "' is malformed: ", std::string(why)));
  };
  if (data.size() < 16 || std::memcmp(data.data(), kMagic, 8) != 0) return bad("bad magic");
  const uint32_t n = ReadU32(data.data() + 8);
  const uint32_t total = ReadU32(data.data() + 12);
  if (n != kNumRanks) {
    return bad(absl::StrCat("expected ", kNumRanks, " o200k_base ranks, found ", n));
  }
  const size_t header = 16 + 4 * (static_cast<size_t>(n) + 1);
  if (data.size() < header + total + 4) return bad("shorter than its header says");
  offsets_.resize(n + 1);
  for (uint32_t i = 0; i <= n; ++i) offsets_[i] = ReadU32(data.data() + 16 + 4 * i);
  if (offsets_[0] != 0 || offsets_[n] != total) return bad("offsets do not span the blob");
  for (uint32_t i = 0; i < n; ++i) {
    if (offsets_[i + 1] <= offsets_[i]) return bad(absl::StrCat("empty token at rank ", i));
  }
  blob_ = data.substr(header, total);
  // Character classes of the reference regex engine.
  absl::flat_hash_map<std::string, Ranges> classes;
  size_t at = header + total;
  const uint32_t num_classes = ReadU32(data.data() + at);
  at += 4;
  for (uint32_t k = 0; k < num_classes; ++k) {
    if (at + 8 > data.size()) return bad("truncated character classes");
    std::string name(data.data() + at, strnlen(data.data() + at, 4));
    const uint32_t r = ReadU32(data.data() + at + 4);
    at += 8;
    if (at + 8ull * r > data.size()) return bad(absl::StrCat("truncated character class ", name));
    Ranges ranges(r);
    for (uint32_t i = 0; i < r; ++i) {
      ranges[i] = {ReadU32(data.data() + at + 8 * i), ReadU32(data.data() + at + 8 * i + 4)};
      if (ranges[i].second < ranges[i].first || ranges[i].second > 0x10FFFF ||
          (i > 0 && ranges[i].first <= ranges[i - 1].second)) {
        return bad(absl::StrCat("character class ", name, " is not sorted code point ranges"));
      }
    }
    at += 8ull * r;
    classes[name] = std::move(ranges);
  }
  if (at != data.size()) return bad("trailing bytes");
  for (const char* need : {"Lu", "Ll", "Lt", "Lm", "Lo", "M", "N", "WS"}) {
    if (!classes.contains(need)) return bad(absl::StrCat("character class ", need, " is missing"));
  }
  ranks_.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view bytes(blob_.data() + offsets_[i], offsets_[i + 1] - offsets_[i]);
    if (!ranks_.emplace(bytes, i).second) return bad(absl::StrCat("duplicate token at rank ", i));
  }
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    if (!ranks_.contains(std::string_view(&c, 1))) {
      return bad(absl::StrCat("byte ", b, " has no rank"));
    }
  }

  special_names_.resize(kVocabSize - kFirstSpecialId);
  for (TokenId id = kFirstSpecialId; id < kVocabSize; ++id) {
    std::string name;
    switch (id) {
      case kStartOfText: name = "<|startoftext|>"; break;
      case kEndOfText: name = "<|endoftext|>"; break;
      case kReturn: name = "<|return|>"; break;
      case kConstrain: name = "<|constrain|>"; break;
      case kChannel: name = "<|channel|>"; break;
      case kStart: name = "<|start|>"; break;
      case kEnd: name = "<|end|>"; break;
      case kMessage: name = "<|message|>"; break;
      case kCall: name = "<|call|>"; break;
      default: name = absl::StrCat("<|reserved_", id, "|>");
    }
    special_ids_.emplace(name, id);
    special_names_[id - kFirstSpecialId] = std::move(name);
  }

  if (splitter == Splitter::kScanner) {
    // Class bits of every code point, from the reference's tables.
    char_class_.assign(0x110000, 0);
    const std::pair<const char*, uint8_t> bits[] = {
        {"Lu", kUpperish | kLetter}, {"Lt", kUpperish | kLetter}, {"Lm", kUpperish | kLowerish | kLetter},
        {"Lo", kUpperish | kLowerish | kLetter}, {"Ll", kLowerish | kLetter}, {"M", kUpperish | kLowerish},
        {"N", kNumber}, {"WS", kSpace}};
    for (const auto& [name, b] : bits) {
      for (auto [first, last] : classes.at(name)) {
        for (uint32_t c = first; c <= last; ++c) char_class_[c] |= b;
      }
    }
    return absl::OkStatus();
  }
  regex_ = std::make_unique<Regex>();
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  FLOTILLA_ASSIGN_OR_RETURN(const std::string pattern, BuildPattern(classes));
  regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                               PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_offset,
                               nullptr);
  if (regex_->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return absl::InternalError(absl::StrCat("o200k pattern does not compile at offset ",
                                            err_offset, ": ", reinterpret_cast<char*>(msg)));
  }
  // JIT is an optimisation: without it (e.g. on a platform PCRE2 cannot JIT
  // for) matching is slower but identical.
  (void)pcre2_jit_compile(regex_->code, PCRE2_JIT_COMPLETE);
  return absl::OkStatus();
}

std::optional<TokenId> Tokenizer::Rank(std::string_view bytes) const {
  auto it = ranks_.find(bytes);
  if (it == ranks_.end()) return std::nullopt;
  return it->second;
}

void Tokenizer::EncodePiece(std::string_view piece, std::vector<TokenId>& out) const {
  if (auto r = Rank(piece)) {
    out.push_back(*r);
    return;
  }
  constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  const size_t n = piece.size();
  auto rank_of = [&](size_t begin, size_t end) -> uint32_t {
    auto r = Rank(piece.substr(begin, end - begin));
    return r ? *r : kNone;
  };
  if (n < 256) {
    // Short pieces: tiktoken's quadratic merge over a small array. parts[i] is
    // the start of part i and the rank of merging part i with part i+1.
    struct Part {
      uint32_t start;
      uint32_t rank;
    };
    Part parts_buf[258];
    size_t m = n + 1;
    for (size_t i = 0; i < m; ++i) parts_buf[i] = {static_cast<uint32_t>(i), kNone};
    for (size_t i = 0; i + 2 < m; ++i) parts_buf[i].rank = rank_of(i, i + 2);
    Part* parts = parts_buf;
    while (true) {
      uint32_t best = kNone;
      size_t bi = 0;
      for (size_t i = 0; i + 1 < m; ++i) {
        if (parts[i].rank < best) {
          best = parts[i].rank;
          bi = i;
        }
      }
      if (best == kNone) break;
      // Merge part bi with bi+1: drop entry bi+1, then refresh the ranks of the
      // pairs that now start at bi and bi-1.
      std::memmove(&parts[bi + 1], &parts[bi + 2], (m - bi - 2) * sizeof(Part));
      --m;
      parts[bi].rank = bi + 2 < m ? rank_of(parts[bi].start, parts[bi + 2].start) : kNone;
      if (bi > 0) parts[bi - 1].rank = rank_of(parts[bi - 1].start, parts[bi + 1].start);
    }
    for (size_t i = 0; i + 1 < m; ++i) {
      out.push_back(*Rank(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start)));
    }
    return;
  }
  // Long pieces (whitespace runs, long symbol runs): the same merge order
  // (lowest rank first, leftmost on ties) with a heap and a linked list.
  struct Node {
    uint32_t start, end;
    int32_t prev, next;
    uint32_t version;
  };
  std::vector<Node> nodes(n);
  for (size_t i = 0; i < n; ++i) {
    nodes[i] = {static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1), static_cast<int32_t>(i) - 1,
                i + 1 < n ? static_cast<int32_t>(i + 1) : -1, 0};
  }
  struct Entry {
    uint32_t rank, start;
    int32_t node;
    uint32_t version;
    bool operator>(const Entry& o) const {
      return rank != o.rank ? rank > o.rank : start > o.start;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int32_t i) {
    const Node& a = nodes[i];
    if (a.next < 0) return;
    const uint32_t r = rank_of(a.start, nodes[a.next].end);
    if (r != kNone) heap.push({r, a.start, i, a.version});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    Node& a = nodes[e.node];
    if (a.version != e.version || a.next < 0) continue;  // stale
    Node& b = nodes[a.next];
    a.end = b.end;
    a.next = b.next;
    if (b.next >= 0) nodes[b.next].prev = e.node;
    b.version = kNone;  // dead
    ++a.version;
    push(e.node);
    if (a.prev >= 0) {
      ++nodes[a.prev].version;
      push(a.prev);
    }
  }
  for (int32_t i = 0; i >= 0; i = nodes[i].next) {
    out.push_back(*Rank(piece.substr(nodes[i].start, nodes[i].end - nodes[i].start)));
  }
}

void Tokenizer::EncodeOrdinaryInto(std::string_view text, std::vector<TokenId>& out) const {
  if (text.empty()) return;
  if (splitter_ == Splitter::kScanner) {
    SplitWithScanner(text, out);
  } else {
    SplitWithPcre2(text, out);
  }
}

// The o200k pattern, alternative by alternative, with PCRE's leftmost-first
// backtracking worked out for each (P = [^\r\n L N], U = upperish, W =
// lowerish, O = [^WS L N], C = the optional contraction):
//   1. P? U* W+ C?   2. P? U+ W* C?   3. N{1,3}   4. " "? O+ [\r\n/]*
//   5. WS* [\r\n]+   6. WS+ (?!\S)   7. WS+
size_t Tokenizer::ScanPiece(std::string_view text, size_t p) const {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const uint8_t* cls = char_class_.data();
  size_t len0;
  const uint32_t c0 = DecodeAt(s, p, len0);
  const uint8_t b0 = cls[c0];
  auto bits_at = [&](size_t i, size_t& len) -> uint8_t {
    if (s[i] < 0x80) {
      len = 1;
      return cls[s[i]];
    }
    return cls[DecodeAt(s, i, len)];
  };
  // The contraction after a letter run ending at `e`, if any.
  auto contraction = [&](size_t e) -> size_t {
    if (e + 1 >= n || s[e] != '\'') return e;
    auto lower = [&](size_t i) -> int { return (i < n && s[i] < 0x80) ? (s[i] | 0x20) : 0; };
    switch (lower(e + 1)) {
      case 's': case 't': case 'm': case 'd':
        return e + 2;
      case 'r': case 'v':
        return lower(e + 2) == 'e' ? e + 3 : e;
      case 'l':
        return lower(e + 2) == 'l' ? e + 3 : e;
      default:
        // Caseless 's' also matches U+017F LATIN SMALL LETTER LONG S.
        if (e + 2 < n && s[e + 1] == 0xC5 && s[e + 2] == 0xBF) return e + 3;
        return e;
    }
  };
  const bool has_prefix = c0 != '\r' && c0 != '\n' && !(b0 & (kLetter | kNumber));
  if (has_prefix || (b0 & (kUpperish | kLowerish))) {
    // 1. P? U* W+ C?: the largest split of a U run whose next char is in W.
    for (int with_prefix = has_prefix ? 1 : 0; with_prefix >= 0; --with_prefix) {
      size_t i = with_prefix ? p + len0 : p;
      size_t last_w = std::string_view::npos, len = 0;
      while (i < n) {
        const uint8_t b = bits_at(i, len);
        if (!(b & kUpperish)) break;
        if (b & kLowerish) last_w = i;
        i += len;
      }
      size_t j = std::string_view::npos;
      if (i < n && (bits_at(i, len) & kLowerish)) {
        j = i;
      } else {
        j = last_w;
      }
      if (j == std::string_view::npos) continue;
      size_t e = j;
      while (e < n && (bits_at(e, len) & kLowerish)) e += len;
      return contraction(e);
    }
    // 2. P? U+ W* C?
    for (int with_prefix = has_prefix ? 1 : 0; with_prefix >= 0; --with_prefix) {
      const size_t q = with_prefix ? p + len0 : p;
      size_t i = q, len = 0;
      while (i < n && (bits_at(i, len) & kUpperish)) i += len;
      if (i == q) continue;
      while (i < n && (bits_at(i, len) & kLowerish)) i += len;
      return contraction(i);
    }
  }
  // 3. N{1,3}
  if (b0 & kNumber) {
    size_t i = p + len0, len = 0;
    for (int k = 1; k < 3 && i < n && (bits_at(i, len) & kNumber); ++k) i += len;
    return i;
  }
  // 4. " "? O+ [\r\n/]*
  {
    size_t i = c0 == ' ' ? p + 1 : p, len = 0;
    const size_t q = i;
    while (i < n && !(bits_at(i, len) & (kSpace | kLetter | kNumber))) i += len;
    if (i > q) {
      while (i < n && (s[i] == '\r' || s[i] == '\n' || s[i] == '/')) ++i;
      return i;
    }
  }
  if (b0 & kSpace) {
    size_t i = p, len = 0, last_newline = std::string_view::npos, last_start = p;
    while (i < n && (bits_at(i, len) & kSpace)) {
      if (s[i] == '\r' || s[i] == '\n') last_newline = i;
      last_start = i;
      i += len;
    }
    // 5. WS* [\r\n]+: ends after the run's last newline.
    if (last_newline != std::string_view::npos) return last_newline + 1;
    // 6. WS+ (?!\S): the whole run at the end of text, else all but its last char.
    if (i == n) return n;
    if (last_start > p) return last_start;
    // 7. WS+
    return i;
  }
  return p + len0;  // unreachable: every code point falls in some alternative
}

void Tokenizer::SplitWithScanner(std::string_view text, std::vector<TokenId>& out) const {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = ScanPiece(text, pos);
    EncodePiece(text.substr(pos, end - pos), out);
    pos = end;
  }
}

void Tokenizer::SplitWithPcre2(std::string_view text, std::vector<TokenId>& out) const {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_context* mctx = nullptr;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(regex_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack == nullptr) {
      // Pathological inputs need more JIT stack than the default 32 KiB.
      jit_stack = pcre2_jit_stack_create(64 << 10, 64 << 20, nullptr);
      mctx = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
      continue;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (rc < 0 || ov[0] != pos || ov[1] <= pos) {
      // The pattern matches every non-empty input at its start (its last
      // alternatives cover any character), so this is unreachable for valid
      // UTF-8; fall back to one code point of byte tokens rather than loop.
      size_t len = 1;
      while (pos + len < text.size() && (static_cast<unsigned char>(text[pos + len]) & 0xC0) == 0x80) {
        ++len;
      }
      EncodePiece(text.substr(pos, len), out);
      pos += len;
      continue;
    }
    EncodePiece(text.substr(pos, ov[1] - pos), out);
    pos = ov[1];
  }
  pcre2_match_data_free(md);
  if (mctx != nullptr) pcre2_match_context_free(mctx);
  if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
}

absl::StatusOr<std::vector<TokenId>> Tokenizer::Encode(std::string_view text,
                                                       const SpecialTokenPolicy& policy) const {
  FLOTILLA_RETURN_IF_ERROR(CheckUtf8(text, "text to encode"));
  std::vector<TokenId> out;
  out.reserve(text.size() / 4 + 4);
  const bool scan = policy.allowed != SpecialTokenPolicy::Allowed::kNone || policy.disallowed_is_error;
  if (!scan) {
    EncodeOrdinaryInto(text, out);
    return out;
  }
  // Special tokens all look like "<|name|>": find each occurrence, leftmost first.
  size_t segment_start = 0;
  size_t pos = 0;
  while (true) {
    size_t lt = text.find("<|", pos);
    if (lt == std::string_view::npos) break;
    // Names are short: look for the closing "|>" only nearby, which keeps
    // text full of "<|" linear.
    const size_t close_in = text.substr(lt + 2, 32).find("|>");
    if (close_in == std::string_view::npos) {
      pos = lt + 1;
      continue;
    }
    std::string_view name = text.substr(lt, close_in + 4);
    auto it = special_ids_.find(std::string(name));
    if (it == special_ids_.end()) {
      pos = lt + 1;
      continue;
    }
    const bool allowed = policy.allowed == SpecialTokenPolicy::Allowed::kAll ||
                         (policy.allowed == SpecialTokenPolicy::Allowed::kListed &&
                          policy.listed.contains(it->first));
    if (!allowed) {
      if (policy.disallowed_is_error) {
        return absl::InvalidArgumentError(absl::StrCat(
            "text contains the special token ", it->first, " at byte offset ", lt,
            ", which is not allowed here"));
      }
      pos = lt + 1;
      continue;
    }
    EncodeOrdinaryInto(text.substr(segment_start, lt - segment_start), out);
    out.push_back(it->second);
    segment_start = pos = lt + name.size();
  }
  EncodeOrdinaryInto(text.substr(segment_start), out);
  return out;
}

absl::StatusOr<std::string_view> Tokenizer::TokenBytes(TokenId id) const {
  if (id < kNumRanks) return std::string_view(blob_.data() + offsets_[id], offsets_[id + 1] - offsets_[id]);
  if (id < kVocabSize) return std::string_view(special_names_[id - kFirstSpecialId]);
  return absl::InvalidArgumentError(
      absl::StrCat("token id ", id, " is outside the vocabulary (0..", kVocabSize - 1, ")"));
}

absl::StatusOr<std::string> Tokenizer::DecodeBytes(const std::vector<TokenId>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto bytes = TokenBytes(ids[i]);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", i, ": ", std::string(bytes.status().message())));
    }
    out.append(*bytes);
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::DecodeUtf8(const std::vector<TokenId>& ids) const {
  FLOTILLA_ASSIGN_OR_RETURN(std::string out, DecodeBytes(ids));
  FLOTILLA_RETURN_IF_ERROR(CheckUtf8(out, "decoded text"));
  return out;
}

std::optional<TokenId> Tokenizer::SpecialTokenId(std::string_view name) const {
  auto it = special_ids_.find(std::string(name));
  if (it == special_ids_.end()) return std::nullopt;
  return it->second;
}

}  // namespace flotilla::tokenizer
