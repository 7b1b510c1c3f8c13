#include "cli/model_options.h"

#include <fmt/core.h>

#include "cli/commands.h"

namespace argus::cli {

void AddModelOptions(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("-m,--model", o.model_path, "GGUF model file")
      ->required()
      ->check(CLI::ExistingFile);
  cmd.add_option("-c,--ctx-size", o.n_ctx, "Context size in tokens (0: the command's default)")
      ->capture_default_str();
  cmd.add_option("-t,--threads", o.threads, "Threads (0: one per hardware thread)")
      ->capture_default_str();
  cmd.add_option("-b,--batch-size", o.n_batch, "Prompt tokens evaluated together")
      ->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  cmd.add_option("--profile", o.profile,
                 "KV placement profile (this build: exact; the ladders come with the placement "
                 "engine)")
      ->capture_default_str();
  cmd.add_option("--cache-type-k", o.cache_type_k, "Codec spec of full K pages (default f16)");
  cmd.add_option("--cache-type-v", o.cache_type_v, "Codec spec of full V pages (default f16)");
  cmd.add_option("--page-tokens", o.page_tokens, "Tokens per KV page (a power of two)")
      ->capture_default_str();
  cmd.add_option("--ram-budget", o.ram_budget_bytes,
                 "RAM budget of the KV cache, e.g. 512M, 2G (0: what the context needs)")
      ->transform(CLI::AsSizeValue(false));
  cmd.add_option("--epsilon", o.epsilon,
                 "Certified page skipping: skipped attention mass at most this (0: exact)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
}

std::unique_ptr<Model> LoadModel(const ModelOptions& o) {
  std::unique_ptr<Model> model = ValueOrThrow(Model::Load(o.model_path));
  fmt::print(stderr, "model: {} ({:.1f} MiB of weights)\n", model->config().ToString(),
             model->weight_bytes() / 1048576.0);
  return model;
}

ContextOptions ContextOptionsOf(const ModelOptions& o, const Model& model) {
  if (o.profile != "exact") {
    throw CommandError{Status::Unsupported(
        "profile '" + o.profile +
        "' needs the placement engine, which this build does not have yet; use --profile exact "
        "with --cache-type-k/--cache-type-v to choose codecs")};
  }
  ContextOptions c;
  c.n_ctx = o.n_ctx ? o.n_ctx : model.config().n_ctx_train;
  c.n_threads = o.threads;
  c.n_batch = o.n_batch;
  c.k_codec = o.cache_type_k.empty() ? "f16" : o.cache_type_k;
  c.v_codec = o.cache_type_v.empty() ? "f16" : o.cache_type_v;
  c.page_tokens = o.page_tokens;
  c.ram_budget_bytes = o.ram_budget_bytes;
  c.attention.epsilon = o.epsilon;
  return c;
}

}  // namespace argus::cli
