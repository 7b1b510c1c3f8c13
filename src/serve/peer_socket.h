// The socket of a request's connection, for a handler that writes nothing until its reply is
// whole (a non-streamed generation): cpp-httplib 0.11 tells such a handler neither its socket nor
// that the client left, and a request whose client is gone should stop and free its pages.
#pragma once

#include <httplib.h>

namespace argus::serve {

// The descriptor of the connection `req` came on, found among the process's sockets by its local
// and peer addresses; -1 when none matches. Valid while the handler runs.
int ConnectionSocket(const httplib::Request& req);

// Whether the peer of a connected socket has closed or reset it. Never blocks.
bool PeerClosed(int fd);

}  // namespace argus::serve
