#include "bench/cli/peers.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

extern char** environ;

namespace argus::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool IsExecutableFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

// Starts program with args, its stdout to out_path and stderr to err_path (each created 0600), or
// both to out_path when err_path is empty.
Result<pid_t> Spawn(const std::string& program, const std::vector<std::string>& args,
                    const std::string& out_path, const std::string& err_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (err_path.empty()) {
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
  }
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int error = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return Status::IOError("starting " + program + ": " + std::strerror(error));
  return pid;
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string LastLine(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const size_t at = text.rfind('\n');
  return at == std::string::npos ? text : text.substr(at + 1);
}

bool Exited(pid_t pid, std::chrono::milliseconds within) {
  const Clock::time_point end = Clock::now() + within;
  do {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (Clock::now() < end);
  return false;
}

}  // namespace

Result<std::string> FindPeer(const std::string& name, const std::string& given) {
  if (!given.empty()) {
    if (!IsExecutableFile(given)) {
      return Status::NotFound("peer " + given + ": not an executable file");
    }
    return given;
  }
  std::vector<fs::path> candidates;
  if (const char* dir = std::getenv("ARGUS_PEERS_DIR")) candidates.push_back(fs::path(dir) / "bin");
  candidates.push_back(fs::path("..") / "shared" / "peers" / "bin");
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    candidates.push_back(self.parent_path() / ".." / ".." / ".." / "shared" / "peers" / "bin");
  for (const fs::path& dir : candidates) {
    if (IsExecutableFile(dir / name)) return fs::absolute(dir / name).lexically_normal().string();
  }
  return std::string();
}

Result<std::string> RunPeer(const std::string& program, const std::vector<std::string>& args) {
  const fs::path dir = fs::temp_directory_path();
  const std::string stem = "argus-peer-" + std::to_string(::getpid());
  const fs::path out = dir / (stem + ".out"), err = dir / (stem + ".err");
  ARGUS_ASSIGN_OR_RETURN(pid_t pid, Spawn(program, args, out.string(), err.string()));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string printed = ReadText(out), complaint = LastLine(ReadText(err));
  std::error_code ec;
  fs::remove(out, ec);
  fs::remove(err, ec);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string how = WIFEXITED(status)
                                ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                : "was killed by signal " + std::to_string(WTERMSIG(status));
    return Status::Internal(program + " " + how + (complaint.empty() ? "" : ": " + complaint));
  }
  return printed;
}

Result<int> FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Status::IOError("socket: " + std::string(std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) return Status::IOError("no free loopback port: " + std::string(std::strerror(errno)));
  return static_cast<int>(ntohs(addr.sin_port));
}

Result<std::unique_ptr<PeerServer>> PeerServer::Start(const std::string& program,
                                                      const std::vector<std::string>& args,
                                                      int port, const std::string& log_path) {
  ARGUS_ASSIGN_OR_RETURN(pid_t pid, Spawn(program, args, log_path, ""));
  std::unique_ptr<PeerServer> server(new PeerServer(pid, port));

  // Loading a model takes seconds; a peer that exits (a bad flag, a file it cannot read) fails
  // at once, naming its log.
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(std::chrono::seconds(1));
  const Clock::time_point deadline = Clock::now() + std::chrono::minutes(2);
  while (Clock::now() < deadline) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) {
      server->pid_ = -1;
      return Status::Internal(program + " exited before it served (see " + log_path + ")");
    }
    if (auto res = client.Get("/health"); res && res->status == 200) return server;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status::Internal(program + " did not answer /health within 2 minutes (see " + log_path +
                          ")");
}

PeerServer::~PeerServer() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  if (!Exited(pid_, std::chrono::seconds(5))) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

}  // namespace argus::cli
