// What cpp-httplib 0.11 (Debian 12's) does not hand the server: the socket of a request's
// connection, for a handler that writes nothing until its reply is whole (a non-streamed
// generation), which must learn that its client left; and the listening socket, whose backlog
// the library fixes at 5 connections.
#pragma once

#include <httplib.h>

namespace argus::serve {

// The descriptor of the connection `req` came on, found among the process's sockets by its local
// and peer addresses; -1 when none matches. Valid while the handler runs.
int ConnectionSocket(const httplib::Request& req);

// Whether the peer of a connected socket has closed or reset it. Never blocks.
bool PeerClosed(int fd);

// Raises the backlog of the process's socket listening on `port` to SOMAXCONN: with 5, clients
// connecting at once overflow it, and those whose request the kernel drops meanwhile can wait
// past the server's read timeout. False when no such socket is found or listen fails.
bool RaiseListenBacklog(int port);

}  // namespace argus::serve
