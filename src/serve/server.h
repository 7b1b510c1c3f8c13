// argus serve's HTTP server: the routes of the Anthropic Messages and OpenAI-compatible APIs,
// health and metrics, on cpp-httplib, over one Scheduler and the BatchContext it drives.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "argus/model.h"
#include "serve/api.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"

namespace argus::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;         // 0: any free port (see Server::port)
  std::string api_key;     // empty: no key asked
  std::string model_name;  // what requests must name, and /v1/models lists
  ChatTemplate chat_template = ChatTemplate::kNone;
  uint32_t max_tokens_limit = 0;  // 0: the context size
  size_t max_body_bytes = size_t{8} << 20;
  // A client that sends nothing for this long is dropped (slow clients hold a thread each).
  std::chrono::seconds read_timeout{10};
  std::chrono::seconds retry_after{1};  // the retry-after header of overloaded replies
  SchedulerOptions scheduler;
};

class Server {
 public:
  // Listening when it returns. InvalidArgument or Unavailable naming the address when it cannot
  // bind.
  static Result<std::unique_ptr<Server>> Start(const Model& model, BatchContext& context,
                                               const ServerOptions& options);
  ~Server();  // Stop with no grace

  int port() const;
  Metrics& metrics();
  // Stops accepting requests, lets those in flight finish for up to `grace`, cancels the rest,
  // and closes the listening socket.
  void Stop(std::chrono::milliseconds grace);

 private:
  Server();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace argus::serve
