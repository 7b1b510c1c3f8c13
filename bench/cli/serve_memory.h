// argus-bench serve --memory: argus serve under memory pressure. Many long conversations at once
// under a RAM budget that is a fraction of their exact KV; the placement engine demotes and
// spills pages so that every one completes. Reports completion, the KV bytes per codec and tier
// and the pages per ladder state at the end, and the engine's migrations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace argus::cli {

struct ServeMemoryOptions {
  std::string model_path, json_path;
  uint32_t conversations = 32;
  uint32_t conversation_tokens = 8192;  // prompt and generated tokens of each
  uint32_t max_tokens = 16;             // of which generated
  double ram_fraction = 0.25;           // the RAM budget over the conversations' exact KV
  std::string profile = "exact";        // a built-in name or a JSON file
  std::string disk_dir;                 // the disk tier (a temporary directory when empty)
  size_t disk_budget_bytes = size_t{8} << 30;
  uint32_t page_tokens = 256;
  uint32_t prefill_chunk = 64;
  unsigned threads = 0;
};

// Runs the scenario, prints its summary and writes its JSON report when json_path is set.
// Throws CommandError when a conversation does not complete.
void RunServeMemoryBench(const ServeMemoryOptions& o);

}  // namespace argus::cli
