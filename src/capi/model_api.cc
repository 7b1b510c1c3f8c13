// The C API of the model runner: GGUF models, tokenizers, contexts, sampling, generation.
#include <nlohmann/json.hpp>

#include "argus/model.h"
#include "argus/remote.h"
#include "capi/capi_internal.h"
#include "model/matmul.h"

using namespace argus;        // NOLINT: the C API's implementation file
using namespace argus::capi;  // NOLINT

struct argus_model_t {
  static constexpr HandleKind kKind = HandleKind::kModel;
  std::unique_ptr<Model> model;
};

struct argus_context_options_t {
  static constexpr HandleKind kKind = HandleKind::kContextOptions;
  ContextOptions context;  // codecs empty: f16, or the profile's
  std::string disk_dir;
  uint64_t disk_budget_bytes = 0;
  std::string profile;
  std::string remote_url;
  argus_context_options_t() { context.k_codec = context.v_codec = ""; }
};

struct argus_context_t {
  static constexpr HandleKind kKind = HandleKind::kContext;
  const argus_model_t* model = nullptr;
  std::unique_ptr<DiskTier> disk;  // declared first: the context's cache uses it
  std::unique_ptr<RemoteTier> remote;  // used by the context: declared before it
  std::unique_ptr<Context> context;
  uint32_t n_ctx = 0, n_batch = 0;
};

struct argus_sampler_t {
  static constexpr HandleKind kKind = HandleKind::kSampler;
  explicit argus_sampler_t(const SamplerOptions& o) : sampler(o) {}
  Sampler sampler;
};

namespace {

Status CheckModel(const argus_model_t* m, const char* function) {
  return CheckHandle(m, HandleKind::kModel, function);
}

Status CheckContext(const argus_context_t* c, const char* function) {
  ARGUS_RETURN_IF_ERROR(CheckHandle(c, HandleKind::kContext, function));
  if (!IsLive(c->model, HandleKind::kModel)) {
    return Status::InvalidArgument(std::string(function) +
                                   ": the context's model was closed before the context");
  }
  return Status::Ok();
}

Result<const GgufTensor*> TensorOf(const argus_model_t* m, const char* name, const char* function) {
  ARGUS_RETURN_IF_ERROR(CheckModel(m, function));
  if (name == nullptr) return Status::InvalidArgument(std::string(function) + ": name is NULL");
  const GgufTensor* t = m->model->file().FindTensor(name);
  if (t == nullptr) {
    return Status::NotFound(std::string("tensor '") + name + "' is not in " +
                            m->model->file().name());
  }
  return t;
}

// Evaluates `tokens` in chunks of the context's batch size; the last chunk's logits.
Result<std::span<const float>> EvalChunks(argus_context_t* c, std::span<const int32_t> tokens) {
  std::span<const float> logits;
  for (size_t first = 0; first < tokens.size(); first += c->n_batch) {
    const size_t n = std::min<size_t>(c->n_batch, tokens.size() - first);
    ARGUS_ASSIGN_OR_RETURN(logits, c->context->Eval(tokens.subspan(first, n)));
  }
  return logits;
}

}  // namespace

extern "C" {

argus_model_t* argus_model_load(const char* path, char** errptr) {
  return Guard<argus_model_t*>(errptr, nullptr, [&]() -> Result<argus_model_t*> {
    if (path == nullptr) return Status::InvalidArgument("argus_model_load: path is NULL");
    auto m = std::make_unique<argus_model_t>();
    ARGUS_ASSIGN_OR_RETURN(m->model, Model::Load(path));
    return Adopt(std::move(m));
  });
}

void argus_model_close(argus_model_t* m) { DestroyHandle(m); }

char* argus_model_info_json(const argus_model_t* m, char** errptr) {
  return Guard<char*>(errptr, nullptr, [&]() -> Result<char*> {
    ARGUS_RETURN_IF_ERROR(CheckModel(m, "argus_model_info_json"));
    const ModelConfig& c = m->model->config();
    nlohmann::ordered_json j = {{"arch", ModelArchName(c.arch)},
                                {"name", c.name},
                                {"n_layers", c.n_layers},
                                {"n_embd", c.n_embd},
                                {"n_heads", c.n_heads},
                                {"n_kv_heads", c.n_kv_heads},
                                {"head_dim", c.head_dim},
                                {"n_ff", c.n_ff},
                                {"n_vocab", c.n_vocab},
                                {"n_ctx_train", c.n_ctx_train},
                                {"rms_eps", c.rms_eps},
                                {"rope_theta", c.rope_theta},
                                {"rope_neox", c.rope_neox},
                                {"rope_freq_factors", c.rope_freq_factors},
                                {"tied_output", c.tied_output},
                                {"bos", m->model->tokenizer().bos()},
                                {"eos", m->model->tokenizer().eos()},
                                {"fingerprint", m->model->fingerprint()}};
    return OwnedString(j.dump());
  });
}

int32_t* argus_tokenize(const argus_model_t* m, const char* text, size_t text_bytes,
                        int add_special, size_t* n_tokens, char** errptr) {
  if (n_tokens) *n_tokens = 0;
  return Guard<int32_t*>(errptr, nullptr, [&]() -> Result<int32_t*> {
    ARGUS_RETURN_IF_ERROR(CheckModel(m, "argus_tokenize"));
    if (n_tokens == nullptr) return Status::InvalidArgument("argus_tokenize: n_tokens is NULL");
    if (text == nullptr && text_bytes != 0)
      return Status::InvalidArgument("argus_tokenize: text is NULL");
    const std::vector<int32_t> ids =
        m->model->tokenizer().Encode(std::string_view(text ? text : "", text_bytes), add_special);
    if (ids.empty()) return static_cast<int32_t*>(nullptr);
    auto* out = static_cast<int32_t*>(std::malloc(ids.size() * sizeof(int32_t)));
    if (out == nullptr) return Status::ResourceExhausted("out of memory");
    std::copy(ids.begin(), ids.end(), out);
    *n_tokens = ids.size();
    return out;
  });
}

char* argus_detokenize(const argus_model_t* m, const int32_t* tokens, size_t n_tokens,
                       size_t* text_bytes, char** errptr) {
  return Guard<char*>(errptr, nullptr, [&]() -> Result<char*> {
    ARGUS_RETURN_IF_ERROR(CheckModel(m, "argus_detokenize"));
    if (tokens == nullptr && n_tokens != 0)
      return Status::InvalidArgument("argus_detokenize: tokens is NULL");
    const uint32_t n_vocab = m->model->tokenizer().n_vocab();
    for (size_t i = 0; i < n_tokens; ++i) {
      if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= n_vocab) {
        return Status::InvalidArgument("token " + std::to_string(tokens[i]) + " at index " +
                                       std::to_string(i) + " is outside the vocabulary of " +
                                       std::to_string(n_vocab));
      }
    }
    const std::string text = m->model->tokenizer().Decode({tokens, n_tokens});
    if (text_bytes) *text_bytes = text.size();
    return OwnedString(text);
  });
}

size_t argus_model_tensor_count(const argus_model_t* m) {
  return IsLive(m, HandleKind::kModel) ? m->model->file().tensors().size() : 0;
}

const char* argus_model_tensor_name(const argus_model_t* m, size_t index) {
  if (!IsLive(m, HandleKind::kModel) || index >= m->model->file().tensors().size()) return nullptr;
  return m->model->file().tensors()[index].name.c_str();
}

int argus_model_tensor_dims(const argus_model_t* m, const char* name, uint64_t dims[4],
                            char** errptr) {
  return Guard<int>(errptr, -1, [&]() -> Result<int> {
    ARGUS_ASSIGN_OR_RETURN(const GgufTensor* t, TensorOf(m, name, "argus_model_tensor_dims"));
    if (dims == nullptr) return Status::InvalidArgument("argus_model_tensor_dims: dims is NULL");
    if (t->dims.size() > 4) return Status::Unsupported("tensor '" + t->name + "' has over 4 dims");
    std::fill(dims, dims + 4, uint64_t{1});
    std::copy(t->dims.begin(), t->dims.end(), dims);
    return static_cast<int>(t->dims.size());
  });
}

void argus_model_tensor_f32(const argus_model_t* m, const char* name, float* out, uint64_t n_values,
                            char** errptr) {
  GuardVoid(errptr, [&]() -> Status {
    ARGUS_ASSIGN_OR_RETURN(const GgufTensor* t, TensorOf(m, name, "argus_model_tensor_f32"));
    if (out == nullptr) return Status::InvalidArgument("argus_model_tensor_f32: out is NULL");
    if (n_values != t->n_values) {
      return Status::InvalidArgument("tensor '" + t->name + "' has " + std::to_string(t->n_values) +
                                     " values; out holds " + std::to_string(n_values));
    }
    // Any rank as rows of dims[0] values: the view MatrixOf validates.
    GgufTensor rows = *t;
    rows.dims = {t->dims.empty() ? 1 : t->dims[0], t->dims.empty() ? 1 : t->n_rows()};
    ARGUS_ASSIGN_OR_RETURN(model::WeightMatrix w, model::MatrixOf(rows));
    for (uint32_t r = 0; r < w.n_rows; ++r) model::DequantizeRow(w, r, out + size_t{r} * w.n_cols);
    return Status::Ok();
  });
}

argus_context_options_t* argus_context_options_create(void) {
  return CreateHandle<argus_context_options_t>();
}

void argus_context_options_destroy(argus_context_options_t* o) { DestroyHandle(o); }

void argus_context_options_set_n_ctx(argus_context_options_t* o, uint32_t n_ctx) {
  SetOption(o, [&](auto& x) { x.context.n_ctx = n_ctx; });
}

void argus_context_options_set_threads(argus_context_options_t* o, uint32_t n_threads) {
  SetOption(o, [&](auto& x) { x.context.n_threads = n_threads; });
}

void argus_context_options_set_batch(argus_context_options_t* o, uint32_t n_batch) {
  SetOption(o, [&](auto& x) { x.context.n_batch = n_batch; });
}

void argus_context_options_set_codecs(argus_context_options_t* o, const char* k_codec,
                                      const char* v_codec) {
  SetOption(o, [&](auto& x) {
    if (k_codec) x.context.k_codec = k_codec;
    if (v_codec) x.context.v_codec = v_codec;
  });
}

void argus_context_options_set_page_tokens(argus_context_options_t* o, uint32_t page_tokens) {
  SetOption(o, [&](auto& x) { x.context.page_tokens = page_tokens; });
}

void argus_context_options_set_ram_budget(argus_context_options_t* o, uint64_t bytes) {
  SetOption(o, [&](auto& x) { x.context.ram_budget_bytes = bytes; });
}

void argus_context_options_set_attention(argus_context_options_t* o, uint32_t window,
                                         uint32_t sinks, double epsilon) {
  SetOption(o, [&](auto& x) {
    x.context.attention.window = window;
    x.context.attention.sinks = sinks;
    x.context.attention.epsilon = epsilon;
  });
}

void argus_context_options_set_disk(argus_context_options_t* o, const char* dir,
                                    uint64_t budget_bytes) {
  SetOption(o, [&](auto& x) {
    x.disk_dir = dir ? dir : "";
    x.disk_budget_bytes = budget_bytes;
  });
}

void argus_context_options_set_profile(argus_context_options_t* o, const char* profile) {
  SetOption(o, [&](auto& x) { x.profile = profile ? profile : ""; });
}

void argus_context_options_set_remote(argus_context_options_t* o, const char* url) {
  SetOption(o, [&](auto& x) { x.remote_url = url ? url : ""; });
}

argus_context_t* argus_context_create(const argus_model_t* m, const argus_context_options_t* o,
                                      char** errptr) {
  return Guard<argus_context_t*>(errptr, nullptr, [&]() -> Result<argus_context_t*> {
    ARGUS_RETURN_IF_ERROR(CheckModel(m, "argus_context_create"));
    ARGUS_RETURN_IF_ERROR(CheckHandle(o, HandleKind::kContextOptions, "argus_context_create"));
    ARGUS_RETURN_IF_ERROR(CheckThreadCount(o->context.n_threads, "argus_context_create"));
    ContextOptions options = o->context;
    ARGUS_ASSIGN_OR_RETURN(
        PlacementChoice choice,
        ChoosePlacement(o->profile, options.k_codec, options.v_codec, !o->disk_dir.empty()));
    options.k_codec = choice.k_codec;
    options.v_codec = choice.v_codec;
    if (options.n_ctx == 0) options.n_ctx = m->model->config().n_ctx_train;
    if (options.n_batch == 0) return Status::InvalidArgument("the batch size must be at least 1");
    if (choice.placement) {
      if (options.attention.epsilon != 0)
        choice.placement->profile.epsilon = options.attention.epsilon;
      options.attention = {};
      options.placement = std::move(choice.placement);
    }
    auto c = std::make_unique<argus_context_t>();
    c->model = m;
    ARGUS_ASSIGN_OR_RETURN(c->disk, OpenDisk(o->disk_dir, o->disk_budget_bytes));
    options.disk = c->disk.get();
    if (!o->remote_url.empty()) {
      if (c->disk == nullptr) {
        return Status::InvalidArgument(
            "argus_context_create: a remote tier needs a disk tier (argus_context_options_set_disk)");
      }
      RemoteTierOptions remote;
      remote.url = o->remote_url;
      ARGUS_ASSIGN_OR_RETURN(c->remote, RemoteTier::Open(remote));
      options.remote = c->remote.get();
    }
    ARGUS_ASSIGN_OR_RETURN(c->context, Context::Create(*m->model, options));
    c->n_ctx = options.n_ctx;
    c->n_batch = options.n_batch;
    return Adopt(std::move(c));
  });
}

void argus_context_close(argus_context_t* c) { DestroyHandle(c); }

const float* argus_context_eval(argus_context_t* c, const int32_t* tokens, size_t n_tokens,
                                int all_logits, char** errptr) {
  return Guard<const float*>(errptr, nullptr, [&]() -> Result<const float*> {
    ARGUS_RETURN_IF_ERROR(CheckContext(c, "argus_context_eval"));
    if (tokens == nullptr || n_tokens == 0)
      return Status::InvalidArgument("argus_context_eval: no tokens");
    ARGUS_ASSIGN_OR_RETURN(std::span<const float> logits,
                           c->context->Eval({tokens, n_tokens}, all_logits != 0));
    return logits.data();
  });
}

uint32_t argus_context_n_past(const argus_context_t* c) {
  return IsLive(c, HandleKind::kContext) ? c->context->n_past() : 0;
}

void argus_context_truncate(argus_context_t* c, uint32_t n_tokens, char** errptr) {
  GuardVoid(errptr, [&]() -> Status {
    ARGUS_RETURN_IF_ERROR(CheckContext(c, "argus_context_truncate"));
    if (n_tokens > c->context->n_past()) {
      return Status::InvalidArgument("argus_context_truncate: " + std::to_string(n_tokens) +
                                     " tokens asked, the context holds " +
                                     std::to_string(c->context->n_past()));
    }
    return c->context->Truncate(n_tokens);
  });
}

int64_t argus_context_load_prefix(argus_context_t* c, const int32_t* tokens, size_t n_tokens,
                                  char** errptr) {
  return Guard<int64_t>(errptr, -1, [&]() -> Result<int64_t> {
    ARGUS_RETURN_IF_ERROR(CheckContext(c, "argus_context_load_prefix"));
    if (tokens == nullptr && n_tokens != 0)
      return Status::InvalidArgument("argus_context_load_prefix: tokens is NULL");
    ARGUS_ASSIGN_OR_RETURN(uint32_t n, c->context->LoadPrefix({tokens, n_tokens}));
    return int64_t{n};
  });
}

int64_t argus_context_store_prefix(argus_context_t* c, const int32_t* tokens, size_t n_tokens,
                                   char** errptr) {
  return Guard<int64_t>(errptr, -1, [&]() -> Result<int64_t> {
    ARGUS_RETURN_IF_ERROR(CheckContext(c, "argus_context_store_prefix"));
    if (tokens == nullptr && n_tokens != 0)
      return Status::InvalidArgument("argus_context_store_prefix: tokens is NULL");
    PrefixStoreStats stats;
    ARGUS_RETURN_IF_ERROR(c->context->StorePrefix({tokens, n_tokens}, stats));
    return static_cast<int64_t>(stats.n_stored);
  });
}

char* argus_context_stats_json(const argus_context_t* c, char** errptr) {
  return Guard<char*>(errptr, nullptr, [&]() -> Result<char*> {
    ARGUS_RETURN_IF_ERROR(CheckContext(c, "argus_context_stats_json"));
    std::string json = StatsJson(c->context->cache().stats(), c->context->placement_stats());
    if (c->remote != nullptr) {
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(json);
      const RemoteTierStats s = c->remote->stats();
      const RemotePrefixStats& p = c->context->remote_prefix_stats();
      j["remote"] = {{"url", c->remote->name()},      {"n_tokens_loaded", p.n_tokens_loaded},
                     {"n_pages_fetched", p.n_pages_fetched}, {"n_pages_stored", p.n_pages_stored},
                     {"n_hits", s.n_hits},             {"n_misses", s.n_misses},
                     {"n_damaged", s.n_damaged},       {"n_round_trips", s.n_round_trips},
                     {"read_bytes", s.read_bytes},     {"written_bytes", s.written_bytes},
                     {"n_errors", s.n_errors}};
      json = j.dump();
    }
    return OwnedString(json);
  });
}

argus_sampler_t* argus_sampler_create(float temperature, uint32_t top_k, float top_p, uint64_t seed,
                                      char** errptr) {
  return Guard<argus_sampler_t*>(errptr, nullptr, [&]() -> Result<argus_sampler_t*> {
    if (!(temperature >= 0) || !std::isfinite(temperature)) {
      return Status::InvalidArgument("temperature must be finite and >= 0, got " +
                                     std::to_string(temperature));
    }
    if (!(top_p > 0 && top_p <= 1)) {
      return Status::InvalidArgument("top_p must be in (0, 1], got " + std::to_string(top_p));
    }
    SamplerOptions options;
    options.temperature = temperature;
    options.top_k = top_k;
    options.top_p = top_p;
    options.seed = seed;
    return Adopt(std::make_unique<argus_sampler_t>(options));
  });
}

void argus_sampler_destroy(argus_sampler_t* s) { DestroyHandle(s); }

int32_t argus_sampler_sample(argus_sampler_t* s, const float* logits, size_t n_vocab,
                             char** errptr) {
  return Guard<int32_t>(errptr, -1, [&]() -> Result<int32_t> {
    ARGUS_RETURN_IF_ERROR(CheckHandle(s, HandleKind::kSampler, "argus_sampler_sample"));
    if (logits == nullptr || n_vocab == 0)
      return Status::InvalidArgument("argus_sampler_sample: no logits");
    if (n_vocab > size_t{INT32_MAX})
      return Status::InvalidArgument("argus_sampler_sample: n_vocab is more than token ids hold");
    return s->sampler.Sample({logits, n_vocab});
  });
}

char* argus_generate(argus_context_t* c, const char* prompt, uint32_t n_predict, argus_sampler_t* s,
                     char** errptr) {
  return Guard<char*>(errptr, nullptr, [&]() -> Result<char*> {
    ARGUS_RETURN_IF_ERROR(CheckContext(c, "argus_generate"));
    ARGUS_RETURN_IF_ERROR(CheckHandle(s, HandleKind::kSampler, "argus_generate"));
    if (prompt == nullptr) return Status::InvalidArgument("argus_generate: prompt is NULL");
    const Tokenizer& tokenizer = c->model->model->tokenizer();
    const std::vector<int32_t> tokens = tokenizer.Encode(prompt, true);
    if (tokens.empty()) return Status::InvalidArgument("argus_generate: the prompt has no tokens");
    ARGUS_ASSIGN_OR_RETURN(std::span<const float> logits, EvalChunks(c, tokens));
    std::string text;
    int32_t token = s->sampler.Sample(logits);
    for (uint32_t n = 0; n < n_predict && !tokenizer.IsEndOfGeneration(token); ++n) {
      text += tokenizer.TokenToPiece(token);
      if (n + 1 == n_predict || c->context->n_past() == c->n_ctx) break;
      ARGUS_ASSIGN_OR_RETURN(logits, c->context->Eval({&token, 1}));
      token = s->sampler.Sample(logits);
    }
    return OwnedString(text);
  });
}

}  // extern "C"
