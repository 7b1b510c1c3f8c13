#include "serve/sockets.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>

namespace argus::serve {

namespace {

// The address and port of a socket address, as httplib writes them into a Request.
bool AddressOf(const sockaddr_storage& a, std::string& address, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    port = ntohs(in.sin_port);
    address = inet_ntop(AF_INET, &in.sin_addr, text, sizeof text) ? text : "";
    return true;
  }
  if (a.ss_family == AF_INET6) {
    const auto& in = reinterpret_cast<const sockaddr_in6&>(a);
    port = ntohs(in.sin6_port);
    address = inet_ntop(AF_INET6, &in.sin6_addr, text, sizeof text) ? text : "";
    return true;
  }
  return false;
}

// Whether fd is a TCP connection from (peer_address, peer_port) to local_port.
bool Matches(int fd, const httplib::Request& req) {
  sockaddr_storage peer{}, local{};
  socklen_t peer_size = sizeof peer, local_size = sizeof local;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0) return false;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0) return false;
  std::string peer_address, local_address;
  int peer_port = -1, local_port = -1;
  return AddressOf(peer, peer_address, peer_port) && AddressOf(local, local_address, local_port) &&
         peer_port == req.remote_port && local_port == req.local_port &&
         peer_address == req.remote_addr;
}

// Whether fd listens on `port`.
bool Listens(int fd, int port) {
  int accepting = 0;
  socklen_t size = sizeof accepting;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &size) != 0 || !accepting)
    return false;
  sockaddr_storage local{};
  socklen_t local_size = sizeof local;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0) return false;
  std::string address;
  int local_port = -1;
  return AddressOf(local, address, local_port) && local_port == port;
}

// The first of the process's descriptors that `matches`; -1 when none does.
template <typename Match>
int FindSocket(const Match& matches) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    if (matches(static_cast<int>(fd))) {
      found = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(dir);
  return found;
}

}  // namespace

int ConnectionSocket(const httplib::Request& req) {
  if (req.remote_port < 0 || req.local_port < 0) return -1;
  return FindSocket([&](int fd) { return Matches(fd, req); });
}

bool RaiseListenBacklog(int port) {
  const int fd = FindSocket([&](int candidate) { return Listens(candidate, port); });
  return fd >= 0 && ::listen(fd, SOMAXCONN) == 0;
}

bool PeerClosed(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace argus::serve
