// The options `argus run`, `argus eval` and `argus bench e2e` share: the model file and how its
// KV cache is kept (llama.cpp's spellings where they exist).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "argus/model.h"

namespace argus::cli {

struct ModelOptions {
  std::string model_path;
  uint32_t n_ctx = 0;  // 0: the command's default
  unsigned threads = 0;
  uint32_t n_batch = 64;
  std::string profile = "exact";
  std::string cache_type_k, cache_type_v;  // empty: the profile's
  uint32_t page_tokens = 256;
  size_t ram_budget_bytes = 0;  // 0: what the context needs
  double epsilon = 0;
};

void AddModelOptions(CLI::App& cmd, ModelOptions& o);
std::unique_ptr<Model> LoadModel(const ModelOptions& o);
// InvalidArgument (thrown as CommandError) for a profile this build cannot serve.
ContextOptions ContextOptionsOf(const ModelOptions& o, const Model& model);

}  // namespace argus::cli
