// A redis-server of a test's own on a free loopback port, started as a child process and killed
// at the end, and a minimal RESP client to prod it (CONFIG SET, SETRANGE, DEBUG SLEEP, KEYS).
// Tests skip, saying so, when redis-server is not installed, and fail instead when
// ARGUS_REQUIRE_REDIS is set.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace argus::testing {

inline std::string RedisServerPath() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    const std::string path = std::string(dir) + "/redis-server";
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

// Skips the test without redis-server, unless ARGUS_REQUIRE_REDIS is set: then it fails.
#define ARGUS_SKIP_WITHOUT_REDIS()                                                            \
  do {                                                                                        \
    if (::argus::testing::RedisServerPath().empty()) {                                        \
      if (std::getenv("ARGUS_REQUIRE_REDIS") != nullptr)                                      \
        FAIL() << "redis-server is not installed and ARGUS_REQUIRE_REDIS is set";             \
      GTEST_SKIP() << "redis-server is not installed (scripts/install-deps.sh installs it)"; \
    }                                                                                         \
  } while (0)

// A connection speaking RESP: Command sends one command and returns its reply's first line
// ("+OK", "-ERR …", ":1", "$5") with the bulk string's bytes after a bulk header.
class RespClient {
 public:
  explicit RespClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RespClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  RespClient(const RespClient&) = delete;
  RespClient& operator=(const RespClient&) = delete;
  bool connected() const { return fd_ >= 0; }

  bool Send(const std::vector<std::string>& args) {
    std::string out = "*" + std::to_string(args.size()) + "\r\n";
    for (const std::string& a : args) out += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
    return fd_ >= 0 && ::send(fd_, out.data(), out.size(), MSG_NOSIGNAL) ==
                           static_cast<ssize_t>(out.size());
  }
  std::string Command(const std::vector<std::string>& args) {
    if (!Send(args)) return "";
    std::string line = ReadLine();
    if (line.size() > 1 && line[0] == '$' && line != "$-1") {
      const size_t n = std::stoul(line.substr(1));
      return line + "\n" + ReadExact(n + 2).substr(0, n);
    }
    if (line.size() > 1 && line[0] == '*') {  // an array of bulk strings: one per line
      const long n = std::stol(line.substr(1));
      std::string all = line;
      for (long i = 0; i < n; ++i) {
        const std::string head = ReadLine();
        if (head.size() > 1 && head[0] == '$' && head != "$-1")
          all += "\n" + ReadExact(std::stoul(head.substr(1)) + 2).substr(0, std::stoul(head.substr(1)));
      }
      return all;
    }
    return line;
  }
  // The array reply's elements (KEYS).
  std::vector<std::string> Keys(const std::string& pattern) {
    std::string all = Command({"KEYS", pattern});
    std::vector<std::string> keys;
    size_t at = all.find('\n');
    while (at != std::string::npos) {
      const size_t next = all.find('\n', at + 1);
      keys.push_back(all.substr(at + 1, next == std::string::npos ? next : next - at - 1));
      at = next;
    }
    return keys;
  }

 private:
  std::string ReadExact(size_t n) {
    std::string s;
    while (s.size() < n) {
      if (buf_.empty() && !Fill()) break;
      const size_t take = std::min(n - s.size(), buf_.size());
      s += buf_.substr(0, take);
      buf_.erase(0, take);
    }
    return s;
  }
  std::string ReadLine() {
    size_t end;
    while ((end = buf_.find("\r\n")) == std::string::npos) {
      if (!Fill()) return "";
    }
    std::string line = buf_.substr(0, end);
    buf_.erase(0, end + 2);
    return line;
  }
  bool Fill() {
    char chunk[65536];
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buf_.append(chunk, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  std::string buf_;
};

class RedisServer {
 public:
  // Starts redis-server on a free loopback port (no persistence, DEBUG allowed) with `extra`
  // arguments, and waits until it answers PING (ok() false when it never does).
  explicit RedisServer(std::vector<std::string> extra = {}, int port = 0) {
    port_ = port != 0 ? port : FreePort();
    Start(std::move(extra));
  }
  ~RedisServer() { Kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  bool ok() const { return ok_; }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
    ok_ = false;
  }
  // Starts again on the same port.
  void Restart(std::vector<std::string> extra = {}) {
    Kill();
    Start(std::move(extra));
  }

  static int FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    ::close(fd);
    return port;
  }

 private:
  void Start(std::vector<std::string> extra) {
    const std::string path = RedisServerPath();
    std::vector<std::string> args = {path,      "--port",      std::to_string(port_),
                                     "--bind",  "127.0.0.1",   "--save",
                                     "",        "--appendonly", "no",
                                     "--daemonize", "no",      "--dir",
                                     std::filesystem::temp_directory_path().string(),
                                     "--enable-debug-command", "yes"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;  // built before fork: the child only calls async-signal-safe code
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      if (null >= 0) {
        ::dup2(null, 1);
        ::dup2(null, 2);
      }
      ::execv(path.c_str(), argv.data());
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      RespClient client(port_);
      const std::string pong = client.connected() ? client.Command({"PING"}) : "";
      if (pong == "+PONG" || pong.starts_with("-NOAUTH")) {  // up (with --requirepass: NOAUTH)
        ok_ = true;
        return;
      }
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {  // exited: the port was taken
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  int port_ = 0;
  pid_t pid_ = -1;
  bool ok_ = false;
};

}  // namespace argus::testing
