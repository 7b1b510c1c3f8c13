// Stock llama.cpp programs (../shared/peers: llama-server, depthbench) run beside ARGUS on the
// same file, so that a benchmark reports both from one run.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "argus/status.h"

namespace argus::cli {

// The peer program `name`: `given` when not empty (an error when it is not an executable file),
// else $ARGUS_PEERS_DIR/bin/name, ../shared/peers/bin/name from the working directory, or
// shared/peers/bin/name three levels above this executable (build/release/argus-bench). "" when
// none is found.
Result<std::string> FindPeer(const std::string& name, const std::string& given);

// Runs `program` with `args` to its end and returns what it printed on stdout; an error naming the
// program, its exit status and the last line of its stderr when it fails.
Result<std::string> RunPeer(const std::string& program, const std::vector<std::string>& args);

// A loopback TCP port free at the time of the call.
Result<int> FreeLoopbackPort();

// A llama-server process on 127.0.0.1:port, stopped (SIGTERM, then SIGKILL after 5 s) when the
// object is destroyed. Its output goes to `log_path`.
class PeerServer {
 public:
  // Starts `program` with `args` and waits until GET /health answers 200 (the model loaded).
  static Result<std::unique_ptr<PeerServer>> Start(const std::string& program,
                                                   const std::vector<std::string>& args, int port,
                                                   const std::string& log_path);
  ~PeerServer();
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;

  int port() const { return port_; }

 private:
  PeerServer(pid_t pid, int port) : pid_(pid), port_(port) {}
  pid_t pid_;
  int port_;
};

}  // namespace argus::cli
