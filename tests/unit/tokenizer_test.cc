// Tokenizers: SentencePiece against llama.cpp's tokens for stories260K, byte-level BPE against
// hand-derived merges and pre-tokenizer splits, round trips over random bytes, special tokens,
// and clear errors for bad vocabularies.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "argus/gguf.h"
#include "argus/model.h"
#include "model/bpe_bytes.h"
#include "test_util.h"

namespace argus {
namespace {

using Kind = TokenizerVocab::Kind;
using TokenType = TokenizerVocab::TokenType;
using Tokens = std::vector<int32_t>;

std::unique_ptr<Tokenizer> MustCreate(TokenizerVocab vocab) {
  auto tokenizer = Tokenizer::Create(std::move(vocab));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

// An InvalidArgument (or `code`) whose message names `what`.
void ExpectError(const Status& status, StatusCode code, const std::string& what) {
  EXPECT_EQ(status.code(), code) << status.ToString();
  EXPECT_NE(status.message().find(what), std::string::npos) << status.ToString();
}

// Random byte strings: uniform bytes (mostly invalid UTF-8) or pieces of text, spaces, newlines,
// digits, punctuation and multi-byte characters.
std::vector<std::string> RandomTexts(size_t n, uint64_t salt) {
  static const std::vector<std::string> kParts = {"a",    "the",
                                                  " ",    "  ",
                                                  "\n",   "\n\n",
                                                  "\t",   "'s",
                                                  "'T",   "12345",
                                                  ".",    ",!?",
                                                  "é",    "😊",
                                                  "日本", "Ġ",
                                                  "▁",    "\r\n",
                                                  "<",    "|",
                                                  "x",    "don't",
                                                  "\xff", "\xc3",
                                                  "\x80", std::string(1, '\0')};
  std::mt19937_64 rng(testing::TestSeed() ^ salt);
  std::vector<std::string> texts;
  for (size_t i = 0; i < n; ++i) {
    std::string text;
    const size_t length = rng() % 60;
    const bool uniform = i % 2 == 0;
    for (size_t k = 0; k < length; ++k) {
      if (uniform) {
        text.push_back(static_cast<char>(rng() & 0xFF));
      } else {
        text += kParts[rng() % kParts.size()];
      }
    }
    texts.push_back(text);
  }
  return texts;
}

// ---- byte-level BPE on a hand-built vocabulary ----

// Ids 0..255: the byte tokens, id = byte. Then one token per merge ("a b" makes "ab") in merge
// order from id 256, then the control tokens <|endoftext|> <|im_start|> <|im_end|>, the
// user-defined <tool>, and "xyz", which no merge makes.
const std::vector<std::string> kMerges = {
    "h e",      // 256 he
    "l o",      // 257 lo
    "he l",     // 258 hel
    "Ġ w",      // 259 Ġw
    "o r",      // 260 or
    "Ġw or",    // 261 Ġwor
    "l d",      // 262 ld
    "Ġwor ld",  // 263 Ġworld
    "a a",      // 264 aa
    "1 2",      // 265 12
    "t '",      // 266 t'
    "' s",      // 267 's
    "Ċ Ċ",      // 268 ĊĊ
    "Ġ Ġ",      // 269 ĠĠ
    "i t",      // 270 it
};
constexpr int32_t kHe = 256, kLo = 257, kHel = 258, kWorld = 263, kAa = 264, k12 = 265,
                  kQuoteS = 267, kNewlines = 268, kSpaces = 269, kIt = 270, kEndOfText = 271,
                  kImStart = 272, kImEnd = 273, kTool = 274, kXyz = 275;

TokenizerVocab BpeVocab(const std::string& pre) {
  TokenizerVocab v;
  v.kind = Kind::kBytePairs;
  v.pre = pre;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(model::BpeSymbol(static_cast<uint8_t>(b)));
  for (const std::string& merge : kMerges) {
    const size_t space = merge.find(' ');
    v.tokens.push_back(merge.substr(0, space) + merge.substr(space + 1));
  }
  v.tokens.insert(v.tokens.end(), {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>", "xyz"});
  v.types.assign(v.tokens.size(), TokenType::kNormal);
  v.types[kEndOfText] = v.types[kImStart] = v.types[kImEnd] = TokenType::kControl;
  v.types[kTool] = TokenType::kUserDefined;
  v.merges = kMerges;
  v.eos = kEndOfText;
  v.add_bos = false;
  v.add_space_prefix = false;
  return v;
}

// The GPT-2 alphabet's best-known letters, which the vocabulary above relies on.
TEST(BpeTokenizer, ByteAlphabetSpellsSpaceAndNewlineAsGAndC) {
  EXPECT_EQ(model::BpeSymbol(' '), "\xC4\xA0");   // U+0120 Ġ
  EXPECT_EQ(model::BpeSymbol('\n'), "\xC4\x8A");  // U+010A Ċ
  EXPECT_EQ(model::BpeSymbol('a'), "a");
}

TEST(BpeTokenizer, MergesApplyByRankThenLeftmost) {
  auto t = MustCreate(BpeVocab("qwen2"));
  ASSERT_NE(t, nullptr);
  // h e l l o: "h e" (0), then "l o" (1) before "he l" (2) -> hel lo.
  EXPECT_EQ(t->Encode("hello", false), (Tokens{kHel, kLo}));
  // h e l o: after "h e", "l o" (1) outranks "he l" (2) and takes the l.
  EXPECT_EQ(t->Encode("helo", false), (Tokens{kHe, kLo}));
  // Ġ w o r l d: "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld".
  EXPECT_EQ(t->Encode(" world", false), (Tokens{kWorld}));
  EXPECT_EQ(t->Encode("hello world", false), (Tokens{kHel, kLo, kWorld}));
  // Two equal-rank pairs overlap: the leftmost merges.
  EXPECT_EQ(t->Encode("aaa", false), (Tokens{kAa, 'a'}));
  EXPECT_EQ(t->Encode("aaaa", false), (Tokens{kAa, kAa}));
  // Bytes without merges are their byte tokens.
  EXPECT_EQ(t->Encode("\x01\xff", false), (Tokens{1, 255}));
  EXPECT_EQ(t->Encode("", true), Tokens{});
}

TEST(BpeTokenizer, Qwen2SplitsDigitsContractionsSpacesAndNewlines) {
  auto qwen2 = MustCreate(BpeVocab("qwen2"));
  auto gpt2 = MustCreate(BpeVocab("gpt-2"));
  auto llama3 = MustCreate(BpeVocab("llama-bpe"));
  auto fallback = MustCreate(BpeVocab("default"));
  ASSERT_TRUE(qwen2 && gpt2 && llama3 && fallback);
  // Qwen2 takes digits one at a time (\p{N}); Llama 3 up to three, GPT-2 any run.
  EXPECT_EQ(qwen2->Encode("12", false), (Tokens{'1', '2'}));
  EXPECT_EQ(llama3->Encode("12", false), (Tokens{k12}));
  EXPECT_EQ(gpt2->Encode("12", false), (Tokens{k12}));
  EXPECT_EQ(fallback->Encode("12", false), (Tokens{k12}));
  // A contraction is its own piece, so "t '" (rank 10) cannot join across it; Qwen2 and Llama 3
  // match contractions in either case, GPT-2 lowercase only.
  EXPECT_EQ(qwen2->Encode("it's", false), (Tokens{kIt, kQuoteS}));
  EXPECT_EQ(qwen2->Encode("it'S", false), (Tokens{kIt, '\'', 'S'}));
  EXPECT_EQ(gpt2->Encode("it's", false), (Tokens{kIt, kQuoteS}));
  EXPECT_EQ(gpt2->Encode("it'S", false), (Tokens{kIt, '\'', 'S'}));
  // A run of newlines is one piece for Qwen2; GPT-2's \s+(?!\S) leaves the newline before "b"
  // to a piece of its own.
  EXPECT_EQ(qwen2->Encode("a\n\nb", false), (Tokens{'a', kNewlines, 'b'}));
  EXPECT_EQ(gpt2->Encode("a\n\nb", false), (Tokens{'a', '\n', '\n', 'b'}));
  // A space before a word joins the word; of two, the first stays alone. Trailing spaces are
  // one piece.
  EXPECT_EQ(qwen2->Encode("a  world", false), (Tokens{'a', ' ', kWorld}));
  EXPECT_EQ(qwen2->Encode("a  ", false), (Tokens{'a', kSpaces}));
  EXPECT_EQ(gpt2->Encode("a  world", false), (Tokens{'a', ' ', kWorld}));
  // The quote is a piece of its own, so "i t" (rank 14) merges though "t '" (rank 10) outranks
  // it.
  EXPECT_EQ(qwen2->Encode("xit'", false), (Tokens{'x', kIt, '\''}));
}

// Llama 3 takes a piece that spells a token whole, merges or not (llama.cpp's ignore_merges).
TEST(BpeTokenizer, Llama3TakesWholeTokensWithoutMerges) {
  auto llama3 = MustCreate(BpeVocab("llama3"));
  auto qwen2 = MustCreate(BpeVocab("qwen2"));
  ASSERT_TRUE(llama3 && qwen2);
  EXPECT_EQ(llama3->Encode("xyz", false), (Tokens{kXyz}));
  EXPECT_EQ(qwen2->Encode("xyz", false), (Tokens{'x', 'y', 'z'}));
}

TEST(BpeTokenizer, RandomBytesRoundTripUnderEveryPreTokenizer) {
  for (const char* pre : {"default", "gpt-2", "qwen2", "llama3"}) {
    auto t = MustCreate(BpeVocab(pre));
    ASSERT_NE(t, nullptr);
    for (const std::string& text : RandomTexts(300, 1)) {
      const Tokens tokens = t->Encode(text, true);
      ASSERT_EQ(t->Decode(tokens), text) << pre;
      for (int32_t id : tokens) {
        ASSERT_TRUE(id >= 0 && id < static_cast<int32_t>(t->n_vocab())) << pre;
      }
    }
  }
}

TEST(BpeTokenizer, SpecialTokensArePartitionedOnlyWhenParsed) {
  auto t = MustCreate(BpeVocab("qwen2"));
  ASSERT_NE(t, nullptr);
  const std::string chat = "<|im_start|>hello<|im_end|>";
  EXPECT_EQ(t->Encode(chat, false, true), (Tokens{kImStart, kHel, kLo, kImEnd}));
  // Unparsed, the spelling is ordinary text: no control token, and it decodes back.
  const Tokens plain = t->Encode(chat, false, false);
  for (int32_t id : plain) EXPECT_TRUE(id != kImStart && id != kImEnd && id != kEndOfText);
  EXPECT_EQ(t->Decode(plain), chat);
  // User-defined tokens are matched either way, and spell themselves.
  EXPECT_EQ(t->Encode("a<tool>b", false, false), (Tokens{'a', kTool, 'b'}));
  EXPECT_EQ(t->Encode("a<tool>b", false, true), (Tokens{'a', kTool, 'b'}));
  EXPECT_EQ(t->Encode("<tool><tool>", false), (Tokens{kTool, kTool}));
  // Pieces: control tokens are empty, others are their bytes.
  EXPECT_EQ(t->TokenToPiece(kImStart), "");
  EXPECT_EQ(t->TokenToPiece(kTool), "<tool>");
  EXPECT_EQ(t->TokenToPiece(kWorld), " world");
  EXPECT_EQ(t->TokenToPiece('\n'), "\n");
  EXPECT_EQ(t->TokenToPiece(0xA0), "\xA0");
  EXPECT_EQ(t->TokenToPiece(-1), "");
  EXPECT_EQ(t->Decode(Tokens{kImStart, kHel, kLo, kImEnd}), "hello");
}

TEST(BpeTokenizer, EndOfGenerationIsEosAndEndOfTurnTokens) {
  auto t = MustCreate(BpeVocab("qwen2"));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->eos(), kEndOfText);
  EXPECT_TRUE(t->IsEndOfGeneration(kEndOfText));
  EXPECT_TRUE(t->IsEndOfGeneration(kImEnd));
  EXPECT_FALSE(t->IsEndOfGeneration(kImStart));
  EXPECT_FALSE(t->IsEndOfGeneration('a'));
  EXPECT_FALSE(t->IsEndOfGeneration(-1));
}

TEST(BpeTokenizer, BosAndEosAreAddedWhenTheVocabularyAsks) {
  TokenizerVocab v = BpeVocab("qwen2");
  v.bos = kImStart;
  v.add_bos = v.add_eos = true;
  auto t = MustCreate(v);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("aa", true), (Tokens{kImStart, kAa, kEndOfText}));
  EXPECT_EQ(t->Encode("aa", false), (Tokens{kAa}));
  EXPECT_EQ(t->Encode("", true), (Tokens{kImStart, kEndOfText}));
}

// A long input takes a priority queue, not a quadratic scan: this would time out otherwise.
TEST(BpeTokenizer, LongInputRoundTrips) {
  auto t = MustCreate(BpeVocab("qwen2"));
  ASSERT_NE(t, nullptr);
  std::string text;
  while (text.size() < (256u << 10)) text += "hello world, it's 12 o'clock\n\n";
  text += std::string(64 << 10, 'a');  // one 64 KiB piece
  const Tokens tokens = t->Encode(text, false);
  EXPECT_EQ(t->Decode(tokens), text);
}

// ---- SentencePiece on a hand-built vocabulary ----

// <unk> <s> </s>, the 256 byte tokens (id 3 + byte), then scored pieces.
TokenizerVocab SpmVocab(const std::vector<std::pair<std::string, float>>& pieces) {
  TokenizerVocab v;
  v.kind = Kind::kSentencePiece;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    v.tokens.push_back(name);
    v.types.push_back(TokenType::kByte);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  for (const auto& [text, score] : pieces) {
    v.tokens.push_back(text);
    v.types.push_back(TokenType::kNormal);
    v.scores.push_back(score);
  }
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  return v;
}
constexpr int32_t kSpmFirst = 259;  // the first scored piece

TEST(SpmTokenizer, HighestScoringPairMergesFirstLeftmostOnTies) {
  // ids 259.. : ▁ a b ▁a ab
  const auto vocab = [](float ab) {
    return SpmVocab({{"▁", -5}, {"a", -5}, {"b", -5}, {"▁a", -1}, {"ab", ab}});
  };
  constexpr int32_t kMark = kSpmFirst, kA = kSpmFirst + 1, kB = kSpmFirst + 2,
                    kMarkA = kSpmFirst + 3, kAB = kSpmFirst + 4;
  auto ab_first = MustCreate(vocab(-0.5f));
  auto mark_a_first = MustCreate(vocab(-1.5f));
  auto tie = MustCreate(vocab(-1.0f));
  ASSERT_TRUE(ab_first && mark_a_first && tie);
  // "ab" becomes "▁ab": ▁ a b.
  EXPECT_EQ(ab_first->Encode("ab", true), (Tokens{1, kMark, kAB}));
  EXPECT_EQ(mark_a_first->Encode("ab", true), (Tokens{1, kMarkA, kB}));
  EXPECT_EQ(tie->Encode("ab", true), (Tokens{1, kMarkA, kB}));
  // Spaces become ▁; a character without a token falls back to its bytes.
  EXPECT_EQ(ab_first->Encode("a é", false), (Tokens{kMarkA, kMark, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(ab_first->Encode("", true), (Tokens{1}));
  EXPECT_EQ(ab_first->Decode(Tokens{1, kMark, kAB}), " ab");
  EXPECT_EQ(ab_first->Decode(Tokens{1, kMark, kAB}, true), "ab");
  EXPECT_EQ(ab_first->TokenToPiece(3 + 'Z'), "Z");
  EXPECT_EQ(ab_first->TokenToPiece(0), "");
  EXPECT_EQ(ab_first->TokenToPiece(kA), "a");
  EXPECT_TRUE(ab_first->IsEndOfGeneration(2));
  EXPECT_FALSE(ab_first->IsEndOfGeneration(1));
}

TEST(SpmTokenizer, SpacePrefixFollowsSpecialTokensAndCanBeOff) {
  TokenizerVocab v = SpmVocab({{"▁ab", -1}, {"ab", -2}, {"a", -5}, {"b", -5}, {"▁", -5}});
  constexpr int32_t kMarkAB = kSpmFirst, kAB = kSpmFirst + 1;
  auto t = MustCreate(v);
  v.add_space_prefix = false;
  auto bare = MustCreate(v);
  ASSERT_TRUE(t && bare);
  // Text after a parsed special token starts a new prefixed fragment.
  EXPECT_EQ(t->Encode("ab</s>ab", false, true), (Tokens{kMarkAB, 2, kMarkAB}));
  EXPECT_EQ(bare->Encode("ab</s>ab", false, true), (Tokens{kAB, 2, kAB}));
  EXPECT_EQ(bare->Decode(Tokens{kMarkAB}, true), " ab");  // no prefix to strip
  // Unparsed, "</s>" is text: bytes, which decode back.
  const Tokens plain = t->Encode("ab</s>ab", true, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
  EXPECT_EQ(t->Decode(plain, true), "ab</s>ab");
}

TEST(SpmTokenizer, RandomBytesRoundTrip) {
  auto t = MustCreate(SpmVocab({{"▁", -1}, {"▁t", -2}, {"he", -3}, {"▁the", -4}, {"th", -5}}));
  ASSERT_NE(t, nullptr);
  for (const std::string& text : RandomTexts(300, 2)) {
    // The ▁ character itself decodes as a space, as in llama.cpp: not round-trippable.
    if (text.find("▁") != std::string::npos) continue;
    ASSERT_EQ(t->Decode(t->Encode(text, true), true), text);
  }
}

// ---- stories260K: llama.cpp's tokens ----

// The model's tokenizer and llama.cpp's oracle, loaded once for the suite.
class TokenizerStories260K : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (testing::SharedDir().empty()) return;
    auto file = GgufFile::Open(testing::SharedDir() + "/models/stories260K.gguf");
    if (!file.ok()) {
      status_ = file.status();
      return;
    }
    auto tokenizer = Tokenizer::FromGguf(**file);
    status_ = tokenizer.status();
    if (tokenizer.ok()) tokenizer_ = std::move(tokenizer).value();
    std::ifstream in(testing::SharedDir() + "/testdata/stories260K/prompt1-f32.json");
    oracle_ = nlohmann::json::parse(in);
  }
  static void TearDownTestSuite() { tokenizer_.reset(); }
  void SetUp() override {
    ARGUS_SKIP_WITHOUT_SHARED();
    ASSERT_TRUE(status_.ok()) << status_.ToString();
  }
  static inline Status status_;
  static inline std::unique_ptr<Tokenizer> tokenizer_;
  static inline nlohmann::json oracle_;
};

TEST_F(TokenizerStories260K, PromptEncodesToLlamaCppTokens) {
  const Tokens expected = oracle_["tokens"].get<Tokens>();
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(expected[0], 1);
  EXPECT_EQ(tokenizer_->bos(), 1);
  EXPECT_EQ(tokenizer_->eos(), 2);
  EXPECT_EQ(tokenizer_->n_vocab(), 512u);
  EXPECT_EQ(tokenizer_->Encode(oracle_["prompt"].get<std::string>(), true), expected);
}

// llama.cpp's detokenizer kept the space of the first generated token: " One day, ...".
TEST_F(TokenizerStories260K, GreedyTokensDecodeToLlamaCppText) {
  const Tokens greedy = oracle_["greedy"].get<Tokens>();
  EXPECT_EQ(tokenizer_->Decode(greedy), oracle_["greedy_text"].get<std::string>());
}

TEST_F(TokenizerStories260K, TextRoundTripsWithByteFallback) {
  const TokenizerVocab& v = tokenizer_->vocab();
  ASSERT_EQ(v.tokens[3], "<0x00>");  // byte b is token 3 + b
  ASSERT_EQ(v.tokens[3 + 0xF0], "<0xF0>");
  for (const std::string text :
       {"Once upon a time.", "", " leading space", "two  spaces and trailing ",
        "tabs\tand\nnew\n\nlines", "Digits 0123456789, punctuation: !?;'\"()[]{}<>", "café 😊 日本",
        "ÆØÅ ñ ü ß"}) {
    const Tokens tokens = tokenizer_->Encode(text, true);
    EXPECT_EQ(tokenizer_->Decode(tokens, true), text);
  }
  // 😊 (F0 9F 98 8A) has no token in a 512-token vocabulary: its four bytes.
  const Tokens smile = tokenizer_->Encode("😊", false);
  EXPECT_EQ(Tokens(smile.end() - 4, smile.end()), (Tokens{3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x8A}));
  for (const std::string& text : RandomTexts(200, 3)) {
    if (text.find("▁") != std::string::npos) continue;
    ASSERT_EQ(tokenizer_->Decode(tokenizer_->Encode(text, true), true), text);
  }
}

// Words are merged one at a time when no token spans a word start; a token that does ("\x01▁",
// which these texts never form) forces merging the whole text at once. Both give the same tokens,
// also for runs of spaces, which "▁▁" (as in larger vocabularies) merges.
TEST_F(TokenizerStories260K, WordByWordMergingMatchesWholeTextMerging) {
  TokenizerVocab v = tokenizer_->vocab();
  const auto add = [&](const std::string& token, float score) {
    v.tokens.push_back(token);
    v.scores.push_back(score);
    v.types.push_back(TokenType::kNormal);
  };
  add("▁▁", -1.0f);
  auto by_word = MustCreate(v);
  add("\x01▁", -1000.0f);
  auto whole = MustCreate(v);
  ASSERT_TRUE(by_word && whole);
  std::vector<std::string> texts = RandomTexts(200, 4);
  texts.push_back(oracle_["prompt"].get<std::string>() + "  \n   indented  words  " +
                  oracle_["greedy_text"].get<std::string>());
  for (const std::string& text : texts) {
    if (text.find('\x01') != std::string::npos) continue;
    ASSERT_EQ(whole->Encode(text, true), by_word->Encode(text, true)) << text;
  }
}

TEST_F(TokenizerStories260K, LongTextEncodesAndRoundTrips) {
  std::string text;
  while (text.size() < (256u << 10)) text += "Lily saw a big red ball in the park. ";
  const Tokens tokens = tokenizer_->Encode(text, true);
  EXPECT_EQ(tokenizer_->Decode(tokens, true), text);
}

// ---- bad vocabularies ----

TEST(TokenizerVocabErrors, InconsistentVocabulariesNameTheKey) {
  {
    TokenizerVocab v = BpeVocab("qwen2");
    v.scores.assign(v.tokens.size() - 1, 0.0f);
    ExpectError(Tokenizer::Create(v).status(), StatusCode::kInvalidArgument,
                "tokenizer.ggml.scores");
  }
  {
    TokenizerVocab v = BpeVocab("qwen2");
    v.types.pop_back();
    ExpectError(Tokenizer::Create(v).status(), StatusCode::kInvalidArgument,
                "tokenizer.ggml.token_type");
  }
  {
    TokenizerVocab v = BpeVocab("qwen2");
    v.bos = static_cast<int32_t>(v.tokens.size());
    ExpectError(Tokenizer::Create(v).status(), StatusCode::kInvalidArgument,
                "tokenizer.ggml.bos_token_id");
  }
  {
    TokenizerVocab v = BpeVocab("qwen2");
    v.add_bos = true;
    v.bos = -1;
    ExpectError(Tokenizer::Create(v).status(), StatusCode::kInvalidArgument,
                "tokenizer.ggml.add_bos_token");
  }
  {
    TokenizerVocab v = BpeVocab("qwen2");
    v.merges.push_back("h zz");
    ExpectError(Tokenizer::Create(v).status(), StatusCode::kInvalidArgument, "'zz'");
  }
  {
    TokenizerVocab v = BpeVocab("qwen2");
    v.merges.push_back("x y");  // "xy" is not a token
    ExpectError(Tokenizer::Create(v).status(), StatusCode::kInvalidArgument,
                "tokenizer.ggml.merges[15]");
  }
  {
    TokenizerVocab v = BpeVocab("qwen2");
    v.merges.push_back("he");
    ExpectError(Tokenizer::Create(v).status(), StatusCode::kInvalidArgument,
                "tokenizer.ggml.merges[15]");
  }
  {
    TokenizerVocab v = BpeVocab("no-such-pre");
    ExpectError(Tokenizer::Create(v).status(), StatusCode::kInvalidArgument, "tokenizer.ggml.pre");
  }
  {
    TokenizerVocab v = BpeVocab("qwen2");
    v.tokens[kXyz] = "he";
    ExpectError(Tokenizer::Create(v).status(), StatusCode::kInvalidArgument, "twice");
  }
  {
    TokenizerVocab v = SpmVocab({});
    v.tokens[3] = "<0xZZ>";
    ExpectError(Tokenizer::Create(v).status(), StatusCode::kInvalidArgument, "<0xXX>");
  }
  ExpectError(Tokenizer::Create(TokenizerVocab{}).status(), StatusCode::kInvalidArgument,
              "tokenizer.ggml.tokens");
}

// ---- FromGguf ----

// A GGUF image holding `vocab` the way converters write it; `edit` adjusts the metadata.
std::vector<std::byte> VocabImage(const TokenizerVocab& v, const std::string& model,
                                  const std::function<void(GgufWriter&)>& edit = {}) {
  GgufWriter w;
  w.SetString("tokenizer.ggml.model", model);
  w.SetString("tokenizer.ggml.pre", v.pre);
  w.SetStrings("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) w.SetF32s("tokenizer.ggml.scores", v.scores);
  std::vector<int32_t> types;
  for (TokenType type : v.types) types.push_back(static_cast<int32_t>(type));
  w.SetI32s("tokenizer.ggml.token_type", types);
  if (!v.merges.empty()) w.SetStrings("tokenizer.ggml.merges", v.merges);
  if (edit) edit(w);
  auto image = w.Serialize();
  EXPECT_TRUE(image.ok()) << image.status().ToString();
  return image.ok() ? std::move(image).value() : std::vector<std::byte>{};
}

Result<std::unique_ptr<Tokenizer>> FromImage(const std::vector<std::byte>& image) {
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Parse(image, "vocab.gguf"));
  return Tokenizer::FromGguf(*file);
}

TEST(TokenizerFromGguf, ReadsBpeVocabularyWithLlamaCppDefaults) {
  const auto image = VocabImage(BpeVocab("qwen2"), "gpt2", [](GgufWriter& w) {
    w.SetU32("tokenizer.ggml.eos_token_id", kEndOfText);
    w.SetU32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);  // "none", as converters write it
    w.SetU32("tokenizer.ggml.eot_token_id", kXyz);
  });
  auto t = FromImage(image);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const TokenizerVocab& v = (*t)->vocab();
  EXPECT_EQ(v.kind, Kind::kBytePairs);
  EXPECT_EQ(v.pre, "qwen2");
  EXPECT_EQ(v.merges.size(), kMerges.size());
  EXPECT_EQ(v.pad, -1);
  EXPECT_EQ(v.bos, -1);
  EXPECT_FALSE(v.add_bos);                     // Qwen2 adds no BOS unless the file says so
  EXPECT_TRUE((*t)->IsEndOfGeneration(kXyz));  // eot_token_id
  EXPECT_TRUE((*t)->IsEndOfGeneration(kEndOfText));
  EXPECT_EQ((*t)->Encode("hello world", true), (Tokens{kHel, kLo, kWorld}));

  // The Llama 3 pre-tokenizer adds BOS by default; the file's add_bos_token wins.
  auto llama3 = FromImage(VocabImage(BpeVocab("llama-bpe"), "gpt2", [](GgufWriter& w) {
    w.SetU32("tokenizer.ggml.bos_token_id", kImStart);
  }));
  ASSERT_TRUE(llama3.ok()) << llama3.status().ToString();
  EXPECT_EQ((*llama3)->Encode("aa", true), (Tokens{kImStart, kAa}));
  auto no_bos = FromImage(VocabImage(BpeVocab("llama-bpe"), "gpt2", [](GgufWriter& w) {
    w.SetU32("tokenizer.ggml.bos_token_id", kImStart);
    w.SetBool("tokenizer.ggml.add_bos_token", false);
  }));
  ASSERT_TRUE(no_bos.ok()) << no_bos.status().ToString();
  EXPECT_EQ((*no_bos)->Encode("aa", true), (Tokens{kAa}));
}

TEST(TokenizerFromGguf, SentencePieceDefaultsToBos1Eos2AndSpacePrefix) {
  TokenizerVocab v = SpmVocab({{"▁ab", -1}, {"ab", -2}});
  auto t = FromImage(VocabImage(v, "llama"));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->bos(), 1);
  EXPECT_EQ((*t)->eos(), 2);
  EXPECT_EQ((*t)->vocab().unk, 0);
  EXPECT_EQ((*t)->Encode("ab", true), (Tokens{1, kSpmFirst}));
  auto bare = FromImage(VocabImage(v, "llama", [](GgufWriter& w) {
    w.SetBool("tokenizer.ggml.add_space_prefix", false);
    w.SetBool("tokenizer.ggml.add_bos_token", false);
    w.SetBool("tokenizer.ggml.add_eos_token", true);
  }));
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  EXPECT_EQ((*bare)->Encode("ab", true), (Tokens{kSpmFirst + 1, 2}));
}

TEST(TokenizerFromGguf, BadMetadataIsAnErrorNamingFileAndKey) {
  const TokenizerVocab v = BpeVocab("qwen2");
  ExpectError(FromImage(VocabImage(v, "bert")).status(), StatusCode::kUnsupported, "bert");
  {
    GgufWriter w;
    w.SetString("tokenizer.ggml.model", "gpt2");
    auto image = w.Serialize();
    ASSERT_TRUE(image.ok());
    ExpectError(FromImage(*image).status(), StatusCode::kInvalidArgument,
                "vocab.gguf: tokenizer.ggml.tokens");
  }
  ExpectError(FromImage(VocabImage(v, "gpt2",
                                   [](GgufWriter& w) {
                                     w.SetI32s("tokenizer.ggml.tokens", {1, 2, 3});
                                   }))
                  .status(),
              StatusCode::kInvalidArgument, "tokenizer.ggml.tokens");
  ExpectError(
      FromImage(
          VocabImage(v, "gpt2", [](GgufWriter& w) { w.SetF32s("tokenizer.ggml.scores", {0.0f}); }))
          .status(),
      StatusCode::kInvalidArgument, "tokenizer.ggml.scores");
  ExpectError(
      FromImage(VocabImage(v, "gpt2",
                           [](GgufWriter& w) { w.SetU32("tokenizer.ggml.bos_token_id", 100000); }))
          .status(),
      StatusCode::kInvalidArgument, "tokenizer.ggml.bos_token_id");
  ExpectError(
      FromImage(VocabImage(v, "gpt2",
                           [](GgufWriter& w) { w.SetU32("tokenizer.ggml.eom_token_id", 100000); }))
          .status(),
      StatusCode::kInvalidArgument, "tokenizer.ggml.eom_token_id");
  ExpectError(FromImage(VocabImage(v, "gpt2",
                                   [](GgufWriter& w) {
                                     w.SetI32s("tokenizer.ggml.token_type",
                                               std::vector<int32_t>(276, 9));
                                   }))
                  .status(),
              StatusCode::kInvalidArgument, "tokenizer.ggml.token_type[0]");
}

}  // namespace
}  // namespace argus
