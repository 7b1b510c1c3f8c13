#include "serve/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace argus::serve {

namespace {

constexpr std::chrono::seconds kRateWindow{10};

void Count(std::vector<std::pair<std::string, uint64_t>>& counts, std::string_view key) {
  auto it =
      std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == key; });
  if (it == counts.end()) {
    counts.emplace_back(std::string(key), 1);
  } else {
    ++it->second;
  }
}

std::string Number(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", value);
  return buffer;
}

// "# HELP", "# TYPE" and the samples of one metric family.
struct Family {
  std::string& out;
  Family(std::string& o, const std::string& name, const char* type, const char* help) : out(o) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void Sample(const std::string& name, const std::string& labels, double value) {
    out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + Number(value) + "\n";
  }
};

// A metric of one sample without labels.
void Scalar(std::string& out, const std::string& name, const char* type, const char* help,
            double value) {
  Family(out, name, type, help).Sample(name, "", value);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                       bounds_.begin());
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, std::string& out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const double le = i < bounds_.size() ? bounds_[i] : INFINITY;
    out += name + "_bucket{le=\"" + Number(le) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum " + Number(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}) {}

void Metrics::RequestReceived(std::string_view route) {
  std::lock_guard lock(mutex_);
  Count(requests_, route);
}

void Metrics::RequestRefused(std::string_view reason) {
  std::lock_guard lock(mutex_);
  Count(refused_, reason);
}

void Metrics::SetQueue(size_t in_flight, size_t queued) {
  std::lock_guard lock(mutex_);
  in_flight_ = in_flight;
  queued_ = queued;
}

void Metrics::PromptDone(uint32_t prompt_tokens, double time_to_first_token_s) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += prompt_tokens;
  ttft_.Observe(time_to_first_token_s);
}

void Metrics::PrefixReused(uint32_t tokens, size_t pages) {
  std::lock_guard lock(mutex_);
  reused_tokens_ += tokens;
  reused_pages_ += pages;
}

void Metrics::PromptCacheLoaded(uint32_t tokens, size_t pages) {
  std::lock_guard lock(mutex_);
  cache_loaded_tokens_ += tokens;
  cache_loaded_pages_ += pages;
}

void Metrics::PromptCacheStored(size_t pages) {
  std::lock_guard lock(mutex_);
  cache_stored_pages_ += pages;
}

void Metrics::PromptCacheFailed() {
  std::lock_guard lock(mutex_);
  ++cache_failures_;
}

void Metrics::TokenGenerated(double time_per_output_token_s) {
  std::lock_guard lock(mutex_);
  ++generated_tokens_;
  if (time_per_output_token_s > 0) tpot_.Observe(time_per_output_token_s);
  const Clock::time_point now = Clock::now();
  recent_tokens_.push_back(now);
  while (!recent_tokens_.empty() && now - recent_tokens_.front() > kRateWindow) {
    recent_tokens_.pop_front();
  }
}

double Metrics::MeanStepRows() const {
  std::lock_guard lock(mutex_);
  return steps_ == 0 ? 0.0 : static_cast<double>(step_rows_) / static_cast<double>(steps_);
}

void Metrics::StepDone(uint32_t rows, double seconds) {
  std::lock_guard lock(mutex_);
  ++steps_;
  step_rows_ += rows;
  step_seconds_ += seconds;
}

void Metrics::SetCache(const CacheStats& stats) {
  std::lock_guard lock(mutex_);
  cache_ = stats;
}

void Metrics::SetPlacement(const PlacementStats& stats) {
  std::lock_guard lock(mutex_);
  placement_ = stats;
}

std::string Metrics::Render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  {
    Family f(out, "argus_requests_total", "counter", "Requests received, by route.");
    for (const auto& [route, n] : requests_)
      f.Sample("argus_requests_total", "route=\"" + route + "\"", n);
  }
  {
    Family f(out, "argus_requests_refused_total", "counter", "Requests refused, by reason.");
    for (const auto& [reason, n] : refused_) {
      f.Sample("argus_requests_refused_total", "reason=\"" + reason + "\"", n);
    }
  }
  Scalar(out, "argus_requests_in_flight", "gauge", "Requests generating now.", in_flight_);
  Scalar(out, "argus_requests_queued", "gauge", "Requests waiting for a slot.", queued_);
  Scalar(out, "argus_prompt_tokens_total", "counter", "Prompt tokens of started requests.",
         prompt_tokens_);
  Scalar(out, "argus_prefix_tokens_reused_total", "counter",
         "Prompt tokens served from shared prefix pages instead of evaluated.", reused_tokens_);
  Scalar(out, "argus_prefix_pages_reused_total", "counter",
         "Prefix pages (page index and layer) shared with another sequence.", reused_pages_);
  Scalar(out, "argus_prompt_cache_tokens_loaded_total", "counter",
         "Prompt tokens loaded from the prompt cache on disk instead of evaluated.",
         cache_loaded_tokens_);
  Scalar(out, "argus_prompt_cache_pages_loaded_total", "counter",
         "Prefix pages (page index and layer) loaded from the prompt cache.", cache_loaded_pages_);
  Scalar(out, "argus_prompt_cache_pages_stored_total", "counter",
         "Prefix pages (page index and layer) written to the prompt cache.", cache_stored_pages_);
  Scalar(out, "argus_prompt_cache_failures_total", "counter",
         "Prompt cache loads and stores that failed; their requests went on without it.",
         cache_failures_);
  Scalar(out, "argus_generated_tokens_total", "counter", "Tokens generated.", generated_tokens_);
  Scalar(out, "argus_generated_tokens_per_second", "gauge",
         "Tokens generated per second over the last 10 seconds.",
         static_cast<double>(recent_tokens_.size()) / kRateWindow.count());
  Scalar(out, "argus_steps_total", "counter", "Forward passes (batched steps).", steps_);
  Scalar(out, "argus_step_rows_total", "counter", "Token rows evaluated by all steps.", step_rows_);
  Scalar(out, "argus_step_seconds_total", "counter", "Time spent in steps.", step_seconds_);
  {
    Family f(out, "argus_kv_bytes", "gauge", "KV page bytes by codec, K or V, and tier.");
    for (const CodecBytes& c : cache_.by_codec) {
      const std::string codec = "codec=\"" + c.codec + "\",part=";
      f.Sample("argus_kv_bytes", codec + "\"k\",tier=\"ram\"", c.k_bytes - c.k_disk_bytes);
      f.Sample("argus_kv_bytes", codec + "\"v\",tier=\"ram\"", c.v_bytes - c.v_disk_bytes);
      if (c.k_disk_bytes + c.v_disk_bytes == 0) continue;
      f.Sample("argus_kv_bytes", codec + "\"k\",tier=\"disk\"", c.k_disk_bytes);
      f.Sample("argus_kv_bytes", codec + "\"v\",tier=\"disk\"", c.v_disk_bytes);
    }
  }
  {
    Family f(out, "argus_kv_pages", "gauge", "Live KV pages by state.");
    f.Sample("argus_kv_pages", "state=\"full\"", cache_.n_full_pages);
    f.Sample("argus_kv_pages", "state=\"active\"", cache_.n_active_pages);
  }
  Scalar(out, "argus_kv_ram_used_bytes", "gauge", "RAM the KV pages use.", cache_.ram.used_bytes);
  Scalar(out, "argus_kv_ram_budget_bytes", "gauge", "The KV RAM budget.", cache_.ram.budget_bytes);
  Scalar(out, "argus_kv_sequences", "gauge", "Sequences in the KV cache (live and retained).",
         cache_.n_sequences);
  if (placement_) {
    const PlacementStats& p = *placement_;
    {
      Family f(out, "argus_kv_ladder_pages", "gauge",
               "Full pages the placement engine places, by ladder state (K/V codecs, or disk).");
      for (size_t i = 0; i < p.pages_per_state.size() && i < p.state_names.size(); ++i) {
        f.Sample("argus_kv_ladder_pages", "state=\"" + p.state_names[i] + "\"",
                 p.pages_per_state[i]);
      }
    }
    Scalar(out, "argus_kv_placement_active", "gauge",
           "Whether the placement ladder is active (1) or every page stays as it fills (0).",
           p.active ? 1 : 0);
    Scalar(out, "argus_kv_demotions_total", "counter", "Pages moved down the ladder.",
           p.n_demotions);
    Scalar(out, "argus_kv_promotions_total", "counter", "Pages moved up the ladder.",
           p.n_promotions);
    Scalar(out, "argus_kv_disk_used_bytes", "gauge",
           "Disk tier bytes in use: pages on disk and exact masters.", p.disk_used_bytes);
    Scalar(out, "argus_kv_master_bytes_written_total", "counter",
           "Exact master copies written to the disk tier.", p.master_bytes_written);
    Scalar(out, "argus_kv_disk_bytes_read_total", "counter",
           "Bytes read from the disk tier by attention and promotions.",
           p.attention_disk_bytes_read + p.promoted_bytes_read);
  }
  Family(out, "argus_time_to_first_token_seconds", "histogram",
         "From a request's arrival to its first token.");
  ttft_.Render("argus_time_to_first_token_seconds", out);
  Family(out, "argus_time_per_output_token_seconds", "histogram",
         "Between a request's consecutive tokens.");
  tpot_.Render("argus_time_per_output_token_seconds", out);
  return out;
}

}  // namespace argus::serve
