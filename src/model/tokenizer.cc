// Tokenizers built from GGUF metadata, reproducing llama.cpp's (src/llama-vocab.cpp):
//
// - SentencePiece ("llama"): spaces become U+2581 (one is prepended to text that starts the input
//   or follows a special token, when add_space_prefix), the text is split into UTF-8 characters,
//   and the adjacent pair whose concatenation is a token with the highest score is merged until
//   none is left (ties: leftmost). A piece that is not a token falls back to byte tokens <0xXX>.
// - Byte-level BPE ("gpt2"): the pre-tokenizer regexes of tokenizer.ggml.pre split the text (PCRE2;
//   each regex splits the pieces the previous one left, unmatched gaps are pieces too), each
//   piece's bytes are spelled in GPT-2's bytes_to_unicode alphabet, and the adjacent pair with the
//   lowest merge rank is merged until none is left (ties: leftmost).
// Both use a priority queue of candidate pairs over a linked list of symbols: O(n log n) in the
// text length. Before either, the text is partitioned on the spellings of special tokens as
// llama.cpp's tokenizer_st_partition does: user-defined tokens always, control and unknown tokens
// when parse_special; longer spellings first, each over the whole text.
//
// Deliberate differences from llama.cpp, all about input llama.cpp mishandles:
// - Invalid UTF-8 reaching the BPE pre-tokenizer: llama.cpp replaces it with U+FFFD, losing the
//   bytes; here each run of invalid bytes is a piece of its own (PCRE2_MATCH_INVALID_UTF), so
//   Decode(Encode(x)) == x for any bytes.
// - Invalid UTF-8 reaching the SentencePiece path: see CharLength().
// - Decode concatenates pieces exactly: no clean_up_tokenization_spaces for BPE vocabularies.
// - A byte with no token (a vocabulary without byte tokens) becomes the unknown token, or nothing
//   when there is none (llama.cpp drops it for BPE and throws for SentencePiece).
// - Unknown tokenizer.ggml.pre names are an error, as in llama.cpp; only the pre-tokenizers of the
//   Llama, Qwen2 and GPT-2 families are known here (see PreTokenizers()).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "argus/model.h"
#include "core/string_map.h"
#include "model/bpe_bytes.h"
#include "model/tokenizer_gguf.h"

namespace argus {
namespace {

using TokenType = TokenizerVocab::TokenType;
using namespace model::tokenizer_keys;
using model::CharLength;
using model::DecodeUtf8;
using model::ParseByteToken;
using model::UnspellBytes;

constexpr std::string_view kSpaceMark = "\xe2\x96\x81";  // U+2581: SentencePiece's space

// Tokens llama.cpp treats as end of generation (and as control tokens) by their spelling.
constexpr std::array<std::string_view, 8> kEndOfGenerationNames = {
    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>",   "<|end_of_text|>",
};

// ---- pre-tokenizers (llama.cpp's llm_tokenizer_bpe regex lists) ----

constexpr const char* kGpt2Regex =
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";
constexpr const char* kLlama3Regex =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+)re"
    R"re(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// As Llama 3's, but digits one at a time.
constexpr const char* kQwen2Regex =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+)re"
    R"re(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

struct PreTokenizer {
  std::vector<std::string_view> names;  // tokenizer.ggml.pre values
  std::vector<const char*> regexes;     // each splits the pieces the previous one left
  bool ignore_merges = false;           // a piece that spells a token is that token
  bool add_bos = false;                 // llama.cpp's add_bos when the file does not say
};

const std::vector<PreTokenizer>& PreTokenizers() {
  static const std::vector<PreTokenizer> table = {
      {{"default"},
       {R"re([\p{P}\$\+<=>\^~\|]+)re", kGpt2Regex, R"re(\p{N}+)re", "[0-9][0-9][0-9]"}},
      {{"gpt-2", "phi-2", "mpt", "olmo"}, {kGpt2Regex}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"}, {kLlama3Regex}, true, true},
      {{"dbrx", "smaug-bpe"}, {kLlama3Regex}},
      {{"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"}, {kQwen2Regex}},
  };
  return table;
}

const PreTokenizer* FindPreTokenizer(std::string_view name) {
  for (const PreTokenizer& pre : PreTokenizers()) {
    if (std::find(pre.names.begin(), pre.names.end(), name) != pre.names.end()) return &pre;
  }
  return nullptr;
}

std::string PreTokenizerNames() {
  std::string names;
  for (const PreTokenizer& pre : PreTokenizers()) {
    for (std::string_view name : pre.names)
      names += (names.empty() ? "" : ", ") + std::string(name);
  }
  return names;
}

struct RegexFree {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataFree {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
using Regex = std::unique_ptr<pcre2_code, RegexFree>;
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataFree>;

using TokenMap = StringMap<int32_t>;

// A piece of the input after special-token partitioning: raw text (token < 0) or a token.
struct Fragment {
  std::string_view text;
  int32_t token = -1;
};

struct Merge {
  int32_t rank;
  int32_t result;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Working memory of the SentencePiece merge loop, reused across words.
struct SpmScratch {
  struct Symbol {
    int32_t prev, next;
    uint32_t begin, n;  // bytes of the text; n == 0: merged into its left neighbour
  };
  struct Bigram {
    float score;
    int32_t left, right;
    uint32_t n;  // bytes of the pair when it was queued: a later mismatch means it is stale
  };
  std::vector<Symbol> symbols;
  std::vector<Bigram> queue;
};

bool EndsWithSpaceMark(std::string_view s) {
  return s.size() >= kSpaceMark.size() && s.substr(s.size() - kSpaceMark.size()) == kSpaceMark;
}

// Whether a token has U+2581 after another character, so that a merge could join a word to the
// one before it. SentencePiece vocabularies split by whitespace have none; runs like "▁▁▁"
// (indentation) are fine, since a word starts only at a U+2581 after another character.
bool JoinsWords(std::string_view token) {
  for (size_t at = token.find(kSpaceMark, 1); at != std::string_view::npos;
       at = token.find(kSpaceMark, at + 1)) {
    if (!EndsWithSpaceMark(token.substr(0, at))) return true;
  }
  return false;
}

// Per-Encode working memory of the BPE path, reused across pre-tokens.
struct BpeScratch {
  struct Symbol {
    int32_t prev, next;
    int32_t id;  // token; -1: a byte without a token; -2: merged into its left neighbour
  };
  struct Pair {
    int32_t rank, left, right, left_id, right_id, result;
  };
  MatchData match;
  std::vector<std::string_view> pieces, next_pieces;
  std::vector<Symbol> symbols;
  std::vector<Pair> queue;
  std::string spelled;
};

}  // namespace

struct Tokenizer::Impl {
  TokenizerVocab vocab;  // types filled in; end-of-generation names marked control
  TokenMap ids;
  std::vector<std::string> pieces;  // TokenToPiece of every token
  std::vector<int32_t> specials;    // control, user-defined, unknown: longest first
  std::vector<int32_t> end_of_generation;
  std::array<int32_t, 256> byte_tokens;  // byte -> token, -1 for none
  // Byte-level BPE only.
  std::unordered_map<uint64_t, Merge> merges;  // PairKey(left, right) -> rank, merged token
  std::vector<Regex> regexes;
  bool ignore_merges = false;
  // SentencePiece only: no token joins words, so each word can be merged on its own. That gives
  // the same tokens as merging the whole text at once (no pair across a word start is ever a
  // token, and each word's merges keep their order) with a small, cache-resident queue.
  bool words_are_independent = false;

  Status Init(TokenizerVocab v);
  Status InitBytePairs();
  void Partition(std::string_view text, bool parse_special, std::vector<Fragment>* out) const;
  void EncodeSentencePiece(std::string_view raw, bool space_prefix,
                           std::vector<int32_t>* out) const;
  void MergeSentencePiece(std::string_view text, SpmScratch* s, std::vector<int32_t>* out) const;
  void EncodeBytePairs(std::string_view text, BpeScratch* s, std::vector<int32_t>* out) const;
  void SplitPiece(const pcre2_code* regex, std::string_view piece, BpeScratch* s) const;
  void EncodeWord(std::string_view word, BpeScratch* s, std::vector<int32_t>* out) const;
  void PushUnknown(std::vector<int32_t>* out) const {
    if (vocab.unk >= 0) out->push_back(vocab.unk);
  }
  void PushByte(uint8_t byte, std::vector<int32_t>* out) const {
    if (byte_tokens[byte] >= 0) {
      out->push_back(byte_tokens[byte]);
    } else {
      PushUnknown(out);
    }
  }
};

Status Tokenizer::Impl::Init(TokenizerVocab v) {
  const size_t n = v.tokens.size();
  if (n == 0) return Status::InvalidArgument(std::string(kKeyTokens) + " is empty");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::InvalidArgument(std::string(kKeyTokens) + " has " + std::to_string(n) +
                                   " tokens, more than token ids can number");
  }
  const auto check_length = [&](const char* key, size_t size) {
    if (size == 0 || size == n) return Status::Ok();
    return Status::InvalidArgument(std::string(key) + " has " + std::to_string(size) +
                                   " entries for " + std::to_string(n) + " tokens");
  };
  ARGUS_RETURN_IF_ERROR(check_length(kKeyScores, v.scores.size()));
  ARGUS_RETURN_IF_ERROR(check_length(kKeyTypes, v.types.size()));
  if (v.types.empty()) v.types.assign(n, TokenType::kNormal);
  for (size_t i = 0; i < n; ++i) {
    const auto type = static_cast<int32_t>(v.types[i]);
    if (type < 0 || type > static_cast<int32_t>(TokenType::kByte)) {
      return Status::InvalidArgument(std::string(kKeyTypes) + "[" + std::to_string(i) +
                                     "] = " + std::to_string(type) + " is not a token type");
    }
  }
  for (auto [key, id] : {std::pair{kKeyBos, v.bos}, std::pair{kKeyEos, v.eos},
                         std::pair{kKeyUnk, v.unk}, std::pair{kKeyPad, v.pad}}) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return Status::InvalidArgument(std::string(key) + " = " + std::to_string(id) +
                                     " is outside the vocabulary of " + std::to_string(n) +
                                     " tokens");
    }
  }
  if (v.add_bos && v.bos < 0) {
    return Status::InvalidArgument(std::string(kKeyAddBos) + " is set but " + kKeyBos + " is not");
  }
  if (v.add_eos && v.eos < 0) {
    return Status::InvalidArgument(std::string(kKeyAddEos) + " is set but " + kKeyEos + " is not");
  }

  ids.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::string& text = v.tokens[i];
    // An empty spelling could never be matched; llama.cpp renames it the same way.
    if (text.empty()) text = "[EMPTY_" + std::to_string(i) + "]";
    auto [it, inserted] = ids.emplace(text, static_cast<int32_t>(i));
    if (!inserted) {
      return Status::InvalidArgument(std::string(kKeyTokens) + " spells " + model::Quoted(text) +
                                     " twice: ids " + std::to_string(it->second) + " and " +
                                     std::to_string(i));
    }
    if (std::find(kEndOfGenerationNames.begin(), kEndOfGenerationNames.end(), text) !=
        kEndOfGenerationNames.end()) {
      v.types[i] = TokenType::kControl;
      end_of_generation.push_back(static_cast<int32_t>(i));
    }
  }
  if (v.eos >= 0) end_of_generation.push_back(v.eos);

  const bool bpe = v.kind == TokenizerVocab::Kind::kBytePairs;
  pieces.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = v.tokens[i];
    switch (v.types[i]) {
      case TokenType::kNormal:
        if (bpe) {
          pieces[i] = UnspellBytes(text);
        } else {
          for (size_t at = 0; at < text.size();) {
            const bool mark = text.compare(at, kSpaceMark.size(), kSpaceMark) == 0;
            pieces[i] += mark ? std::string_view(" ") : std::string_view(text).substr(at, 1);
            at += mark ? kSpaceMark.size() : 1;
          }
        }
        break;
      case TokenType::kUserDefined:
        pieces[i] = text;
        break;
      case TokenType::kByte: {
        const int byte = ParseByteToken(text);
        if (byte < 0) {
          return Status::InvalidArgument(std::string(kKeyTypes) + ": token " + std::to_string(i) +
                                         " " + model::Quoted(text) +
                                         " is a byte token not spelled <0xXX>");
        }
        pieces[i].assign(1, static_cast<char>(byte));
        break;
      }
      case TokenType::kUndefined:
      case TokenType::kUnknown:
      case TokenType::kControl:
      case TokenType::kUnused:
        break;  // no text, as llama.cpp's token_to_piece without `special`
    }
    if (v.types[i] == TokenType::kControl || v.types[i] == TokenType::kUserDefined ||
        v.types[i] == TokenType::kUnknown) {
      specials.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(specials.begin(), specials.end(),
                   [&](int32_t a, int32_t b) { return v.tokens[a].size() > v.tokens[b].size(); });

  for (int b = 0; b < 256; ++b) {
    TokenMap::const_iterator it;
    if (bpe) {
      it = ids.find(model::BpeSpelling(static_cast<uint8_t>(b)));
    } else {
      static constexpr char kHex[] = "0123456789ABCDEF";
      const char spelled[] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
      it = ids.find(std::string_view(spelled, sizeof(spelled)));
      if (it == ids.end()) it = ids.find(std::string(1, static_cast<char>(b)));
    }
    byte_tokens[b] = it == ids.end() ? -1 : it->second;
  }

  words_are_independent = !bpe && std::none_of(v.tokens.begin(), v.tokens.end(), JoinsWords);
  vocab = std::move(v);
  return bpe ? InitBytePairs() : Status::Ok();
}

Status Tokenizer::Impl::InitBytePairs() {
  const PreTokenizer* pre = FindPreTokenizer(vocab.pre.empty() ? "default" : vocab.pre);
  if (pre == nullptr) {
    return Status::InvalidArgument(std::string(kKeyPre) + " " + model::Quoted(vocab.pre) +
                                   " is not a known pre-tokenizer (" + PreTokenizerNames() + ")");
  }
  ignore_merges = pre->ignore_merges;
  for (const char* pattern : pre->regexes) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    Regex regex(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset,
                              nullptr));
    if (!regex) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return Status::Internal("pre-tokenizer regex " + model::Quoted(pattern) + " at " +
                              std::to_string(offset) + ": " + reinterpret_cast<char*>(message));
    }
    // JIT is an optimisation only: without it (unsupported platform) the interpreter runs.
    pcre2_jit_compile(regex.get(), PCRE2_JIT_COMPLETE);
    regexes.push_back(std::move(regex));
  }

  merges.reserve(vocab.merges.size());
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& merge = vocab.merges[rank];
    const std::string where =
        std::string(kKeyMerges) + "[" + std::to_string(rank) + "] " + model::Quoted(merge);
    // As llama.cpp: the first space after the first byte separates the two tokens.
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) {
      return Status::InvalidArgument(where + " is not two tokens separated by a space");
    }
    const std::string_view left = std::string_view(merge).substr(0, space);
    const std::string_view right = std::string_view(merge).substr(space + 1);
    const std::string joined = std::string(left) + std::string(right);
    const auto l = ids.find(left), r = ids.find(right), m = ids.find(joined);
    if (l == ids.end() || r == ids.end() || m == ids.end()) {
      const std::string missing = l == ids.end()   ? model::Quoted(left)
                                  : r == ids.end() ? model::Quoted(right)
                                                   : "their concatenation " + model::Quoted(joined);
      return Status::InvalidArgument(where + " names " + missing + ", which is not a token");
    }
    // A repeated pair keeps its first (highest-priority) rank, as in llama.cpp.
    merges.emplace(PairKey(l->second, r->second), Merge{static_cast<int32_t>(rank), m->second});
  }
  return Status::Ok();
}

void Tokenizer::Impl::Partition(std::string_view text, bool parse_special,
                                std::vector<Fragment>* out) const {
  out->clear();
  if (text.empty()) return;
  out->push_back({text, -1});
  std::vector<Fragment> next;
  for (int32_t id : specials) {
    if (!parse_special && vocab.types[id] != TokenType::kUserDefined) continue;
    const std::string& spelling = vocab.tokens[id];
    next.clear();
    bool found = false;
    for (const Fragment& fragment : *out) {
      if (fragment.token >= 0) {
        next.push_back(fragment);
        continue;
      }
      size_t start = 0;
      for (size_t at; (at = fragment.text.find(spelling, start)) != std::string_view::npos;
           start = at + spelling.size()) {
        if (at > start) next.push_back({fragment.text.substr(start, at - start), -1});
        next.push_back({{}, id});
        found = true;
      }
      if (start < fragment.text.size()) next.push_back({fragment.text.substr(start), -1});
    }
    if (found) out->swap(next);
  }
}

void Tokenizer::Impl::EncodeSentencePiece(std::string_view raw, bool space_prefix,
                                          std::vector<int32_t>* out) const {
  std::string text;
  text.reserve(raw.size() + kSpaceMark.size());
  if (space_prefix) text += kSpaceMark;
  for (char c : raw) {
    if (c == ' ') {
      text += kSpaceMark;
    } else {
      text.push_back(c);
    }
  }
  SpmScratch scratch;
  if (!words_are_independent) {
    MergeSentencePiece(text, &scratch, out);
    return;
  }
  size_t start = 0;
  for (size_t at = text.find(kSpaceMark, 1); at != std::string::npos;
       at = text.find(kSpaceMark, at + 1)) {
    if (!EndsWithSpaceMark(std::string_view(text).substr(0, at))) {
      MergeSentencePiece(std::string_view(text).substr(start, at - start), &scratch, out);
      start = at;
    }
  }
  MergeSentencePiece(std::string_view(text).substr(start), &scratch, out);
}

void Tokenizer::Impl::MergeSentencePiece(std::string_view text, SpmScratch* s,
                                         std::vector<int32_t>* out) const {
  auto& symbols = s->symbols;
  symbols.clear();
  for (size_t at = 0; at < text.size();) {
    const size_t n = CharLength(text, at);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, at + n == text.size() ? -1 : index + 1, static_cast<uint32_t>(at),
                       static_cast<uint32_t>(n)});
    at += n;
  }

  // A max-heap on (score, -left): the best-scoring pair, leftmost on ties.
  const auto lower = [](const SpmScratch::Bigram& a, const SpmScratch::Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  auto& queue = s->queue;
  queue.clear();
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const std::string_view pair =
        text.substr(symbols[left].begin, symbols[left].n + symbols[right].n);
    const auto it = ids.find(pair);
    if (it == ids.end()) return;
    const float score = vocab.scores.empty() ? 0.0f : vocab.scores[it->second];
    queue.push_back({score, left, right, static_cast<uint32_t>(pair.size())});
    std::push_heap(queue.begin(), queue.end(), lower);
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    try_add(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  }
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), lower);
    const SpmScratch::Bigram bigram = queue.back();
    queue.pop_back();
    auto& left = symbols[bigram.left];
    auto& right = symbols[bigram.right];
    if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.n) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].begin, symbols[i].n);
    const auto it = ids.find(piece);
    if (it != ids.end()) {
      out->push_back(it->second);
    } else {
      for (char c : piece) PushByte(static_cast<uint8_t>(c), out);
    }
  }
}

void Tokenizer::Impl::SplitPiece(const pcre2_code* regex, std::string_view piece,
                                 BpeScratch* s) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t start = 0;
  while (start < piece.size()) {
    // No match ends the loop; so does a PCRE2 failure (a resource limit), leaving the rest
    // one piece: still a valid, if coarser, tokenization.
    if (pcre2_match(regex, subject, piece.size(), start, PCRE2_NOTEMPTY, s->match.get(), nullptr) <=
        0) {
      break;
    }
    const PCRE2_SIZE* match = pcre2_get_ovector_pointer(s->match.get());
    if (match[0] > start) s->next_pieces.push_back(piece.substr(start, match[0] - start));
    s->next_pieces.push_back(piece.substr(match[0], match[1] - match[0]));
    start = match[1];
  }
  if (start < piece.size()) s->next_pieces.push_back(piece.substr(start));
}

void Tokenizer::Impl::EncodeBytePairs(std::string_view text, BpeScratch* s,
                                      std::vector<int32_t>* out) const {
  s->pieces.assign(1, text);
  // Without match data (its allocation failed) the text stays one piece: coarser, still exact.
  const size_t n_regexes = s->match ? regexes.size() : 0;
  for (size_t i = 0; i < n_regexes; ++i) {
    s->next_pieces.clear();
    for (std::string_view piece : s->pieces) SplitPiece(regexes[i].get(), piece, s);
    s->pieces.swap(s->next_pieces);
  }
  for (std::string_view word : s->pieces) EncodeWord(word, s, out);
}

void Tokenizer::Impl::EncodeWord(std::string_view word, BpeScratch* s,
                                 std::vector<int32_t>* out) const {
  if (ignore_merges && word.size() > 1) {
    s->spelled.clear();
    for (char c : word) s->spelled += model::BpeSpelling(static_cast<uint8_t>(c));
    const auto it = ids.find(s->spelled);
    if (it != ids.end()) {
      out->push_back(it->second);
      return;
    }
  }
  auto& symbols = s->symbols;
  symbols.clear();
  const auto n = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols.push_back({i - 1, i + 1 < n ? i + 1 : -1, byte_tokens[static_cast<uint8_t>(word[i])]});
  }

  // A min-heap on (rank, left): the best-ranked pair, leftmost on ties.
  const auto later = [](const BpeScratch::Pair& a, const BpeScratch::Pair& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  auto& queue = s->queue;
  queue.clear();
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t left_id = symbols[left].id, right_id = symbols[right].id;
    if (left_id < 0 || right_id < 0) return;
    const auto it = merges.find(PairKey(left_id, right_id));
    if (it == merges.end()) return;
    queue.push_back({it->second.rank, left, right, left_id, right_id, it->second.result});
    std::push_heap(queue.begin(), queue.end(), later);
  };
  for (int32_t i = 1; i < n; ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), later);
    const BpeScratch::Pair pair = queue.back();
    queue.pop_back();
    auto& left = symbols[pair.left];
    auto& right = symbols[pair.right];
    if (left.id != pair.left_id || right.id != pair.right_id || left.next != pair.right) continue;
    left.id = pair.result;
    right.id = -2;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = pair.left;
    try_add(left.prev, pair.left);
    try_add(pair.left, left.next);
  }
  for (int32_t i = n > 0 ? 0 : -1; i != -1; i = symbols[i].next) {
    if (symbols[i].id >= 0) {
      out->push_back(symbols[i].id);
    } else {
      PushUnknown(out);
    }
  }
}

// ---- Tokenizer ----

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerVocab vocab) {
  auto impl = std::make_unique<Impl>();
  ARGUS_RETURN_IF_ERROR(impl->Init(std::move(vocab)));
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  tokenizer->impl_ = std::move(impl);
  return tokenizer;
}


Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  TokenizerVocab vocab;
  std::vector<int32_t> extra_eog;
  Status status = model::ReadVocab(file, &vocab, &extra_eog);
  if (!status.ok()) return status.WithContext(file.name());
  auto tokenizer = Create(std::move(vocab));
  if (!tokenizer.ok()) return tokenizer.status().WithContext(file.name());
  std::vector<int32_t>& eog = (*tokenizer)->impl_->end_of_generation;
  eog.insert(eog.end(), extra_eog.begin(), extra_eog.end());
  return tokenizer;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const Impl& m = *impl_;
  const TokenizerVocab& v = m.vocab;
  std::vector<int32_t> out;
  if (add_special && v.add_bos) out.push_back(v.bos);
  std::vector<Fragment> fragments;
  m.Partition(text, parse_special, &fragments);
  BpeScratch scratch;
  if (v.kind == TokenizerVocab::Kind::kBytePairs) {
    scratch.match.reset(pcre2_match_data_create(1, nullptr));
  }
  bool after_special = true;  // the text's start counts as following a special token
  for (const Fragment& fragment : fragments) {
    if (fragment.token >= 0) {
      out.push_back(fragment.token);
      after_special = true;
    } else if (v.kind == TokenizerVocab::Kind::kSentencePiece) {
      m.EncodeSentencePiece(fragment.text, v.add_space_prefix && after_special, &out);
      after_special = false;
    } else {
      m.EncodeBytePairs(fragment.text, &scratch, &out);
      after_special = false;
    }
  }
  if (add_special && v.add_eos) out.push_back(v.eos);
  return out;
}

std::string Tokenizer::TokenToPiece(int32_t token) const {
  if (token < 0 || static_cast<size_t>(token) >= impl_->pieces.size()) return "";
  return impl_->pieces[token];
}

std::string Tokenizer::Decode(std::span<const int32_t> tokens, bool strip_leading_space) const {
  std::string text;
  for (int32_t token : tokens) {
    if (token >= 0 && static_cast<size_t>(token) < impl_->pieces.size()) {
      text += impl_->pieces[token];
    }
  }
  const TokenizerVocab& v = impl_->vocab;
  if (strip_leading_space && v.kind == TokenizerVocab::Kind::kSentencePiece && v.add_space_prefix &&
      !text.empty() && text[0] == ' ') {
    text.erase(0, 1);
  }
  return text;
}

const TokenizerVocab& Tokenizer::vocab() const { return impl_->vocab; }
uint32_t Tokenizer::n_vocab() const { return static_cast<uint32_t>(impl_->vocab.tokens.size()); }
int32_t Tokenizer::bos() const { return impl_->vocab.bos; }
int32_t Tokenizer::eos() const { return impl_->vocab.eos; }

bool Tokenizer::IsEndOfGeneration(int32_t token) const {
  const std::vector<int32_t>& eog = impl_->end_of_generation;
  return token >= 0 && std::find(eog.begin(), eog.end(), token) != eog.end();
}

bool model::PreTokenizerAddsBos(std::string_view pre) {
  const PreTokenizer* found = FindPreTokenizer(pre);
  return found != nullptr && found->add_bos;
}

}  // namespace argus
