#include "serve/peer_socket.h"

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

}  // namespace

int ConnectionSocket(const httplib::Request& req) {
  if (req.remote_port < 0 || req.local_port < 0) return -1;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    if (Matches(static_cast<int>(fd), req)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(dir);
  return found;
}

bool PeerClosed(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace argus::serve
