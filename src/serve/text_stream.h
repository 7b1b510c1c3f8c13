// The text a generation sends, as its tokens arrive: token pieces are bytes, and a piece may end
// inside a UTF-8 character or inside a stop sequence, so neither may be sent yet.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace argus::serve {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop_sequences);

  // Adds a token's piece; returns the text now safe to send: valid UTF-8 (a byte that can begin
  // no valid sequence becomes U+FFFD), holding back an incomplete character at the end and any
  // tail that could begin a stop sequence. When a stop sequence completes, returns the text
  // before it and stopped() turns true; later pieces are ignored. The sequence that starts first
  // wins (the one listed first when two start at the same byte); empty ones are ignored.
  std::string Push(std::string_view piece);
  // The end of the generation: the held-back rest (an incomplete character as U+FFFD), or ""
  // once stopped.
  std::string Finish();

  bool stopped() const { return stopped_; }
  const std::string& stop_sequence() const { return matched_; }
  // Everything returned so far, concatenated.
  const std::string& text() const { return sent_; }

 private:
  // Returns what of pending_ may be sent: up to a completed stop sequence, else all but a tail
  // that could begin one (all of it at the end).
  std::string Release(bool at_end);

  std::vector<std::string> stop_;  // the non-empty stop sequences
  std::string pending_;            // valid UTF-8 not sent yet: it could begin a stop sequence
  std::string incomplete_;         // the bytes of a character whose rest has not arrived
  std::string sent_, matched_;
  bool stopped_ = false;
};

}  // namespace argus::serve
