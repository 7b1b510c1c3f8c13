#include "serve/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "serve/sockets.h"

namespace argus::serve {

namespace {

using std::chrono::milliseconds;

// Ids in each API's form: a prefix and 24 random hex digits.
std::string NewId(std::string_view prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += kHex[rng() % 16];
  return id;
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string_view IdPrefix(ApiKind api) {
  switch (api) {
    case ApiKind::kAnthropicMessages:
      return "msg_";
    case ApiKind::kOpenAiChat:
      return "chatcmpl-";
    case ApiKind::kOpenAiCompletion:
      return "cmpl-";
  }
  return "";
}

// The API a path belongs to, for the shape of its errors.
ApiKind ApiOfPath(const std::string& path) {
  if (path.rfind("/v1/messages", 0) == 0) return ApiKind::kAnthropicMessages;
  if (path == "/v1/completions") return ApiKind::kOpenAiCompletion;
  return ApiKind::kOpenAiChat;
}

std::variant<GenerationRequest, ApiError> ParseGeneration(ApiKind api, std::string_view body,
                                                          const ParseLimits& limits) {
  switch (api) {
    case ApiKind::kAnthropicMessages:
      return ParseAnthropicMessages(body, limits);
    case ApiKind::kOpenAiChat:
      return ParseOpenAiChat(body, limits);
    case ApiKind::kOpenAiCompletion:
      return ParseOpenAiCompletion(body, limits);
  }
  return ParseOpenAiCompletion(body, limits);
}

void Send(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  res.set_content(error.body, "application/json");
}

// The events of a streamed response, written as the scheduler produces them.
struct StreamState {
  ApiKind api;
  bool include_usage;
  std::shared_ptr<RequestStream> stream;
  Completion completion;
  bool started = false, finished = false;
};

}  // namespace

struct Server::Impl {
  const Model& model;
  ServerOptions options;
  Scheduler scheduler;
  httplib::Server http;
  std::thread listener;
  uint32_t n_ctx;
  int port = 0;
  std::atomic<bool> stopped{false};

  Impl(const Model& m, BatchContext& context, const ServerOptions& o)
      : model(m), options(o), scheduler(m, context, o.scheduler), n_ctx(context.n_ctx()) {}

  Metrics& metrics() { return scheduler.metrics(); }

  bool Authorised(const httplib::Request& req) const {
    if (options.api_key.empty()) return true;
    if (req.get_header_value("x-api-key") == options.api_key) return true;
    return req.get_header_value("Authorization") == "Bearer " + options.api_key;
  }

  void Overloaded(ApiKind api, httplib::Response& res, std::string_view message) {
    metrics().RequestRefused("overloaded");
    Send(res, MakeError(api, ErrorKind::kOverloaded, message));
    res.set_header("retry-after", std::to_string(options.retry_after.count()));
  }

  ErrorKind KindOf(const Status& status) const {
    switch (status.code()) {
      case StatusCode::kInvalidArgument:
        return ErrorKind::kInvalidRequest;
      case StatusCode::kResourceExhausted:
        return ErrorKind::kOverloaded;
      default:
        return ErrorKind::kInternal;
    }
  }

  // The request's prompt tokens: the chat template over its messages, or the raw prompt.
  std::vector<int32_t> PromptTokens(const GenerationRequest& request) const {
    if (request.api == ApiKind::kOpenAiCompletion) {
      return model.tokenizer().Encode(request.prompt, true, false);
    }
    const std::string text = RenderPrompt(options.chat_template, request.messages);
    return model.tokenizer().Encode(text, true, HasSpecialTokens(options.chat_template));
  }

  // A parsed body, or false (the error sent) when it is bad or names another model.
  bool Accepted(ApiKind api, std::variant<GenerationRequest, ApiError> parsed,
                httplib::Response& res, GenerationRequest& out) {
    if (auto* error = std::get_if<ApiError>(&parsed)) {
      metrics().RequestRefused("invalid");
      Send(res, *error);
      return false;
    }
    out = std::move(std::get<GenerationRequest>(parsed));
    if (out.model != options.model_name) {
      metrics().RequestRefused("model_not_found");
      Send(res, ModelNotFound(api, out.model, options.model_name));
      return false;
    }
    return true;
  }

  ParseLimits Limits() const {
    ParseLimits limits;
    limits.max_tokens_limit = options.max_tokens_limit ? options.max_tokens_limit : n_ctx;
    return limits;
  }

  void Generate(ApiKind api, const httplib::Request& req, httplib::Response& res) {
    metrics().RequestReceived(req.path);
    GenerationRequest request;
    if (!Accepted(api, ParseGeneration(api, req.body, Limits()), res, request)) return;
    Job job;
    job.prompt = PromptTokens(request);
    job.max_tokens = request.max_tokens;
    job.sampler.temperature = request.temperature;
    job.sampler.top_p = request.top_p;
    job.sampler.top_k = request.top_k;
    job.sampler.seed = request.seed.value_or(std::random_device{}());
    job.stop = request.stop;
    const uint32_t n_prompt = static_cast<uint32_t>(job.prompt.size());
    Result<std::shared_ptr<RequestStream>> stream = scheduler.Submit(std::move(job));
    if (!stream.ok()) {
      if (stream.status().code() == StatusCode::kResourceExhausted) {
        return Overloaded(api, res, stream.status().message());
      }
      metrics().RequestRefused("invalid");
      return Send(res, MakeError(api, KindOf(stream.status()), stream.status().message()));
    }
    Completion c;
    c.id = NewId(IdPrefix(api));
    c.model = options.model_name;
    c.created = UnixSeconds();
    c.input_tokens = n_prompt;
    if (request.stream) {
      return Stream(api, request.include_usage, std::move(*stream), std::move(c), res);
    }
    Wait(api, ConnectionSocket(req), **stream, c, res);
  }

  // A non-streamed reply: the whole text once the request ends. A client that leaves before
  // then (its connection `fd` closed) cancels the request.
  void Wait(ApiKind api, int fd, RequestStream& stream, Completion& c, httplib::Response& res) {
    GenerationEvent e;
    while (true) {
      // At least every 20 ms, and at every token: one poll that does not block.
      if (fd >= 0 && !stream.cancelled() && PeerClosed(fd)) stream.Cancel();
      if (!stream.Next(e, milliseconds(20))) continue;  // the scheduler ends every request
      if (e.kind == GenerationEvent::Kind::kText) {
        c.text += e.text;
        continue;
      }
      if (e.kind == GenerationEvent::Kind::kError)
        return Send(res, MakeError(api, e.error, e.message));
      c.stop_reason = e.stop_reason;
      c.stop_sequence = e.stop_sequence;
      c.output_tokens = e.output_tokens;
      res.set_content(CompletionBody(api, c), "application/json");
      return;
    }
  }

  void Stream(ApiKind api, bool include_usage, std::shared_ptr<RequestStream> stream, Completion c,
              httplib::Response& res) {
    auto state = std::make_shared<StreamState>(
        StreamState{api, include_usage, std::move(stream), std::move(c)});
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [state](size_t, httplib::DataSink& sink) { return WriteEvents(*state, sink); },
        [state](bool) {
          if (!state->finished) state->stream->Cancel();  // the client left before the end
        });
  }

  // Writes what the request has produced; false (the connection closes) when the client is gone.
  static bool WriteEvents(StreamState& s, httplib::DataSink& sink) {
    // Nothing to write is not written: a chunk of 0 bytes would end the chunked body.
    const auto write = [&](const std::string& events) {
      if (events.empty() || sink.write(events.data(), events.size())) return true;
      s.stream->Cancel();
      return false;
    };
    if (!s.started) {
      s.started = true;
      return write(StreamStart(s.api, s.completion));
    }
    GenerationEvent e;
    if (!s.stream->Next(e, milliseconds(500))) {
      if (sink.is_writable()) return true;
      s.stream->Cancel();
      return false;
    }
    switch (e.kind) {
      case GenerationEvent::Kind::kText:
        return write(StreamDelta(s.api, s.completion, e.text));
      case GenerationEvent::Kind::kError:
        s.finished = true;
        if (!write(StreamError(s.api, e.error, e.message))) return false;
        break;
      case GenerationEvent::Kind::kDone:
        s.finished = true;
        s.completion.stop_reason = e.stop_reason;
        s.completion.stop_sequence = e.stop_sequence;
        s.completion.output_tokens = e.output_tokens;
        if (!write(StreamEnd(s.api, s.completion, s.include_usage))) return false;
        break;
    }
    sink.done();
    return true;
  }

  void CountTokens(const httplib::Request& req, httplib::Response& res) {
    metrics().RequestReceived(req.path);
    GenerationRequest request;
    if (!Accepted(ApiKind::kAnthropicMessages, ParseAnthropicCountTokens(req.body), res, request)) {
      return;
    }
    res.set_content(CountTokensBody(static_cast<uint32_t>(PromptTokens(request).size())),
                    "application/json");
  }

  void Routes() {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.path == "/health" || Authorised(req))
        return httplib::Server::HandlerResponse::Unhandled;
      metrics().RequestRefused("unauthorised");
      Send(res, MakeError(ApiOfPath(req.path), ErrorKind::kAuthentication,
                          "a valid API key is required (x-api-key or Authorization: Bearer)"));
      return httplib::Server::HandlerResponse::Handled;
    });
    // Errors httplib answers itself (unknown path, body over the limit) in the API's shape.
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const ApiKind api = ApiOfPath(req.path);
      if (res.status == 413) {
        metrics().RequestRefused("too_large");
        Send(res,
             MakeError(api, ErrorKind::kRequestTooLarge,
                       "the body is over " + std::to_string(options.max_body_bytes) + " bytes"));
      } else if (res.status == 404) {
        Send(res, MakeError(api, ErrorKind::kNotFound, "no route " + req.method + " " + req.path));
      } else if (res.status >= 400) {
        Send(res,
             MakeError(api, res.status >= 500 ? ErrorKind::kInternal : ErrorKind::kInvalidRequest,
                       "HTTP " + std::to_string(res.status)));
      }
    });
    http.set_exception_handler(
        [](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
          Send(res, MakeError(ApiOfPath(req.path), ErrorKind::kInternal, "internal error"));
        });
    http.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
      Generate(ApiKind::kAnthropicMessages, req, res);
    });
    http.Post(
        "/v1/messages/count_tokens",
        [this](const httplib::Request& req, httplib::Response& res) { CountTokens(req, res); });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Generate(ApiKind::kOpenAiChat, req, res);
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Generate(ApiKind::kOpenAiCompletion, req, res);
    });
    http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      metrics().RequestReceived(req.path);
      res.set_content(ModelsBody(options.model_name, UnixSeconds()), "application/json");
    });
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics().Render(), "text/plain; version=0.0.4");
    });
  }
};

Server::Server() = default;

Server::~Server() { Stop(milliseconds(0)); }

Result<std::unique_ptr<Server>> Server::Start(const Model& model, BatchContext& context,
                                              const ServerOptions& options) {
  std::unique_ptr<Server> server(new Server());
  server->impl_ = std::make_unique<Impl>(model, context, options);
  Impl& s = *server->impl_;
  s.Routes();
  s.http.set_payload_max_length(options.max_body_bytes);
  s.http.set_read_timeout(options.read_timeout);
  // Each streamed request holds a thread while it streams: room for every slot and the queue.
  const size_t n_threads = options.scheduler.parallel + options.scheduler.queue_limit + 4;
  s.http.new_task_queue = [n_threads] { return new httplib::ThreadPool(n_threads); };
  s.port = options.port == 0
               ? s.http.bind_to_any_port(options.host)
               : (s.http.bind_to_port(options.host, options.port) ? options.port : -1);
  if (s.port < 0) {
    return Status::IOError("cannot listen on " + options.host + ":" + std::to_string(options.port));
  }
  if (!RaiseListenBacklog(s.port)) {
    std::fprintf(stderr, "serve: the listen backlog of port %d stays at cpp-httplib's 5\n", s.port);
  }
  s.listener = std::thread([&s] { s.http.listen_after_bind(); });
  // Until the loop runs, stop() would find nothing to stop and the listener would block for good.
  while (!s.http.is_running()) std::this_thread::sleep_for(milliseconds(1));
  return server;
}

int Server::port() const { return impl_->port; }
Metrics& Server::metrics() { return impl_->metrics(); }

void Server::Stop(milliseconds grace) {
  Impl& s = *impl_;
  if (s.stopped.exchange(true)) return;
  s.scheduler.Drain(grace);
  s.http.stop();
  if (s.listener.joinable()) s.listener.join();
}

}  // namespace argus::serve
