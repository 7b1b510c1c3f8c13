// The options `argus run`, `argus eval` and `argus-bench e2e` share: the model file and how its
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
  std::string cache_type_active = "f16";   // the partly filled page: f16 or f32
  uint32_t page_tokens = 256;
  size_t ram_budget_bytes = 0;  // 0: what the context needs
  double epsilon = 0;
  std::string disk_dir;          // empty: no disk tier of its own
  size_t disk_budget_bytes = 0;  // 0: 8 GiB (0 also tells that --disk-budget was not given)

  size_t DiskBudget() const { return disk_budget_bytes ? disk_budget_bytes : size_t{8} << 30; }
};

void AddModelOptions(CLI::App& cmd, ModelOptions& o);
std::unique_ptr<Model> LoadModel(const ModelOptions& o);
// The disk tier in `dir` (created if missing); nullptr for an empty dir.
std::unique_ptr<DiskTier> OpenDiskTier(const std::string& dir, size_t budget_bytes);
// The prompt cache's store in `dir`, or nullptr with a warning on stderr when it cannot serve:
// a cache never fails a run. A store whose journal is damaged is moved aside (DIR.damaged-N,
// kept for inspection) and an empty one started; a store in use by another process, a
// directory that cannot be written or created runs without the cache. Messages begin with
// `command`.
std::unique_ptr<DiskTier> OpenPromptCache(const std::string& dir, size_t budget_bytes,
                                          std::string_view command);
// The placement engine keeps masters and disk states in the prompt cache's store and erases
// them when the context ends: each run appends their records even when it stores no page. A
// journal holding over twice the records of its live pages is rewritten, so it stays bounded.
// Call once the context is gone.
void CompactPromptCache(DiskTier& store, std::string_view command);
// The context's options. A profile other than `exact`, or a --disk-dir, puts a placement engine
// over the cache (migrations in the background when `background`); `disk` is the store it may
// use. InvalidArgument (thrown as CommandError) for options that contradict each other.
ContextOptions ContextOptionsOf(const ModelOptions& o, const Model& model, DiskTier* disk,
                                bool background);
// The placement engine's statistics at the end of a run, to stderr.
void PrintPlacementStats(const PlacementStats& s, uint64_t n_tokens);

}  // namespace argus::cli
