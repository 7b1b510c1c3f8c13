#include "cli/remote_options.h"

#include <fmt/core.h>

#include "cli/commands.h"

namespace argus::cli {

void AddRemoteOptions(CLI::App& cmd, RemoteOptions& o) {
  cmd.add_option("--remote", o.url,
                 "Share prefix pages through Redis below the local --prompt-cache: "
                 "redis://HOST:PORT[/DB] (password: ARGUS_REDIS_PASSWORD)");
  cmd.add_option("--remote-timeout", o.timeout_s, "Seconds a Redis call may take before a miss")
      ->capture_default_str();
}

std::unique_ptr<RemoteTier> OpenRemoteTier(const RemoteOptions& o, const std::string& command) {
  if (o.url.empty()) return nullptr;
  RemoteTierOptions options;
  options.url = o.url;
  options.timeout_s = o.timeout_s;
  options.on_warning = [command](const Status& s) {
    fmt::print(stderr, "{}: {}\n", command, s.ToString());
  };
  return ValueOrThrow(RemoteTier::Open(options));
}

void PrintRemoteStats(const RemoteTier& remote, const RemotePrefixStats& prefix,
                      size_t n_prompt_tokens) {
  const RemoteTierStats s = remote.stats();
  fmt::print(stderr,
             "remote tier: {} of {} prompt tokens from {} ({} pages fetched, {} stored); {} round "
             "trips, {} bytes read, {} bytes written; {} hits, {} misses, {} damaged, {} errors\n",
             prefix.n_tokens_loaded, n_prompt_tokens, remote.name(), prefix.n_pages_fetched,
             prefix.n_pages_stored, s.n_round_trips, s.read_bytes, s.written_bytes, s.n_hits,
             s.n_misses, s.n_damaged, s.n_errors);
}

}  // namespace argus::cli
