// Loading a Llama or Qwen2 model from GGUF: the hyperparameters from metadata, every tensor the
// forward pass needs checked for presence, shape and type before anything runs.
#include "argus/model.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/checksum.h"
#include "model/model_internal.h"

namespace argus {

std::string_view ModelArchName(ModelArch arch) {
  return arch == ModelArch::kQwen2 ? "qwen2" : "llama";
}

CacheGeometry ModelConfig::geometry() const {
  return CacheGeometry{n_layers, n_heads, n_kv_heads, head_dim};
}

std::string ModelConfig::ToString() const {
  return std::string(ModelArchName(arch)) + " '" + name + "': " + std::to_string(n_layers) +
         " layers, embedding " + std::to_string(n_embd) + ", " + std::to_string(n_heads) +
         " heads (" + std::to_string(n_kv_heads) + " KV) of " + std::to_string(head_dim) +
         ", FFN " + std::to_string(n_ff) + ", vocabulary " + std::to_string(n_vocab);
}

Model::Model() : impl_(std::make_unique<Impl>()) {}
Model::~Model() = default;
const ModelConfig& Model::config() const { return impl_->config; }
const Tokenizer& Model::tokenizer() const { return *impl_->tokenizer; }
const GgufFile& Model::file() const { return *impl_->file; }
uint64_t Model::weight_bytes() const { return impl_->weight_bytes; }
const std::string& Model::fingerprint() const { return impl_->fingerprint(); }

const std::string& Model::Impl::fingerprint() const {
  std::call_once(fingerprint_once, [&] {
    const Hash128 h = Checksum128(file->image());
    char hex[33];
    std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(h.hi),
                  static_cast<unsigned long long>(h.lo));
    fingerprint_hex = hex;
  });
  return fingerprint_hex;
}

namespace {

// Reads hyperparameters `<arch>.<key>`, naming the file in errors.
class HyperParams {
 public:
  HyperParams(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  Result<uint32_t> U32(std::string_view key) const {
    ARGUS_ASSIGN_OR_RETURN(uint64_t v, file_.GetUint(Key(key)));
    if (v == 0 || v > (1u << 24)) {
      return Status::InvalidArgument(file_.name() + ": " + Key(key) + " = " + std::to_string(v) +
                                     " is out of range");
    }
    return static_cast<uint32_t>(v);
  }
  Result<uint32_t> U32Or(std::string_view key, uint32_t fallback) const {
    if (!file_.Find(Key(key))) return fallback;
    return U32(key);
  }
  Result<float> F32Or(std::string_view key, float fallback) const {
    if (!file_.Find(Key(key))) return fallback;
    ARGUS_ASSIGN_OR_RETURN(double v, file_.GetFloat(Key(key)));
    if (!(v > 0) || v > 1e12) {
      return Status::InvalidArgument(file_.name() + ": " + Key(key) + " = " + std::to_string(v) +
                                     " is out of range");
    }
    return static_cast<float>(v);
  }
  std::string Key(std::string_view key) const { return arch_ + "." + std::string(key); }

 private:
  const GgufFile& file_;
  std::string arch_;
};

Result<ModelConfig> ReadConfig(const GgufFile& file) {
  ModelConfig c;
  ARGUS_ASSIGN_OR_RETURN(std::string arch, file.GetString("general.architecture"));
  if (arch == "llama") {
    c.arch = ModelArch::kLlama;
  } else if (arch == "qwen2") {
    c.arch = ModelArch::kQwen2;
    c.rope_neox = true;
  } else {
    return Status::Unsupported(file.name() + ": architecture '" + arch +
                               "' (ARGUS runs llama and qwen2)");
  }
  auto name = file.GetString("general.name");
  c.name = name.ok() ? *name : std::filesystem::path(file.name()).stem().string();
  const HyperParams hp(file, arch);
  ARGUS_ASSIGN_OR_RETURN(c.n_layers, hp.U32("block_count"));
  ARGUS_ASSIGN_OR_RETURN(c.n_embd, hp.U32("embedding_length"));
  ARGUS_ASSIGN_OR_RETURN(c.n_ff, hp.U32("feed_forward_length"));
  ARGUS_ASSIGN_OR_RETURN(c.n_heads, hp.U32("attention.head_count"));
  ARGUS_ASSIGN_OR_RETURN(c.n_kv_heads, hp.U32Or("attention.head_count_kv", c.n_heads));
  ARGUS_ASSIGN_OR_RETURN(c.head_dim, hp.U32Or("attention.key_length", c.n_embd / c.n_heads));
  ARGUS_ASSIGN_OR_RETURN(uint32_t value_dim, hp.U32Or("attention.value_length", c.head_dim));
  ARGUS_ASSIGN_OR_RETURN(uint32_t rope_dims, hp.U32Or("rope.dimension_count", c.head_dim));
  ARGUS_ASSIGN_OR_RETURN(c.n_ctx_train, hp.U32Or("context_length", 2048));
  ARGUS_ASSIGN_OR_RETURN(c.rms_eps, hp.F32Or("attention.layer_norm_rms_epsilon", 1e-5f));
  ARGUS_ASSIGN_OR_RETURN(c.rope_theta, hp.F32Or("rope.freq_base", 10000.0f));
  if (value_dim != c.head_dim || rope_dims != c.head_dim || c.head_dim % 2 != 0) {
    return Status::Unsupported(file.name() + ": key length " + std::to_string(c.head_dim) +
                               ", value length " + std::to_string(value_dim) + ", RoPE dims " +
                               std::to_string(rope_dims) + " (ARGUS needs them equal and even)");
  }
  if (const GgufValue* scaling = file.Find(hp.Key("rope.scaling.type"))) {
    if (scaling->s != "none") {
      return Status::Unsupported(file.name() + ": RoPE scaling '" + scaling->s + "'");
    }
  }
  ARGUS_RETURN_IF_ERROR(c.geometry().Validate());
  return c;
}

class TensorLoader {
 public:
  // Matrices the product kernels read in another layout (q4_0) are packed into `packed`, on
  // every core of `pool`.
  TensorLoader(const GgufFile& file, uint64_t& weight_bytes, std::vector<AlignedBuffer>& packed,
               ThreadPool& pool)
      : file_(file), weight_bytes_(weight_bytes), packed_(packed), pool_(pool) {}

  const GgufTensor* Find(const std::string& name) const { return file_.FindTensor(name); }

  Result<model::WeightMatrix> Matrix(const std::string& name, uint32_t n_rows,
                                     uint32_t n_cols) const {
    ARGUS_ASSIGN_OR_RETURN(const GgufTensor* t, Get(name));
    ARGUS_ASSIGN_OR_RETURN(model::WeightMatrix m, model::MatrixOf(*t));
    if (m.n_rows != n_rows || m.n_cols != n_cols) {
      return Status::InvalidArgument(file_.name() + ": tensor '" + name + "' is [" +
                                     std::to_string(m.n_rows) + ", " + std::to_string(m.n_cols) +
                                     "], the model's hyperparameters need [" +
                                     std::to_string(n_rows) + ", " + std::to_string(n_cols) + "]");
    }
    weight_bytes_ += t->data.size();
    auto for_matmul = model::PackForMatMul(m, &pool_);
    if (!for_matmul.ok()) return for_matmul.status().WithContext(file_.name() + ": " + name);
    if (for_matmul->storage.size() > 0) {
      packed_.push_back(std::move(for_matmul->storage));
      file_.ReleasePages(t->data);  // the packed copy is what the kernels read
    }
    return for_matmul->matrix;
  }

  // A 1-D F32 tensor of n values, copied (the file's alignment need not suit floats).
  Result<std::vector<float>> Vector(const std::string& name, uint32_t n) const {
    ARGUS_ASSIGN_OR_RETURN(const GgufTensor* t, Get(name));
    if (t->type != GgmlType::kF32 || t->dims.size() != 1 || t->dims[0] != n) {
      return Status::InvalidArgument(file_.name() + ": tensor '" + name + "' must be F32 [" +
                                     std::to_string(n) + "]");
    }
    std::vector<float> v(n);
    std::memcpy(v.data(), t->data.data(), n * sizeof(float));
    weight_bytes_ += t->data.size();
    return v;
  }

 private:
  Result<const GgufTensor*> Get(const std::string& name) const {
    const GgufTensor* t = file_.FindTensor(name);
    if (!t) return Status::NotFound(file_.name() + ": tensor '" + name + "' is missing");
    return t;
  }
  const GgufFile& file_;
  uint64_t& weight_bytes_;
  std::vector<AlignedBuffer>& packed_;
  ThreadPool& pool_;
};

Status LoadWeights(ModelImpl& m) {
  const ModelConfig& c = m.config;
  ThreadPool pool;
  TensorLoader load(*m.file, m.weight_bytes, m.packed_weights, pool);
  const uint32_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  ARGUS_ASSIGN_OR_RETURN(m.token_embd, load.Matrix("token_embd.weight", c.n_vocab, c.n_embd));
  ARGUS_ASSIGN_OR_RETURN(m.output_norm, load.Vector("output_norm.weight", c.n_embd));
  if (load.Find("output.weight")) {
    ARGUS_ASSIGN_OR_RETURN(m.output, load.Matrix("output.weight", c.n_vocab, c.n_embd));
  } else {
    m.output = m.token_embd;
    m.config.tied_output = true;
  }
  if (load.Find("rope_freqs.weight")) {
    ARGUS_ASSIGN_OR_RETURN(m.rope_freq_factors, load.Vector("rope_freqs.weight", c.head_dim / 2));
    m.config.rope_freq_factors = true;
  }
  m.layers.resize(c.n_layers);
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    model::LayerWeights& w = m.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    ARGUS_ASSIGN_OR_RETURN(w.attn_norm, load.Vector(p + "attn_norm.weight", c.n_embd));
    ARGUS_ASSIGN_OR_RETURN(w.q, load.Matrix(p + "attn_q.weight", q_dim, c.n_embd));
    ARGUS_ASSIGN_OR_RETURN(w.k, load.Matrix(p + "attn_k.weight", kv_dim, c.n_embd));
    ARGUS_ASSIGN_OR_RETURN(w.v, load.Matrix(p + "attn_v.weight", kv_dim, c.n_embd));
    ARGUS_ASSIGN_OR_RETURN(w.o, load.Matrix(p + "attn_output.weight", c.n_embd, q_dim));
    ARGUS_ASSIGN_OR_RETURN(w.ffn_norm, load.Vector(p + "ffn_norm.weight", c.n_embd));
    ARGUS_ASSIGN_OR_RETURN(w.gate, load.Matrix(p + "ffn_gate.weight", c.n_ff, c.n_embd));
    ARGUS_ASSIGN_OR_RETURN(w.up, load.Matrix(p + "ffn_up.weight", c.n_ff, c.n_embd));
    ARGUS_ASSIGN_OR_RETURN(w.down, load.Matrix(p + "ffn_down.weight", c.n_embd, c.n_ff));
    if (c.arch == ModelArch::kQwen2) {
      ARGUS_ASSIGN_OR_RETURN(w.q_bias, load.Vector(p + "attn_q.bias", q_dim));
      ARGUS_ASSIGN_OR_RETURN(w.k_bias, load.Vector(p + "attn_k.bias", kv_dim));
      ARGUS_ASSIGN_OR_RETURN(w.v_bias, load.Vector(p + "attn_v.bias", kv_dim));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Model>> Model::Load(const std::string& path) {
  std::unique_ptr<Model> model(new Model());
  Impl& m = *model->impl_;
  ARGUS_ASSIGN_OR_RETURN(m.file, GgufFile::Open(path));
  ARGUS_ASSIGN_OR_RETURN(m.config, ReadConfig(*m.file));
  ARGUS_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::FromGguf(*m.file));
  const GgufTensor* embd = m.file->FindTensor("token_embd.weight");
  if (!embd || embd->dims.size() != 2 || embd->dims[1] > (1u << 24)) {
    return Status::InvalidArgument(path + ": token_embd.weight is missing or not 2-D");
  }
  m.config.n_vocab = static_cast<uint32_t>(embd->dims[1]);
  if (m.tokenizer->n_vocab() != m.config.n_vocab) {
    return Status::InvalidArgument(
        path + ": the tokenizer has " + std::to_string(m.tokenizer->n_vocab()) +
        " tokens, token_embd.weight " + std::to_string(m.config.n_vocab) + " rows");
  }
  ARGUS_RETURN_IF_ERROR(LoadWeights(m));
  return model;
}

}  // namespace argus
