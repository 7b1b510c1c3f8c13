// --remote: the remote tier (Redis) of prefix pages below a command's local disk tier.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "argus/model.h"
#include "argus/remote.h"

namespace argus::cli {

struct RemoteOptions {
  std::string url;  // empty: no remote tier
  double timeout_s = 1.0;
};

void AddRemoteOptions(CLI::App& cmd, RemoteOptions& o);
// nullptr without --remote. A malformed URL (or rediss://) is a CommandError; a server that
// cannot be reached is not: the run goes on without it, warned once on stderr as `command`.
std::unique_ptr<RemoteTier> OpenRemoteTier(const RemoteOptions& o, const std::string& command);
// One line to stderr: tokens reused from the remote tier, pages moved, round trips, bytes.
void PrintRemoteStats(const RemoteTier& remote, const RemotePrefixStats& prefix,
                      size_t n_prompt_tokens);

}  // namespace argus::cli
