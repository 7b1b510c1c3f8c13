// What the BatchContext tests share: stories260K and the story's tokens, and conversations
// stepped together through one BatchContext as argus serve's scheduler steps them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "argus/model.h"
#include "test_util.h"

namespace argus::testing {

inline const Model& BatchStories() {
  static std::unique_ptr<Model> model =
      Model::Load(SharedDir() + "/models/stories260K.gguf").value();
  return *model;
}

inline std::vector<int32_t> BatchStory() {
  std::ifstream in(std::string(ARGUS_SOURCE_DIR) + "/tests/data/story.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return BatchStories().tokenizer().Encode(text, true);
}

inline int32_t Greedy(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

struct Conversation {
  std::vector<int32_t> prompt;
  SeqId seq = 0;
  uint32_t n_done = 0;
  int32_t next = -1;
  std::vector<std::vector<float>> logits;
};

// Steps every conversation together until each has its prompt and n_decode greedy tokens: a
// piece of the prompt (up to `chunk` tokens) or one decoded token per conversation per step.
// Returns the most RAM the cache used after any step; a failed step fails the test.
inline size_t StepTogether(BatchContext& context, std::vector<Conversation>& conversations,
                           uint32_t chunk, uint32_t n_decode) {
  size_t peak = 0;
  while (true) {
    std::vector<BatchPiece> pieces;
    std::vector<Conversation*> in_step;
    for (Conversation& c : conversations) {
      if (c.logits.size() > n_decode) continue;
      if (c.n_done < c.prompt.size()) {
        const uint32_t n = std::min<uint32_t>(chunk, c.prompt.size() - c.n_done);
        pieces.push_back(
            {c.seq, std::span(c.prompt).subspan(c.n_done, n), c.n_done + n == c.prompt.size()});
      } else {
        pieces.push_back({c.seq, {&c.next, 1}, true});
      }
      in_step.push_back(&c);
    }
    if (pieces.empty()) return peak;
    Result<std::span<const float>> logits = context.Eval(pieces);
    if (!logits.ok()) {
      ADD_FAILURE() << logits.status().ToString();
      return peak;
    }
    peak = std::max(peak, context.cache().stats().ram.used_bytes);
    const uint32_t n_vocab = BatchStories().config().n_vocab;
    size_t row = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      Conversation& c = *in_step[i];
      if (c.n_done < c.prompt.size()) c.n_done += static_cast<uint32_t>(pieces[i].tokens.size());
      if (!pieces[i].logits) continue;
      std::span<const float> mine = (*logits).subspan(row++ * n_vocab, n_vocab);
      c.logits.emplace_back(mine.begin(), mine.end());
      c.next = Greedy(mine);
    }
  }
}

}  // namespace argus::testing
