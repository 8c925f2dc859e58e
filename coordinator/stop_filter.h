// Stop strings over streamed text: holds back what may be the start of one.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flotilla::coordinator {

class StopFilter {
 public:
  explicit StopFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Returns the text that is safe to emit. After a hit, returns only the text
  // before the stop string and then nothing more.
  std::string Push(std::string_view text);
  // The held-back text (the stream ended without completing a stop string).
  std::string Flush();
  bool hit() const { return hit_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool hit_ = false;
};

}  // namespace flotilla::coordinator
