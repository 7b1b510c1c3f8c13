#include "serve/text_stream.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace argus::serve {
namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// The UTF-8 sequence at the start of some bytes.
struct Utf8Sequence {
  enum Kind : uint8_t { kValid, kInvalid, kIncomplete } kind;
  size_t n_bytes;  // kValid: its length; kInvalid: the bytes one U+FFFD replaces; kIncomplete: all
};

// Reads the sequence at the start of non-empty `s` under RFC 3629's table of well-formed byte
// sequences (no overlong forms, surrogates or code points past U+10FFFF). An ill-formed sequence's
// maximal valid prefix becomes one U+FFFD, as Unicode recommends (chapter 3, "U+FFFD
// Substitution of Maximal Subparts").
Utf8Sequence ReadUtf8Sequence(std::string_view s) {
  const auto lead = static_cast<uint8_t>(s[0]);
  if (lead < 0x80) return {Utf8Sequence::kValid, 1};
  size_t length = 0;
  uint8_t second_min = 0x80, second_max = 0xBF;  // only the second byte's range varies
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;  // overlong
    if (lead == 0xED) second_max = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;  // overlong
    if (lead == 0xF4) second_max = 0x8F;  // past U+10FFFF
  } else {
    return {Utf8Sequence::kInvalid, 1};
  }
  for (size_t i = 1; i < length; ++i) {
    if (i == s.size()) return {Utf8Sequence::kIncomplete, i};
    const auto byte = static_cast<uint8_t>(s[i]);
    const bool in_range =
        i == 1 ? byte >= second_min && byte <= second_max : byte >= 0x80 && byte <= 0xBF;
    if (!in_range) return {Utf8Sequence::kInvalid, i};
  }
  return {Utf8Sequence::kValid, length};
}

// Appends `bytes` to `text` as valid UTF-8 and returns the incomplete sequence at their end
// (empty when there is none), which later bytes may complete.
std::string AppendValidUtf8(std::string_view bytes, std::string& text) {
  while (!bytes.empty()) {
    const Utf8Sequence seq = ReadUtf8Sequence(bytes);
    if (seq.kind == Utf8Sequence::kIncomplete) return std::string(bytes);
    if (seq.kind == Utf8Sequence::kValid) {
      text.append(bytes.substr(0, seq.n_bytes));
    } else {
      text.append(kReplacementCharacter);
    }
    bytes.remove_prefix(seq.n_bytes);
  }
  return {};
}

struct StopMatch {
  size_t position;  // in the text
  size_t index;     // of the stop sequence
};

// The stop sequence that occurs first in `text` (the one listed first when two start together).
std::optional<StopMatch> FirstStop(std::string_view text, const std::vector<std::string>& stop) {
  std::optional<StopMatch> first;
  for (size_t i = 0; i < stop.size(); ++i) {
    const size_t at = text.find(stop[i]);
    if (at != std::string_view::npos && (!first || at < first->position)) first = {at, i};
  }
  return first;
}

// The length of the longest end of `text` that begins some stop sequence without completing it.
// It starts where a stop sequence starts, so at a character boundary of valid UTF-8.
size_t StopPrefixAtEnd(std::string_view text, const std::vector<std::string>& stop) {
  size_t longest = 0;
  for (const std::string& s : stop) {
    for (size_t n = std::min(s.size() - 1, text.size()); n > longest; --n) {
      if (text.ends_with(std::string_view(s).substr(0, n))) {
        longest = n;
        break;
      }
    }
  }
  return longest;
}

}  // namespace

TextStream::TextStream(std::vector<std::string> stop_sequences) {
  for (std::string& s : stop_sequences) {
    if (!s.empty()) stop_.push_back(std::move(s));  // an empty one would match before any text
  }
}

std::string TextStream::Push(std::string_view piece) {
  if (stopped_) return {};
  std::string bytes = std::move(incomplete_);
  bytes.append(piece);
  incomplete_ = AppendValidUtf8(bytes, pending_);
  return Release(/*at_end=*/false);
}

std::string TextStream::Finish() {
  if (stopped_) return {};
  if (!incomplete_.empty()) pending_.append(kReplacementCharacter);
  incomplete_.clear();
  return Release(/*at_end=*/true);
}

std::string TextStream::Release(bool at_end) {
  size_t n_release = pending_.size();
  if (const std::optional<StopMatch> match = FirstStop(pending_, stop_)) {
    n_release = match->position;
    matched_ = stop_[match->index];
    stopped_ = true;
  } else if (!at_end) {
    n_release -= StopPrefixAtEnd(pending_, stop_);
  }
  std::string out = pending_.substr(0, n_release);
  pending_.erase(0, stopped_ ? pending_.size() : n_release);
  sent_ += out;
  return out;
}

}  // namespace argus::serve
