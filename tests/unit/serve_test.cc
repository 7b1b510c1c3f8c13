// argus serve over a real HTTP client on loopback, with stories260K at temperature 0: what
// /v1/messages returns equals what `argus run` prints; streamed deltas equal the whole text;
// concurrent requests each get their solo output, with shared prefixes too; a client that leaves
// mid-stream frees its pages; bad requests get the API's errors and the server stays up.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "argus/model.h"
#include "cli_run.h"
#include "serve/server.h"
#include "serve/sockets.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::RunArgus;

constexpr uint32_t kServePage = 16;  // page tokens and prompt chunk: forks align with chunks
constexpr uint32_t kServeTokens = 24;

std::string ServeModelPath() { return testing::SharedDir() + "/models/stories260K.gguf"; }

// Prompts: lines of the story, different and of different lengths.
std::vector<std::string> ServePrompts(size_t n) {
  std::ifstream in(std::string(ARGUS_SOURCE_DIR) + "/tests/data/story.txt");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line) && lines.size() < n;) {
    if (line.size() > 20) lines.push_back(line.substr(0, 60 + 7 * lines.size() % 90));
  }
  return lines;
}

// A server on a free loopback port, and an HTTP client of it.
class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(ServeModelPath())) return;
    model_ = Model::Load(ServeModelPath()).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  void SetUp() override {
    ARGUS_SKIP_WITHOUT_SHARED();
    Start({});
  }

  void Start(serve::ServerOptions options) {
    server_.reset();
    context_.reset();
    BatchContextOptions b;
    b.n_ctx = 256;
    b.n_batch = 64;
    b.page_tokens = kServePage;
    b.n_threads = 2;
    b.ram_budget_bytes = size_t{32} << 20;
    context_ = BatchContext::Create(*model_, b).value();
    options.port = 0;
    options.model_name = "stories260K";
    options.scheduler.prefill_chunk = kServePage;
    if (options.read_timeout == std::chrono::seconds(10))
      options.read_timeout = std::chrono::seconds(1);
    server_ = serve::Server::Start(*model_, *context_, options).value();
  }

  void TearDown() override {
    if (server_) server_->Stop(std::chrono::milliseconds(0));
  }

  httplib::Client Client() const {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(60);
    return client;
  }

  // POST a JSON body; the status and the body.
  std::pair<int, std::string> Post(const std::string& path, const std::string& body,
                                   const httplib::Headers& headers = {}) const {
    httplib::Result r = Client().Post(path.c_str(), headers, body, "application/json");
    if (!r) return {-1, ""};
    return {r->status, r->body};
  }

  static nlohmann::json Message(const std::string& text, bool stream,
                                uint32_t max_tokens = kServeTokens) {
    return {{"model", "stories260K"},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"stream", stream},
            {"messages", {{{"role", "user"}, {"content", text}}}}};
  }

  std::string Text(const std::string& prompt) const {
    auto [status, body] = Post("/v1/messages", Message(prompt, false).dump());
    EXPECT_EQ(status, 200) << body;
    return nlohmann::json::parse(body)["content"][0]["text"].get<std::string>();
  }

  // The concatenated text_deltas of a streamed /v1/messages reply, and its event names.
  std::string StreamedText(const std::string& prompt,
                           std::vector<std::string>* names = nullptr) const {
    auto [status, body] = Post("/v1/messages", Message(prompt, true).dump());
    EXPECT_EQ(status, 200) << body;
    std::string text;
    size_t at = 0;
    while ((at = body.find("event: ", at)) != std::string::npos) {
      const size_t eol = body.find('\n', at);
      const std::string name = body.substr(at + 7, eol - at - 7);
      const size_t data = body.find("data: ", eol);
      const nlohmann::json event =
          nlohmann::json::parse(body.substr(data + 6, body.find('\n', data) - data - 6));
      if (names != nullptr) names->push_back(name);
      if (name == "content_block_delta") text += event["delta"]["text"].get<std::string>();
      at = eol;
    }
    return text;
  }

  // What `argus run` prints for the prompt with the server's context, batch and pages.
  static std::string RunText(const std::string& prompt) {
    const testing::CliRun run =
        RunArgus("run -m " + ServeModelPath() + " -c 256 -b 16 --page-tokens 16 -n " +
                 std::to_string(kServeTokens) + " -p '" + prompt + "'");
    EXPECT_EQ(run.exit_code, 0) << run.err;
    return run.out;
  }

  double Metric(const std::string& name) const {
    httplib::Result r = Client().Get("/metrics");
    if (!r) return -1;
    const size_t at = r->body.find("\n" + name + " ");
    if (at == std::string::npos) return -1;
    return std::stod(r->body.substr(at + name.size() + 2));
  }

  static Model* model_;
  std::unique_ptr<BatchContext> context_;
  std::unique_ptr<serve::Server> server_;
};

Model* ServeTest::model_ = nullptr;

TEST_F(ServeTest, MessagesReturnWhatArgusRunPrintsStreamedOrNot) {
  const std::string prompt = ServePrompts(1)[0];
  const std::string expected = RunText(prompt);
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(Text(prompt), expected);
  std::vector<std::string> names;
  EXPECT_EQ(StreamedText(prompt, &names), expected);
  ASSERT_GE(names.size(), 6u);
  EXPECT_EQ(names.front(), "message_start");
  EXPECT_EQ(names[1], "content_block_start");
  EXPECT_EQ(names[names.size() - 3], "content_block_stop");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(names.back(), "message_stop");
  // OpenAI's chat completion of the same message.
  nlohmann::json chat = Message(prompt, false);
  chat.erase("max_tokens");
  chat["max_tokens"] = kServeTokens;
  auto [status, body] = Post("/v1/chat/completions", chat.dump());
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(nlohmann::json::parse(body)["choices"][0]["message"]["content"].get<std::string>(),
            expected);
}

// The OpenAI endpoints streamed: their chunks' texts are argus run's text, and
// stream_options.include_usage ends the stream with the usage the unstreamed reply gives.
TEST_F(ServeTest, OpenAiStreamsCarryWhatArgusRunPrintsAndTheUsage) {
  const std::string prompt = ServePrompts(1)[0];
  const std::string expected = RunText(prompt);
  nlohmann::json chat = Message(prompt, true);
  chat["stream_options"] = {{"include_usage", true}};
  const nlohmann::json completion = {
      {"model", "stories260K"}, {"prompt", prompt}, {"max_tokens", kServeTokens},
      {"temperature", 0},       {"stream", true},   {"stream_options", {{"include_usage", true}}}};
  for (const auto& [path, body] : {std::pair{"/v1/chat/completions", chat.dump()},
                                   std::pair{"/v1/completions", completion.dump()}}) {
    SCOPED_TRACE(path);
    auto [status, reply] = Post(path, body);
    ASSERT_EQ(status, 200) << reply;
    std::string text;
    nlohmann::json usage;
    bool done = false;
    for (size_t at = 0; (at = reply.find("data: ", at)) != std::string::npos; at += 6) {
      const std::string data = reply.substr(at + 6, reply.find('\n', at) - at - 6);
      if (data == "[DONE]") {
        done = true;
        continue;
      }
      const nlohmann::json chunk = nlohmann::json::parse(data);
      if (chunk.contains("usage")) usage = chunk["usage"];
      if (chunk["choices"].empty()) continue;
      const nlohmann::json& choice = chunk["choices"][0];
      text += choice.contains("delta") ? choice["delta"].value("content", "")
                                       : choice.value("text", "");
    }
    EXPECT_TRUE(done) << reply;
    EXPECT_EQ(text, expected);
    nlohmann::json plain = nlohmann::json::parse(body);
    plain.erase("stream_options");
    plain["stream"] = false;
    auto [plain_status, plain_reply] = Post(path, plain.dump());
    ASSERT_EQ(plain_status, 200) << plain_reply;
    EXPECT_EQ(usage, nlohmann::json::parse(plain_reply)["usage"]) << reply;
  }
}

TEST_F(ServeTest, SixteenConcurrentStreamsEachGetTheirSoloOutput) {
  std::vector<std::string> prompts = ServePrompts(8);
  ASSERT_EQ(prompts.size(), 8u);
  // Eight more that share their first pages with the first eight.
  for (size_t i = 0; i < 8; ++i) prompts.push_back(prompts[i] + " And then the little dog said");
  std::vector<std::string> solo;
  for (const std::string& p : prompts) solo.push_back(Text(p));
  const double reused_before = Metric("argus_prefix_tokens_reused_total");

  std::vector<std::string> got(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] { got[i] = StreamedText(prompts[i]); });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], solo[i]) << "request " << i;
  EXPECT_GT(Metric("argus_prefix_tokens_reused_total"), reused_before);
  EXPECT_EQ(Metric("argus_requests_in_flight"), 0);
}

// A raw connection to the server: for clients that misbehave as no HTTP library would.
class ServeSocket {
 public:
  explicit ServeSocket(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    timeval wait{30, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  }
  ~ServeSocket() { ::close(fd_); }
  bool connected() const { return connected_; }
  bool Send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // One HTTP response: its head and a body of its Content-Length; nullopt when the connection
  // closes or 30 s pass first.
  std::optional<std::string> ReadResponse() {
    std::string reply;
    char buffer[4096];
    while (true) {
      const size_t head_end = reply.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        const size_t at = reply.find("Content-Length: ");
        const size_t length = at < head_end ? std::stoul(reply.substr(at + 16)) : 0;
        if (reply.size() >= head_end + 4 + length) return reply;
      }
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) return std::nullopt;
      reply.append(buffer, n);
    }
  }
  bool ReadSome() {
    char buffer[512];
    return ::recv(fd_, buffer, sizeof buffer, 0) > 0;
  }

 private:
  int fd_;
  bool connected_ = false;
};

std::string PostHead(size_t content_length) {
  return "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         "Content-Length: " +
         std::to_string(content_length) + "\r\n\r\n";
}

// Sends a streamed request, reads its first bytes and closes the connection.
void LeaveMidStream(int port, const std::string& body) {
  ServeSocket socket(port);
  ASSERT_TRUE(socket.connected());
  ASSERT_TRUE(socket.Send(PostHead(body.size()) + body));
  ASSERT_TRUE(socket.ReadSome());  // the stream began
}

TEST_F(ServeTest, AClientLeavingMidStreamFreesItsPagesAndOthersGoOn) {
  const std::vector<std::string> prompts = ServePrompts(2);
  const std::string solo = Text(prompts[1]);
  const double sequences = Metric("argus_kv_sequences");
  std::string other;
  std::thread steady([&] { other = StreamedText(prompts[1]); });
  LeaveMidStream(server_->port(), Message(prompts[0] + " Then", true, 200).dump());
  steady.join();
  EXPECT_EQ(other, solo);
  // The scheduler notices at its next write; the cancelled sequence is released, not kept.
  for (int i = 0; i < 200 && Metric("argus_requests_in_flight") != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Metric("argus_requests_in_flight"), 0);
  EXPECT_LE(Metric("argus_kv_sequences"), sequences + 1);  // at most the steady one's, retained
}

// What a handler that replies only at its end can learn of its client: its connection, open
// while the client is there and closed once it leaves.
TEST(ServePeerSocket, AHandlerFindsItsConnectionAndSeesTheClientLeave) {
  std::atomic<bool> entered{false}, done{false};
  int fd = -1;
  bool closed_at_first = true, closed_later = false;
  httplib::Server http;
  http.Get("/wait", [&](const httplib::Request& req, httplib::Response& res) {
    fd = serve::ConnectionSocket(req);
    closed_at_first = fd < 0 || serve::PeerClosed(fd);
    entered = true;
    for (int i = 0; i < 1000 && fd >= 0 && !closed_later; ++i) {  // up to 10 s
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      closed_later = serve::PeerClosed(fd);
    }
    done = true;
    res.set_content("late", "text/plain");
  });
  const int port = http.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread listener([&] { http.listen_after_bind(); });
  // Another connection, open until the handler is done: not the handler's.
  std::optional<ServeSocket> other(port);
  {
    ServeSocket client(port);
    ASSERT_TRUE(other->connected() && client.connected());
    ASSERT_TRUE(client.Send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"));
    for (int i = 0; i < 1000 && !entered; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(entered);
  }  // the client leaves
  for (int i = 0; i < 1100 && !done; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  other.reset();
  http.stop();
  listener.join();
  EXPECT_GE(fd, 0);
  EXPECT_FALSE(closed_at_first);
  EXPECT_TRUE(closed_later);
}

// The backlog the server raises holds every connection of a burst until it accepts them; the
// library's 5 would leave the rest to retries, or past the server's read timeout.
TEST(ServePeerSocket, ARaisedBacklogQueuesABurstOfConnections) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t size = sizeof addr;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &size), 0);
  const int port = ntohs(addr.sin_port);
  ASSERT_TRUE(serve::RaiseListenBacklog(port));
  EXPECT_FALSE(serve::RaiseListenBacklog(port == 65535 ? 1 : port + 1));  // nothing listens there
  // Connections begun at once, without waiting for them (a full backlog would hold connect).
  constexpr int kBurst = 32;
  std::vector<int> clients;
  for (int i = 0; i < kBurst; ++i) {
    clients.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
    ::connect(clients.back(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the handshakes settle
  int accepted = 0;
  ::fcntl(listener, F_SETFL, O_NONBLOCK);
  for (int fd; (fd = ::accept(listener, nullptr, nullptr)) >= 0; ++accepted) ::close(fd);
  ::close(listener);
  for (int fd : clients) ::close(fd);
  EXPECT_EQ(accepted, kBurst);  // a backlog of 1 queues 2
}

TEST_F(ServeTest, BadRequestsGetTheApisErrorsAndTheServerStaysUp) {
  const auto error_type = [](const std::string& body) {
    return nlohmann::json::parse(body)["error"]["type"].get<std::string>();
  };
  struct Case {
    std::string what, path, body;
    int status;
  };
  nlohmann::json no_model = Message("Hi", false);
  no_model.erase("model");
  nlohmann::json wrong_type = Message("Hi", false);
  wrong_type["max_tokens"] = "ten";
  nlohmann::json other_model = Message("Hi", false);
  other_model["model"] = "gpt-9";
  const std::vector<Case> cases = {
      {"malformed JSON", "/v1/messages", "{\"model\": ", 400},
      {"missing model", "/v1/messages", no_model.dump(), 400},
      {"wrong type", "/v1/messages", wrong_type.dump(), 400},
      {"max_tokens 0", "/v1/messages", Message("Hi", false, 0).dump(), 400},
      {"max_tokens huge", "/v1/messages", Message("Hi", false, 1u << 30).dump(), 400},
      {"unknown model", "/v1/messages", other_model.dump(), 404},
      {"non-UTF-8 text", "/v1/messages",
       "{\"model\":\"stories260K\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\","
       "\"content\":\"\xff\xfe\"}]}",
       400},
      {"malformed JSON (OpenAI)", "/v1/chat/completions", "[1,", 400},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto [status, body] = Post(c.path, c.body);
    EXPECT_EQ(status, c.status) << body;
    ASSERT_TRUE(nlohmann::json::accept(body)) << body;
    if (c.path == "/v1/messages") {
      EXPECT_EQ(nlohmann::json::parse(body)["type"], "error") << body;
    }
    EXPECT_FALSE(error_type(body).empty());
  }
  // A body of 100 MB is refused from its length, before the server reads it.
  {
    ServeSocket socket(server_->port());
    ASSERT_TRUE(socket.connected());
    ASSERT_TRUE(socket.Send(PostHead(size_t{100} << 20) + std::string(1 << 20, ' ')));
    const std::optional<std::string> reply = socket.ReadResponse();
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(reply->rfind("HTTP/1.1 413", 0), 0u) << reply->substr(0, 200);
    EXPECT_NE(reply->find("request_too_large"), std::string::npos) << *reply;
  }
  // A slow client that never finishes its headers gets 400 after the read timeout.
  {
    ServeSocket socket(server_->port());
    ASSERT_TRUE(socket.connected());
    ASSERT_TRUE(socket.Send("POST /v1/messages HTTP/1.1\r\nHo"));
    const std::optional<std::string> reply = socket.ReadResponse();
    ASSERT_TRUE(reply.has_value()) << "no reply within 30 s";
    EXPECT_EQ(reply->rfind("HTTP/1.1 400", 0), 0u) << *reply;
    EXPECT_NE(reply->find("invalid_request_error"), std::string::npos) << *reply;
  }
  EXPECT_EQ(Client().Get("/health")->status, 200);
  EXPECT_FALSE(Text("Once upon a time").empty());
}

TEST_F(ServeTest, AnApiKeyIsAskedOfEveryRequestButHealth) {
  serve::ServerOptions options;
  options.api_key = "sesame";
  Start(options);
  const std::string body = Message("Hi", false, 4).dump();
  EXPECT_EQ(Post("/v1/messages", body).first, 401);
  EXPECT_EQ(Post("/v1/messages", body, {{"x-api-key", "wrong"}}).first, 401);
  EXPECT_EQ(Post("/v1/messages", body, {{"x-api-key", "sesame"}}).first, 200);
  EXPECT_EQ(Post("/v1/messages", body, {{"Authorization", "Bearer sesame"}}).first, 200);
  EXPECT_EQ(Client().Get("/health")->status, 200);
  EXPECT_EQ(Client().Get("/v1/models")->status, 401);
}

TEST_F(ServeTest, ModelsHealthAndMetricsDescribeTheServer) {
  httplib::Result models = Client().Get("/v1/models");
  ASSERT_TRUE(models);
  const nlohmann::json m = nlohmann::json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "stories260K");
  EXPECT_FALSE(Text("Once upon a time").empty());
  httplib::Result metrics = Client().Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const char* family :
       {"argus_requests_in_flight", "argus_requests_queued", "argus_kv_bytes",
        "argus_generated_tokens_total", "argus_generated_tokens_per_second",
        "argus_prefix_pages_reused_total", "argus_time_to_first_token_seconds_bucket",
        "argus_time_per_output_token_seconds_count"}) {
    EXPECT_NE(metrics->body.find(family), std::string::npos) << family;
  }
  EXPECT_GE(Metric("argus_generated_tokens_total"), 1);
  EXPECT_EQ(Metric("argus_time_to_first_token_seconds_count"), 1);
}

// The argus serve process: it listens on the port it names, answers, and on SIGTERM finishes
// what is in flight and exits 0.
TEST(ServeProgram, ServesUntilSigtermThenExitsZero) {
  ARGUS_SKIP_WITHOUT_SHARED();
  testing::TempDir dir;
  const std::string log = dir / "serve.log";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, STDERR_FILENO);
    ::execl(ARGUS_CLI_PATH, ARGUS_CLI_PATH, "serve", "-m", ServeModelPath().c_str(), "--port", "0",
            "-c", "256", "--grace", "5", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {  // up to 60 s (a sanitizer build loads slowly)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("listening on http://127.0.0.1:");
    if (at != std::string::npos) port = std::stoi(text.substr(at + 30));
  }
  ASSERT_GT(port, 0) << "no listening line in " << log;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60);
  const nlohmann::json body = {{"model", "stories260K"},
                               {"max_tokens", 8},
                               {"temperature", 0},
                               {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}};
  httplib::Result r = client.Post("/v1/messages", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// argus-bench serve: every run's streams complete, the ratios are to the same server's run of
// one stream, and stock llama-server (../shared/peers) runs the same streams beside argus.
TEST(ServeProgram, BenchServeReportsEveryRunBesideOneStreamAndThePeer) {
  ARGUS_SKIP_WITHOUT_BENCH();
  ARGUS_SKIP_WITHOUT_SHARED();
  const bool peer = std::filesystem::exists(std::filesystem::path(testing::SharedDir()) /
                                            "peers/bin/llama-server");
  testing::TempDir dir;
  const testing::CliRun run = testing::RunArgusBench(
      "serve -m " + ServeModelPath() +
      " --streams 1,3 --prompt-tokens 20 --max-tokens 6 -c 128 --json " + (dir / "serve.json"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::ifstream in(dir / "serve.json");
  const nlohmann::json report = nlohmann::json::parse(in);
  const std::vector<std::string> servers =
      peer ? std::vector<std::string>{"argus", "llama-server"} : std::vector<std::string>{"argus"};
  ASSERT_EQ(report["runs"].size(), 2 * servers.size()) << report.dump(2);
  const auto& runs = report["runs"];
  for (size_t i = 0; i < runs.size(); ++i) {
    const nlohmann::json& r = runs[i];
    const uint32_t streams = r["streams"].get<uint32_t>();
    EXPECT_EQ(r["server"], servers[i % servers.size()]);
    EXPECT_EQ(streams, i < servers.size() ? 1u : 3u);
    EXPECT_GT(r["output_tokens"].get<uint32_t>(), 0u);
    EXPECT_LE(r["output_tokens"].get<uint32_t>(), 6 * streams);
    EXPECT_GT(r["tokens_per_s"].get<double>(), 0);
    if (r["server"] == "argus") {
      EXPECT_GE(r["mean_step_rows"].get<double>(), 1.0);
    }
    EXPECT_LE(r["ttft_p50_ms"].get<double>(), r["ttft_p99_ms"].get<double>());
    const nlohmann::json& one = runs[i % servers.size()];
    EXPECT_NEAR(r["tokens_per_s_vs_one_stream"].get<double>(),
                r["tokens_per_s"].get<double>() / one["tokens_per_s"].get<double>(), 1e-9);
    if (peer && r["server"] == "argus") {
      EXPECT_NEAR(r["tokens_per_s_vs_peer"].get<double>(),
                  r["tokens_per_s"].get<double>() / runs[i + 1]["tokens_per_s"].get<double>(),
                  1e-9);
    }
  }
  if (peer) {
    EXPECT_EQ(runs[1]["output_tokens"], 6);  // ignore_eos: the peer makes every token
  }
  EXPECT_NE(report["peer"].get<std::string>().find(peer ? "llama-server" : "none"),
            std::string::npos);
}

}  // namespace
}  // namespace argus
