// The end-to-end host: Llama and Qwen2 models read from GGUF files, their tokenizers, a forward
// pass whose KV lives in an argus::KvCache and whose attention runs in the AttentionEngine,
// sampling, and perplexity. This module uses only the public cache, attention, codec and core
// APIs, as any engine embedding ARGUS would.
//
// Model is immutable after Load and may be shared by several Contexts (one per sequence). A
// Context is not thread-safe; it runs its work on its own thread pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "argus/attention.h"
#include "argus/cache.h"
#include "argus/gguf.h"
#include "argus/policy.h"
#include "argus/status.h"

namespace argus {

class RemoteTier;

// ---- Tokenizer -------------------------------------------------------------------------------

// The vocabulary a tokenizer is built from (GGUF keys tokenizer.ggml.*).
struct TokenizerVocab {
  enum class Kind : uint8_t { kSentencePiece, kBytePairs };  // "llama", "gpt2"
  enum class TokenType : int32_t {  // tokenizer.ggml.token_type, as llama.cpp numbers them
    kUndefined = 0,
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
  };
  Kind kind = Kind::kSentencePiece;
  std::vector<std::string> tokens;  // [n_vocab]
  std::vector<float> scores;        // [n_vocab] (SentencePiece merge priority) or empty
  std::vector<TokenType> types;     // [n_vocab] or empty (all normal)
  std::vector<std::string> merges;  // byte-pair merges "a b", highest priority first
  std::string pre = "default";      // tokenizer.ggml.pre: the pre-tokenizer of BPE vocabularies
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;  // -1: none
  bool add_bos = true, add_eos = false;
  bool add_space_prefix = true;  // SentencePiece: a space is prepended to the text
};

class Tokenizer {
 public:
  // InvalidArgument naming the key when the metadata is missing or inconsistent; Unsupported
  // for a tokenizer.ggml.model other than llama or gpt2.
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);
  static Result<std::unique_ptr<Tokenizer>> Create(TokenizerVocab vocab);
  ~Tokenizer();

  // Token ids for `text` as llama.cpp's tokenizer gives them. add_special: prepend BOS (and
  // append EOS) when the vocabulary asks for it. parse_special: text spelling a control token
  // (e.g. "<|im_start|>") becomes that token rather than its characters.
  std::vector<int32_t> Encode(std::string_view text, bool add_special = true,
                              bool parse_special = false) const;
  // The bytes a token stands for (byte tokens give their byte; SentencePiece's U+2581 gives a
  // space; control tokens give ""). Concatenating pieces gives the text, byte for byte.
  std::string TokenToPiece(int32_t token) const;
  // Concatenated pieces; SentencePiece drops the space the encoder prepended to the first token
  // when `strip_leading_space` is set.
  std::string Decode(std::span<const int32_t> tokens, bool strip_leading_space = false) const;

  const TokenizerVocab& vocab() const;
  uint32_t n_vocab() const;
  int32_t bos() const;
  int32_t eos() const;
  bool IsEndOfGeneration(int32_t token) const;  // EOS, and control tokens such as <|im_end|>

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- Model -----------------------------------------------------------------------------------

enum class ModelArch : uint8_t { kLlama, kQwen2 };
std::string_view ModelArchName(ModelArch arch);  // "llama", "qwen2"

struct ModelConfig {
  ModelArch arch = ModelArch::kLlama;
  std::string name;  // general.name, or the file name
  uint32_t n_layers = 0, n_embd = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, n_ff = 0;
  uint32_t n_vocab = 0, n_ctx_train = 0;
  float rms_eps = 1e-5f, rope_theta = 10000.0f;
  // Llama GGUF files rotate adjacent pairs (x[2i], x[2i+1]); Qwen2 rotates halves
  // (x[i], x[i + head_dim/2]), the "NeoX" layout.
  bool rope_neox = false;
  bool rope_freq_factors = false;  // a rope_freqs.weight tensor divides each pair's frequency
  bool tied_output = false;        // no output.weight: the token embedding is reused
  CacheGeometry geometry() const;  // n_layers, n_heads, n_kv_heads, head_dim
  std::string ToString() const;
};

class Model {
 public:
  // Opens a GGUF file and checks that every tensor the architecture needs is present with the
  // right shape and a supported type (F32, F16, BF16, Q8_0, Q4_0): errors name the tensor.
  static Result<std::unique_ptr<Model>> Load(const std::string& path);
  ~Model();

  const ModelConfig& config() const;
  const Tokenizer& tokenizer() const;
  const GgufFile& file() const;
  uint64_t weight_bytes() const;  // bytes of all weight tensors
  // XXH3-128 of the whole GGUF file, in hex: names the model (weights, tokenizer, metadata) for
  // prefix pages kept across runs. Computed on first use (it reads every byte once).
  const std::string& fingerprint() const;

 private:
  struct Impl;
  // The forward pass reaches the weights through it (src/model/model_internal.h).
  friend struct ModelAccess;
  Model();
  std::unique_ptr<Impl> impl_;
};

// ---- Inference context -----------------------------------------------------------------------

struct ContextOptions {
  uint32_t n_ctx = 0;      // tokens the context can hold; 0: the model's training context
  uint32_t n_threads = 0;  // 0: one per hardware thread
  uint32_t n_batch = 64;   // prefill chunk: tokens evaluated together
  // The KV cache: codecs of full pages, the active page's codec, page size, RAM budget
  // (0: exactly what n_ctx tokens need, KvCache::RequiredRamBytes).
  std::string k_codec = "f16", v_codec = "f16", active_codec = "f16";
  uint32_t page_tokens = 256;
  size_t ram_budget_bytes = 0;
  AttentionOptions attention;  // window, sinks, epsilon; scale 0 = 1/sqrt(head_dim)
  // Optional: a disk tier for prefix pages (LoadPrefix, StorePrefix) and for the placement
  // engine's disk states and exact masters. Not owned.
  DiskTier* disk = nullptr;
  // Optional: a remote tier (Redis) below the disk tier for prefix pages: LoadPrefix fetches the
  // leading pages the disk lacks from it into the disk tier (within its budget) before loading,
  // and StorePrefix also writes the stored pages there. Failures of the remote tier are misses,
  // never errors. Needs `disk`. Not owned.
  RemoteTier* remote = nullptr;
  // Optional: a placement engine keeps the cache within ram_budget_bytes under this profile.
  // The cache then holds full pages in the codecs of the ladder's first state (k_codec and
  // v_codec must be those), and attention, decode and prefill, uses the profile's epsilon
  // (`attention` must be left at its defaults: no window, sinks, scale or epsilon of its own). Each
  // request (the context's life, or from a Truncate(0) on) decides activation once, from
  // expected_tokens (0: n_ctx); see PlacementEngine::BeginRequest.
  std::optional<PlacementOptions> placement;
  uint32_t expected_tokens = 0;
  // Called with every layer's new rows as attention receives them (after RoPE, before the
  // cache): q [n_tokens, n_heads, head_dim], k, v [n_tokens, n_kv_heads, head_dim], at positions
  // first .. first+n_tokens-1. For dumps of real activations.
  std::function<void(uint32_t layer, uint32_t first, uint32_t n_tokens, const float* q,
                     const float* k, const float* v)>
      qkv_observer;
};

// Where a context's time went since the last ResetTimes(), in seconds.
struct TimeSplit {
  double matmul_s = 0;     // weight matrix products (incl. the output projection)
  double attention_s = 0;  // KV append and attention
  double other_s = 0;      // norms, RoPE, activations, embedding lookup
  uint64_t n_tokens = 0;   // tokens evaluated
  double total_s() const { return matmul_s + attention_s + other_s; }
};

// The remote tier's part in a context's prefix pages (ContextOptions::remote).
struct RemotePrefixStats {
  uint32_t n_tokens_loaded = 0;  // tokens the last LoadPrefix loaded from pages fetched remotely
  size_t n_pages_fetched = 0;    // pages fetched into the disk tier, over the context's life
  size_t n_pages_stored = 0;     // pages written to the remote tier, over the context's life
};

class Context {
 public:
  // InvalidArgument when the options do not fit the model (codecs, page size, n_ctx). The RAM
  // budget is enforced as the cache grows (Eval's ResourceExhausted).
  static Result<std::unique_ptr<Context>> Create(const Model& model, const ContextOptions& options);
  ~Context();

  // Evaluates `tokens` at the next positions, in chunks of n_batch. Returns the logits of the
  // last token ([n_vocab]), or of every token ([n_tokens, n_vocab]) when all_logits is set; the
  // span is valid until the next call. InvalidArgument for a token id outside the vocabulary or
  // a context that would exceed n_ctx; ResourceExhausted when the KV cache's budget is reached
  // (the context is then unchanged: the chunk is rolled back).
  Result<std::span<const float>> Eval(std::span<const int32_t> tokens, bool all_logits = false);
  uint32_t n_past() const;  // tokens in the context
  // Appends n_tokens of seeded noise K/V rows (uniform, unit variance) to every layer without
  // running the model: a benchmark's way to decode at a depth no prefill here would reach in time.
  Status AppendSyntheticContext(uint32_t n_tokens, uint64_t seed);
  // Forgets everything after the first n_tokens; Truncate(0) also begins a new placement request.
  Status Truncate(uint32_t n_tokens);

  // Prefix pages in the disk tier (ContextOptions::disk), keyed by the model's fingerprint and
  // the token ids: LoadPrefix, on an empty context, loads the K/V of the longest run of whole
  // pages of `tokens` stored earlier (by any process) and returns the tokens it covers, which
  // need no evaluation; StorePrefix stores the full pages of the context's first tokens
  // (`tokens` are the ids evaluated so far) that were computed exactly (no epsilon, window or
  // sinks; with an active placement ladder, every page attended in its full codecs) and counts
  // every page in `stats`, on error too (KvCache::StorePrefix).
  Result<uint32_t> LoadPrefix(std::span<const int32_t> tokens);
  Status StorePrefix(std::span<const int32_t> tokens, PrefixStoreStats& stats);
  const RemotePrefixStats& remote_prefix_stats() const;

  const KvCache& cache() const;
  // The placement engine's statistics; nullopt without one (ContextOptions::placement).
  std::optional<PlacementStats> placement_stats() const;
  const AttentionStats& last_attention_stats() const;  // summed over the last Eval's layers
  const TimeSplit& times() const;
  void ResetTimes();

 private:
  Context();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- Many sequences, one KV memory, one forward pass per step -------------------------------

struct BatchContextOptions {
  uint32_t n_ctx = 0;      // tokens one sequence can hold; 0: the model's training context
  uint32_t n_threads = 0;  // 0: one per hardware thread
  uint32_t n_batch = 512;  // rows (tokens of all sequences) one Eval evaluates at most
  std::string k_codec = "f16", v_codec = "f16", active_codec = "f16";
  uint32_t page_tokens = 256;
  // The RAM of every sequence's pages together; 0: what n_full_sequences sequences of n_ctx
  // tokens need.
  size_t ram_budget_bytes = 0;
  uint32_t n_full_sequences = 1;
  AttentionOptions attention;
  // Optional: the disk tier of the placement engine's disk states and exact masters. Not owned.
  DiskTier* disk = nullptr;
  // Optional: a placement engine keeps every sequence's pages together within ram_budget_bytes
  // under this profile (PlacementEngine::BeginBatch: one request for the context's life, its
  // activation decided for n_full_sequences sequences of n_ctx tokens). As for
  // ContextOptions::placement, k_codec and v_codec must be the ladder's first state's and
  // `attention` left at its defaults.
  std::optional<PlacementOptions> placement;
};

// One piece of a step: tokens of one sequence at its next positions, and whether the logits of
// its last token are wanted.
struct BatchPiece {
  SeqId seq = 0;
  std::span<const int32_t> tokens;
  bool logits = true;
};

// Many sequences in one KvCache under one RAM budget, evaluated together: each Eval runs one
// forward pass over the tokens of several sequences (every weight matrix read once for all of
// them), each sequence's tokens attending over its own pages. A piece evaluates exactly as the
// same tokens would in a Context of the same options whose chunk ends where the piece ends: the
// rows of a weight product do not interact. Sequences fork copy-on-write, so prompts with a
// common prefix share its full pages. With a placement engine (BatchContextOptions::placement),
// a step's appends make room by moving the coldest pages of any sequence down the ladder or to
// disk, and its attention promotes pages it finds hot; the budget's ResourceExhausted comes only
// when the pages cannot be placed in any state. Not thread-safe; it runs its work on its own
// thread pool.
class BatchContext {
 public:
  // InvalidArgument when the options do not fit the model (codecs, page size, n_ctx, n_batch).
  static Result<std::unique_ptr<BatchContext>> Create(const Model& model,
                                                      const BatchContextOptions& options);
  ~BatchContext();

  Result<SeqId> NewSequence();
  // A new sequence holding the first n_tokens of `seq`: its full pages shared (copy-on-write),
  // the rest copied. NotFound for an unknown seq; InvalidArgument when it holds fewer tokens;
  // ResourceExhausted when the copies do not fit.
  Result<SeqId> Fork(SeqId seq, uint32_t n_tokens);
  // Drops a sequence and every page no other sequence shares. NotFound for an unknown seq.
  Status Release(SeqId seq);
  // Forgets everything after a sequence's first n_tokens. NotFound for an unknown seq;
  // InvalidArgument when it holds fewer; ResourceExhausted when a page it re-opens does not fit.
  Status Truncate(SeqId seq, uint32_t n_tokens);
  // Tokens in a sequence. NotFound for an unknown seq.
  Result<uint32_t> Length(SeqId seq) const;

  // Evaluates every piece (distinct sequences, at most n_batch tokens in all). Returns the logits
  // of the last token of each piece that asks for them, in piece order ([n, n_vocab]), valid
  // until the next call. InvalidArgument for an unknown or repeated sequence, a bad token id, a
  // piece that would exceed n_ctx, or too many tokens; ResourceExhausted when the pages do not
  // fit the budget. All or nothing: on error every sequence is as it was.
  Result<std::span<const float>> Eval(std::span<const BatchPiece> pieces);

  // Prefix pages in the disk tier (BatchContextOptions::disk), as Context's for one sequence:
  // LoadPrefix, into an empty seq, loads the K/V of the longest run of whole pages of `tokens`
  // stored earlier (by any process) and returns the tokens it covers, which need no evaluation
  // (ResourceExhausted when they do not fit in RAM now: nothing loads); StorePrefix stores the
  // full pages of seq's first tokens (`tokens`: its ids so far) that were computed exactly, and
  // counts every page in `stats`, on error too. NotFound for an unknown seq.
  Result<uint32_t> LoadPrefix(SeqId seq, std::span<const int32_t> tokens);
  Status StorePrefix(SeqId seq, std::span<const int32_t> tokens, PrefixStoreStats& stats);

  const KvCache& cache() const;
  uint32_t n_ctx() const;
  uint32_t n_batch() const;
  const TimeSplit& times() const;  // accumulated over every Eval
  // The placement engine's statistics; nullopt without one.
  std::optional<PlacementStats> placement_stats() const;
  // The KV bytes, in the full codecs, that all sequences together can hold: the RAM budget, or
  // with a placement engine PlacementEngine::PlaceableBytes.
  size_t placeable_bytes() const;

 private:
  BatchContext();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- Sampling --------------------------------------------------------------------------------

struct SamplerOptions {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  uint32_t top_k = 40;       // 0: no top-k cut
  float top_p = 0.95f;       // 1: no nucleus cut
  uint64_t seed = 0;
};

// Deterministic for a seed: the same logits and seed give the same tokens on every machine.
class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);
  int32_t Sample(std::span<const float> logits);

 private:
  SamplerOptions options_;
  uint64_t state_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// ---- Perplexity ------------------------------------------------------------------------------

struct PerplexityResult {
  double perplexity = 0;  // exp(mean negative log-likelihood)
  double mean_nll = 0;
  uint64_t n_scored = 0;  // tokens scored
  uint32_t n_windows = 0;
  CacheStats cache;  // of the last window, at its end
  TimeSplit times;
  std::optional<PlacementStats> placement;  // at the end, with a placement engine
};

// Perplexity over `tokens` in consecutive windows of n_ctx tokens (BOS first in each window when
// the vocabulary adds one); as llama.cpp's perplexity tool, only the second half of each window
// is scored, so every scored token has at least n_ctx/2 of context. `progress` (may be null) is
// called after each window with (done, total).
Result<PerplexityResult> Perplexity(const Model& model, const ContextOptions& options,
                                    std::span<const int32_t> tokens,
                                    const std::function<void(uint32_t, uint32_t)>& progress = {});

// ---- Random-weight models --------------------------------------------------------------------

struct RandomModelOptions {
  ModelConfig config;               // geometry; n_vocab is set to the byte vocabulary's size
  GgmlType type = GgmlType::kQ8_0;  // weight matrices (norms stay F32)
  uint64_t seed = 1;
  std::function<void(uint32_t done, uint32_t total)> progress;  // tensors written; may be empty
};
// The geometry of a known model ("qwen2.5-0.5b", "llama-3-8b", "stories260k", ...);
// InvalidArgument listing the presets for an unknown name.
Result<ModelConfig> ModelPreset(std::string_view name);
std::vector<std::string> ModelPresetNames();
// Writes a GGUF file of the config's geometry with random weights and a 256+3-token byte-level
// BPE vocabulary (bytes, BOS, EOS, PAD), streaming tensors so any size can be written.
Status WriteRandomModel(const RandomModelOptions& options, const std::string& path);

}  // namespace argus
