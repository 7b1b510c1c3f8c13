// The server's counters, gauges and latency histograms, updated by the scheduler and the routes
// and rendered for GET /metrics in the Prometheus text format (version 0.0.4).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "argus/cache.h"
#include "argus/policy.h"

namespace argus::serve {

// Cumulative buckets as Prometheus histograms have them.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  // Lines "<name>_bucket{le=...} n", "<name>_sum", "<name>_count".
  void Render(const std::string& name, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();

  void RequestReceived(std::string_view route);
  void RequestRefused(std::string_view reason);  // overloaded, invalid, unauthorised, ...
  void SetQueue(size_t in_flight, size_t queued);
  void PromptDone(uint32_t prompt_tokens, double time_to_first_token_s);
  void PrefixReused(uint32_t tokens, size_t pages);
  // The prompt cache (--prompt-cache): prefix tokens and pages loaded from it, pages stored in
  // it, and loads or stores that failed (the request evaluated or went on without it).
  void PromptCacheLoaded(uint32_t tokens, size_t pages);
  void PromptCacheStored(size_t pages);
  void PromptCacheFailed();
  void TokenGenerated(double time_per_output_token_s);  // the gap since the request's last token
  void StepDone(uint32_t rows, double seconds);
  void SetCache(const CacheStats& stats);
  // The placement engine's statistics, with the cache's, when it runs one.
  void SetPlacement(const PlacementStats& stats);

  std::string Render() const;
  double MeanStepRows() const;  // rows per forward pass so far (0 before the first step)

 private:
  using Clock = std::chrono::steady_clock;
  mutable std::mutex mutex_;
  std::vector<std::pair<std::string, uint64_t>> requests_, refused_;  // by route, by reason
  size_t in_flight_ = 0, queued_ = 0;
  uint64_t prompt_tokens_ = 0, reused_tokens_ = 0, reused_pages_ = 0, generated_tokens_ = 0;
  uint64_t cache_loaded_tokens_ = 0, cache_loaded_pages_ = 0, cache_stored_pages_ = 0;
  uint64_t cache_failures_ = 0;
  uint64_t steps_ = 0, step_rows_ = 0;
  double step_seconds_ = 0;
  std::deque<Clock::time_point> recent_tokens_;  // the last 10 s: tokens per second
  Histogram ttft_, tpot_;
  CacheStats cache_;
  std::optional<PlacementStats> placement_;
};

}  // namespace argus::serve
