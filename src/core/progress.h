// Progress of long work on stderr ("label: 45%"): rewritten in place on a terminal; otherwise a
// line every few seconds and a final line only for work that took that long, so logs of short
// work stay empty.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/measure.h"

namespace argus {

class Progress {
 public:
  explicit Progress(std::string label)
      : label_(std::move(label)), tty_(::isatty(2) == 1), last_print_(Clock::now()) {
    if (tty_) std::fprintf(stderr, "%s: 0%%", label_.c_str());
  }
  void Update(uint64_t done, uint64_t total) {
    const int pct = static_cast<int>(done * 100 / std::max<uint64_t>(total, 1));
    if (pct >= 100 || pct == last_) return;  // Done() prints the end
    last_ = pct;
    if (tty_) {
      std::fprintf(stderr, "\r%s: %d%%", label_.c_str(), pct);
    } else if (Seconds(last_print_) >= kLogSeconds) {
      std::fprintf(stderr, "%s: %d%%\n", label_.c_str(), pct);
      last_print_ = Clock::now();
    }
  }
  void Done(double seconds) {
    if (tty_ || seconds >= kLogSeconds) {
      std::fprintf(stderr, "%s%s: 100%% (%.1f s)\n", tty_ ? "\r" : "", label_.c_str(), seconds);
    }
  }

 private:
  static constexpr double kLogSeconds = 5;
  std::string label_;
  bool tty_;
  int last_ = 0;
  Clock::time_point last_print_;
};

}  // namespace argus
