// Random-weight GGUF models of real geometries, for speed tests where the weights do not matter.
// Weights are uniform in [-a, a] with a = sqrt(3 / n_cols), so every projection keeps unit
// variance and activations stay finite through any depth.
#include <cmath>
#include <cstring>

#include "argus/codec.h"
#include "argus/core.h"
#include "argus/model.h"
#include "model/bpe_bytes.h"
#include "model/model_internal.h"

namespace argus {

namespace {

struct Preset {
  std::string_view name;
  ModelConfig config;
};

ModelConfig Config(ModelArch arch, uint32_t n_layers, uint32_t n_embd, uint32_t n_heads,
                   uint32_t n_kv_heads, uint32_t n_ff, uint32_t n_ctx, float theta, float eps,
                   bool tied) {
  ModelConfig c;
  c.arch = arch;
  c.n_layers = n_layers;
  c.n_embd = n_embd;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = n_embd / n_heads;
  c.n_ff = n_ff;
  c.n_ctx_train = n_ctx;
  c.rope_theta = theta;
  c.rms_eps = eps;
  c.rope_neox = arch == ModelArch::kQwen2;
  c.tied_output = tied;
  return c;
}

// Published hyperparameters of each model's config.json.
const std::vector<Preset>& Presets() {
  static const std::vector<Preset> presets = {
      {"qwen2.5-0.5b", Config(ModelArch::kQwen2, 24, 896, 14, 2, 4864, 32768, 1e6f, 1e-6f, true)},
      {"qwen2.5-1.5b", Config(ModelArch::kQwen2, 28, 1536, 12, 2, 8960, 32768, 1e6f, 1e-6f, true)},
      {"qwen2.5-7b", Config(ModelArch::kQwen2, 28, 3584, 28, 4, 18944, 32768, 1e6f, 1e-6f, false)},
      {"llama-3.2-1b", Config(ModelArch::kLlama, 16, 2048, 32, 8, 8192, 131072, 5e5f, 1e-5f, true)},
      {"llama-3-8b", Config(ModelArch::kLlama, 32, 4096, 32, 8, 14336, 8192, 5e5f, 1e-5f, false)},
      {"stories260k", Config(ModelArch::kLlama, 5, 64, 8, 4, 172, 2048, 1e4f, 1e-5f, true)},
  };
  return presets;
}

constexpr uint32_t kByteVocab = 256 + 3;  // bytes, then BOS, EOS, PAD

// Fills a [n_rows, n_cols] tensor of `type` with noise of amplitude `amplitude`.
Status FillMatrix(std::span<std::byte> out, GgmlType type, uint32_t n_rows, uint32_t n_cols,
                  uint64_t key, float amplitude, ThreadPool& pool) {
  std::unique_ptr<Codec> codec;
  if (type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0) {
    ARGUS_ASSIGN_OR_RETURN(
        codec, CodecRegistry::Default().Create(type == GgmlType::kQ8_0 ? "q8_0" : "q4_0"));
  }
  const size_t row_bytes = out.size() / n_rows;
  std::vector<Status> errors((n_rows + 63) / 64);
  pool.ParallelFor(n_rows, 64, [&](size_t chunk, size_t begin, size_t end) {
    std::vector<float> row(n_cols);
    for (size_t r = begin; r < end; ++r) {
      for (uint32_t c = 0; c < n_cols; ++c)
        row[c] = amplitude * model::UnitNoise(key, r * n_cols + c);
      std::byte* dst = out.data() + r * row_bytes;
      if (codec) {
        // A ggml Q8_0/Q4_0 row is n_cols/32 blocks: the codec's tile of [n_cols/32, 32].
        Status s = codec->encode(row.data(), {n_cols / 32, 32}, {dst, row_bytes});
        if (!s.ok()) errors[chunk] = s;
        continue;
      }
      for (uint32_t c = 0; c < n_cols; ++c) {
        if (type == GgmlType::kF32) {
          std::memcpy(dst + 4 * c, &row[c], 4);
        } else {
          const uint16_t h = type == GgmlType::kF16 ? FloatToHalf(row[c]) : FloatToBf16(row[c]);
          std::memcpy(dst + 2 * c, &h, 2);
        }
      }
    }
  });
  for (Status& s : errors) ARGUS_RETURN_IF_ERROR(s);
  return Status::Ok();
}

}  // namespace

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : Presets()) names.emplace_back(p.name);
  return names;
}

Result<ModelConfig> ModelPreset(std::string_view name) {
  std::string known;
  for (const Preset& p : Presets()) {
    if (p.name == name) {
      ModelConfig c = p.config;
      c.name = std::string(name) + " (random weights)";
      c.n_vocab = kByteVocab;
      return c;
    }
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  }
  return Status::InvalidArgument("unknown model preset '" + std::string(name) +
                                 "' (known: " + known + ")");
}

Status WriteRandomModel(const RandomModelOptions& options, const std::string& path) {
  const ModelConfig& c = options.config;
  ARGUS_RETURN_IF_ERROR(c.geometry().Validate());
  const bool blocks = options.type == GgmlType::kQ8_0 || options.type == GgmlType::kQ4_0;
  if (blocks && (c.n_embd % 32 != 0 || c.n_ff % 32 != 0 || c.head_dim * c.n_heads % 32 != 0)) {
    return Status::InvalidArgument(
        "random model: embedding, FFN and attention widths must be "
        "multiples of 32 for block-quantised weights");
  }
  const std::string arch(ModelArchName(c.arch));
  GgufWriter w;
  w.SetString("general.architecture", arch);
  w.SetString("general.name", c.name);
  w.SetU32(arch + ".block_count", c.n_layers);
  w.SetU32(arch + ".context_length", c.n_ctx_train);
  w.SetU32(arch + ".embedding_length", c.n_embd);
  w.SetU32(arch + ".feed_forward_length", c.n_ff);
  w.SetU32(arch + ".attention.head_count", c.n_heads);
  w.SetU32(arch + ".attention.head_count_kv", c.n_kv_heads);
  w.SetU32(arch + ".attention.key_length", c.head_dim);
  w.SetU32(arch + ".attention.value_length", c.head_dim);
  w.SetF32(arch + ".attention.layer_norm_rms_epsilon", c.rms_eps);
  w.SetF32(arch + ".rope.freq_base", c.rope_theta);

  std::vector<std::string> tokens;
  for (uint32_t b = 0; b < 256; ++b) tokens.push_back(model::BpeSymbol(static_cast<uint8_t>(b)));
  tokens.insert(tokens.end(), {"<|bos|>", "<|eos|>", "<|pad|>"});
  std::vector<int32_t> types(kByteVocab, 1);
  types[256] = types[257] = types[258] = 3;  // control
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "default");
  w.SetStrings("tokenizer.ggml.tokens", std::move(tokens));
  w.SetI32s("tokenizer.ggml.token_type", std::move(types));
  w.SetStrings("tokenizer.ggml.merges", {});
  w.SetU32("tokenizer.ggml.bos_token_id", 256);
  w.SetU32("tokenizer.ggml.eos_token_id", 257);
  w.SetU32("tokenizer.ggml.padding_token_id", 258);
  w.SetBool("tokenizer.ggml.add_bos_token", true);

  auto pool = std::make_shared<ThreadPool>();
  uint64_t key = options.seed * 0xd1342543de82ef95ull;
  const uint32_t n_matrices = 1 + 7 * c.n_layers + (c.tied_output ? 0 : 1);
  auto n_done = std::make_shared<uint32_t>(0);
  const auto matrix = [&](const std::string& name, uint32_t n_rows, uint32_t n_cols,
                          GgmlType type) -> Status {
    const float amplitude = std::sqrt(3.0f / static_cast<float>(n_cols));
    const uint64_t tensor_key = ++key;
    const auto progress = options.progress;
    return w.AddTensor(name, type, {n_cols, n_rows}, [=](std::span<std::byte> out) {
      Status s = FillMatrix(out, type, n_rows, n_cols, tensor_key, amplitude, *pool);
      if (progress) progress(++*n_done, n_matrices);
      return s;
    });
  };
  const auto vector = [&](const std::string& name, uint32_t n, float center, float spread) {
    std::vector<float> v(n);
    const uint64_t tensor_key = ++key;
    for (uint32_t i = 0; i < n; ++i) v[i] = center + spread * model::UnitNoise(tensor_key, i);
    return w.AddTensor(name, GgmlType::kF32, {n},
                       std::as_bytes(std::span<const float>(v.data(), v.size())));
  };
  const uint32_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  ARGUS_RETURN_IF_ERROR(matrix("token_embd.weight", kByteVocab, c.n_embd, options.type));
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    ARGUS_RETURN_IF_ERROR(vector(p + "attn_norm.weight", c.n_embd, 1.0f, 0.1f));
    ARGUS_RETURN_IF_ERROR(matrix(p + "attn_q.weight", q_dim, c.n_embd, options.type));
    ARGUS_RETURN_IF_ERROR(matrix(p + "attn_k.weight", kv_dim, c.n_embd, options.type));
    ARGUS_RETURN_IF_ERROR(matrix(p + "attn_v.weight", kv_dim, c.n_embd, options.type));
    if (c.arch == ModelArch::kQwen2) {
      ARGUS_RETURN_IF_ERROR(vector(p + "attn_q.bias", q_dim, 0.0f, 0.1f));
      ARGUS_RETURN_IF_ERROR(vector(p + "attn_k.bias", kv_dim, 0.0f, 0.1f));
      ARGUS_RETURN_IF_ERROR(vector(p + "attn_v.bias", kv_dim, 0.0f, 0.1f));
    }
    ARGUS_RETURN_IF_ERROR(matrix(p + "attn_output.weight", c.n_embd, q_dim, options.type));
    ARGUS_RETURN_IF_ERROR(vector(p + "ffn_norm.weight", c.n_embd, 1.0f, 0.1f));
    ARGUS_RETURN_IF_ERROR(matrix(p + "ffn_gate.weight", c.n_ff, c.n_embd, options.type));
    ARGUS_RETURN_IF_ERROR(matrix(p + "ffn_up.weight", c.n_ff, c.n_embd, options.type));
    ARGUS_RETURN_IF_ERROR(matrix(p + "ffn_down.weight", c.n_embd, c.n_ff, options.type));
  }
  ARGUS_RETURN_IF_ERROR(vector("output_norm.weight", c.n_embd, 1.0f, 0.1f));
  if (!c.tied_output) {
    ARGUS_RETURN_IF_ERROR(matrix("output.weight", kByteVocab, c.n_embd, options.type));
  }
  return w.Write(path);
}

}  // namespace argus
