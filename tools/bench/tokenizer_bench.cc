// Encode throughput (MB/s, one core) of the o200k_harmony tokenizer and of the
// `tiktoken` npm package (WASM) on the same text, side by side, as JSON lines.
//
//   tokenizer_bench [--input FILE] [--seconds S] [--chunk BYTES] [--tokenizer PATH]
//                   [--node PATH] [--node-modules DIR] [--no-reference]
//
// --chunk BYTES encodes the text as separate documents of at most BYTES bytes
// (cut at UTF-8 boundaries), on both sides; 0 (the default) encodes it whole.
//
// Without --input the text is a deterministic mix (about 4 MB) of English-like
// prose, code, numbers, whitespace runs and several other scripts and emoji.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace {

using flotilla::tokenizer::Tokenizer;

std::string MixedText(size_t target_bytes) {
  static const char* kWords[] = {
      "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
      "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they",
      "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more",
      "when", "will", "would", "who", "so", "no", "model", "server", "token", "request", "latency",
      "throughput", "expert", "router", "cluster", "network", "Python", "Kubernetes", "GPU", "NVIDIA",
      "don't", "it's", "We're", "they'll", "I'M", "you've", "Harmony", "tokenizer", "benchmark"};
  static const char* kOther[] = {
      "模型在多个节点上运行，每个专家都有自己的权重。", "Сервер обрабатывает запросы параллельно.",
      "الخادم يعالج الطلبات بسرعة كبيرة.", "सर्वर कई अनुरोधों को एक साथ संभालता है।",
      "サーバーはリクエストを並列に処理します。", "서버는 여러 요청을 동시에 처리합니다.",
      "Ο διακομιστής επεξεργάζεται αιτήματα.", "Größe, Straße, naïve café, façade, smörgåsbord.",
      "👍 🚀 👨‍👩‍👧‍👦 🇯🇵 ❤️ ✨", "Tiếng Việt có dấu: người, được, những."};
  static const char* kCode[] = {
      "for (int i = 0; i < n; ++i) {\n    sum += values[i] * weights[i];\n}\n",
      "def encode(self, text: str) -> list[int]:\n        return self._core.encode(text)\n",
      "    if err != nil {\n\t\treturn nil, fmt.Errorf(\"read %s: %w\", path, err)\n\t}\n",
      "SELECT id, name FROM users WHERE created_at > '2024-06-01' ORDER BY id;\n",
      "const result = await fetch(`${baseUrl}/v1/chat/completions`, { method: \"POST\" });\n"};
  std::mt19937 rng(12345);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::string out;
  while (out.size() < target_bytes) {
    const size_t kind = pick(10);
    if (kind < 6) {
      const size_t words = 20 + pick(80);
      for (size_t w = 0; w < words; ++w) {
        std::string word = kWords[pick(std::size(kWords))];
        if (w == 0 || pick(12) == 0) word[0] = static_cast<char>(std::toupper(word[0]));
        out += word;
        out += pick(10) == 0 ? ", " : (pick(15) == 0 ? ". " : " ");
        if (pick(30) == 0) out += std::to_string(rng() % 100000) + " ";
      }
      out += "\n\n";
    } else if (kind < 8) {
      out += kCode[pick(std::size(kCode))];
    } else if (kind < 9) {
      out += kOther[pick(std::size(kOther))];
      out += "\n";
    } else {
      out += std::string(1 + pick(40), pick(2) ? ' ' : '\n');
    }
  }
  return out;
}

std::string JsonLine(const std::string& impl, size_t chunk, size_t bytes, size_t tokens, int iters, double seconds) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "{\"bench\":\"tokenizer_encode\",\"impl\":\"%s\",\"threads\":1,\"chunk_bytes\":%zu,\"bytes\":%zu,"
                "\"tokens\":%zu,\"iterations\":%d,\"seconds\":%.3f,\"mb_per_s\":%.2f}",
                impl.c_str(), chunk, bytes, tokens, iters, seconds, bytes * iters / seconds / 1e6);
  return buf;
}

double ParseMbPerS(const std::string& line) {
  const auto at = line.find("\"mb_per_s\":");
  return at == std::string::npos ? 0 : std::atof(line.c_str() + at + 11);
}

}  // namespace

int main(int argc, char** argv) {
  std::string input, ranks, node = FLOTILLA_NODE, modules = FLOTILLA_NODE_MODULES;
  std::string temp_input;  // removed at exit
  double seconds = 2;
  size_t chunk = 0;
  bool reference = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "tokenizer_bench: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--input") input = value();
    else if (a == "--seconds") seconds = std::atof(value().c_str());
    else if (a == "--tokenizer") ranks = value();
    else if (a == "--chunk") chunk = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--node") node = value();
    else if (a == "--node-modules") modules = value();
    else if (a == "--no-reference") reference = false;
    else {
      std::cerr << "tokenizer_bench: unknown option '" << a << "'\n";
      return 2;
    }
  }
  auto tok = Tokenizer::Create(ranks.empty() ? Tokenizer::DefaultRanksPath() : ranks);
  if (!tok.ok()) {
    std::cerr << "tokenizer_bench: " << tok.status().message() << "\n";
    return 1;
  }
  std::string text;
  if (input.empty()) {
    text = MixedText(4 << 20);
    input = (std::filesystem::temp_directory_path() /
             ("flotilla_tokenizer_bench_" + std::to_string(getpid()) + ".txt"))
                .string();
    temp_input = input;
    std::ofstream(input, std::ios::binary) << text;
  } else {
    std::ifstream in(input, std::ios::binary);
    if (!in) {
      std::cerr << "tokenizer_bench: cannot read '" << input << "'\n";
      return 1;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }

  std::vector<std::string_view> docs;
  for (size_t start = 0; start < text.size();) {
    size_t end = chunk == 0 ? text.size() : std::min(start + chunk, text.size());
    while (end < text.size() && end > start && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    docs.push_back(std::string_view(text).substr(start, end - start));
    start = end;
  }
  auto encode_all = [&](const Tokenizer& t) -> absl::StatusOr<size_t> {
    size_t n = 0;
    for (std::string_view d : docs) {
      auto ids = t.EncodeOrdinary(d);
      if (!ids.ok()) return ids.status();
      n += ids->size();
    }
    return n;
  };
  // Both splitters; the scanner is the default and the one compared.
  auto pcre2 = Tokenizer::Create(ranks.empty() ? Tokenizer::DefaultRanksPath() : ranks, Tokenizer::Splitter::kPcre2);
  if (!pcre2.ok()) {
    std::cerr << "tokenizer_bench: " << pcre2.status().message() << "\n";
    return 1;
  }
  size_t tokens = 0;
  std::string ours;
  for (const Tokenizer* t : {pcre2->get(), tok->get()}) {
    auto warm = encode_all(*t);
    if (!warm.ok()) {
      std::cerr << "tokenizer_bench: " << warm.status().message() << "\n";
      return 1;
    }
    if (tokens != 0 && *warm != tokens) {
      std::cerr << "tokenizer_bench: the splitters disagree\n";
      return 1;
    }
    tokens = *warm;
    int iters = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < seconds) {
      auto n = encode_all(*t);
      if (!n.ok() || *n != tokens) return 1;
      ++iters;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    ours = JsonLine(t == tok->get() ? "flotilla" : "flotilla-pcre2", chunk, text.size(), tokens, iters, elapsed);
    if (t != tok->get()) std::cout << ours << std::endl;
  }
  std::cout << ours << std::endl;
  if (!reference) {
    std::error_code ec;
    if (!temp_input.empty()) std::filesystem::remove(temp_input, ec);
    return 0;
  }

  const std::string cmd = "\"" + node + "\" \"" + FLOTILLA_BENCH_DIR + "/tiktoken_bench.js\" \"" + modules + "\" \"" +
                          input + "\" " + std::to_string(seconds) + " " + std::to_string(chunk);
  FILE* p = popen(cmd.c_str(), "r");
  struct RemoveTemp {
    std::string path;
    ~RemoveTemp() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove(path, ec);
    }
  } remove_temp{temp_input};
  std::string line;
  if (p != nullptr) {
    char buf[1024];
    while (fgets(buf, sizeof(buf), p) != nullptr) line += buf;
    if (pclose(p) != 0) line.clear();
  }
  while (!line.empty() && line.back() == '\n') line.pop_back();
  if (line.empty()) {
    std::cerr << "tokenizer_bench: reference run failed: " << cmd << "\n";
    return 1;
  }
  std::cout << line << "\n";
  const bool same_tokens = line.find("\"tokens\":" + std::to_string(tokens) + ",") != std::string::npos;
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "{\"bench\":\"tokenizer_encode\",\"impl\":\"ratio\",\"chunk_bytes\":%zu,\"flotilla_over_tiktoken\":%.2f,"
                "\"target\":1.5,\"same_token_count\":%s}",
                chunk, ParseMbPerS(ours) / ParseMbPerS(line), same_tokens ? "true" : "false");
  std::cout << buf << "\n";
  return 0;
}
