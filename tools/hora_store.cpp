// SPDX-License-Identifier: Apache-2.0
// hora-store: the job's TCP store as a process of its own. horarun's agents run one where the
// rendezvous endpoint is, so that the store outlives every worker (docs/elastic.md).
//
//   hora-store [--host HOST] [--port PORT]
//
// Proves HORA_JOB_TOKEN like rank 0's store does. Prints "hora-store listening on PORT" on
// stdout once it serves, then runs until SIGTERM or SIGINT, or until its stdin reaches end of
// file (the agent that started it is gone).
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/error.h"
#include "bootstrap/env/rendezvous.h"
#include "bootstrap/env/tcp_store.h"

namespace {

volatile sig_atomic_t gStop = 0;
void onSignal(int) { gStop = 1; }

int usage(const char *why) {
  std::fprintf(stderr, "hora-store: %s\nusage: hora-store [--host HOST] [--port PORT]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char **argv) {
  std::string host;
  int port = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("usage: hora-store [--host HOST] [--port PORT]\n"
                  "Serves a hora TCP store (HORA_JOB_TOKEN required of clients when set) until\n"
                  "SIGTERM, SIGINT or end of file on stdin. Port 0 (the default) = any free port.\n");
      return 0;
    }
    if ((arg == "--host" || arg == "--port") && i + 1 < argc) {
      const std::string value = argv[++i];
      if (arg == "--host") {
        host = value;
      } else {
        char *end = nullptr;
        const long v = std::strtol(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || v < 0 || v > 65535) return usage("--port: not a TCP port");
        port = static_cast<int>(v);
      }
      continue;
    }
    return usage(("unknown argument '" + arg + "'").c_str());
  }
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  try {
    hora::StoreServerOptions options;
    options.token = hora::storeSecurityFromEnvironment().token;
    options.maxConnections = 65536;
    hora::TcpStoreServer server(host, port, options);
    std::printf("hora-store listening on %d\n", server.port());
    std::fflush(stdout);
    bool stdinOpen = true;
    while (!gStop) {
      pollfd p{0, POLLIN, 0};
      const int n = poll(&p, stdinOpen ? 1 : 0, 500);
      if (n > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
        char buffer[256];
        const ssize_t got = read(0, buffer, sizeof buffer);
        if (got == 0) break;  // the agent is gone
        if (got < 0) stdinOpen = false;
      }
    }
  } catch (const hora::Error &e) {
    std::fprintf(stderr, "hora-store: %s\n", e.what());
    return 1;
  }
  return 0;
}
