// SPDX-License-Identifier: Apache-2.0
// hora-link: what the network between the hosts of a job allows, measured over plain TCP sockets
// in the harness of hora-bench, so that a plane's figures can be read against a bound taken in
// the same run.
//
//   latency:   every rank sends 8 bytes to every other and waits (poll) until it has all of them;
//              one such exchange, and two in a row, which is the least a small allreduce of hora
//              costs (the negotiation's exchange, then the data's). Each op's slowest rank.
//   bandwidth: each rank streams --bytes to the rank of its local index on the next host and
//              receives as much from the previous host, every pair at once (the traffic of a
//              hierarchical allreduce's cross-host step); the slowest rank's rate, each way.
//   bound:     an allreduce of SIZE across H hosts of R ranks must move 2(H-1)/H x SIZE out of
//              every host, R ranks sharing it: SIZE x 2(H-1)/H / R per rank at the rate above.
//
// Usage: hora-link [--ops N] [--bytes SIZE] [--sizes 4,64M,...]   (under any launcher hora-bench takes)
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench_util.h"
#include "world.h"

namespace hora::bench {
namespace {

struct Options {
  int ops = 2000;
  int64_t bytes = 256 << 20;
  std::vector<int64_t> sizes{4, 1 << 20, 64 << 20};
};

[[noreturn]] void fail(const char *what) {
  std::fprintf(stderr, "hora-link: rank %d: %s: %s\n", worldRank(), what, std::strerror(errno));
  abortJob(1);
}

void writeAll(int fd, const void *data, size_t n) {
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("send");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void readAll(int fd, void *data, size_t n) {
  char *p = static_cast<char *>(data);
  while (n > 0) {
    const ssize_t k = recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("recv");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// A TCP connection to every other rank (-1 for this rank), TCP_NODELAY: rank j connects to each
// i < j and says who it is; the addresses travel through the harness.
std::vector<int> connectMesh(const std::vector<RankInfo> &ranks) {
  const int me = worldRank(), n = worldSize();
  const int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) fail("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  // A numeric address, or this host's name (no MASTER_ADDR, e.g. under mpirun): its IPv4 address,
  // which the peers will connect to.
  const std::string host = listenAddress(ranks);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo *res = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
      errno = EADDRNOTAVAIL;
      fail(("resolving this host's name " + host + " to an IPv4 address").c_str());
    }
    addr.sin_addr = reinterpret_cast<sockaddr_in *>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
  }
  if (bind(lfd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) fail("bind");
  if (listen(lfd, n) != 0) fail("listen");
  socklen_t len = sizeof addr;
  getsockname(lfd, reinterpret_cast<sockaddr *>(&addr), &len);
  const std::vector<uint8_t> all = allgatherBytes(&addr, sizeof addr);
  std::vector<int> fds(static_cast<size_t>(n), -1);
  auto tune = [](int fd) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  };
  for (int i = 0; i < me; ++i) {
    sockaddr_in peer{};
    std::memcpy(&peer, all.data() + static_cast<size_t>(i) * sizeof peer, sizeof peer);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr *>(&peer), sizeof peer) != 0) fail("connect");
    tune(fd);
    const int32_t who = me;
    writeAll(fd, &who, sizeof who);
    fds[static_cast<size_t>(i)] = fd;
  }
  for (int k = me + 1; k < n; ++k) {
    const int fd = accept(lfd, nullptr, nullptr);
    if (fd < 0) fail("accept");
    tune(fd);
    int32_t who = -1;
    readAll(fd, &who, sizeof who);
    if (who <= me || who >= n) {
      errno = EPROTO;
      fail("a stranger connected");
    }
    fds[static_cast<size_t>(who)] = fd;
  }
  close(lfd);
  return fds;
}

// One exchange: 8 bytes to every peer, then wait until 8 bytes came from each: asleep in poll,
// or (spin) polling without a timeout and yielding the core between looks.
void exchange(const std::vector<int> &fds, std::vector<pollfd> &pfds, uint64_t token, bool spin) {
  for (int fd : fds) {
    if (fd >= 0) writeAll(fd, &token, sizeof token);
  }
  pfds.clear();
  for (int fd : fds) {
    if (fd >= 0) pfds.push_back({fd, POLLIN, 0});
  }
  const double deadline = now() + 10;
  while (!pfds.empty()) {
    const int ready = poll(pfds.data(), pfds.size(), spin ? 0 : 10000);
    if (ready < 0 || (ready == 0 && (!spin || now() > deadline))) fail("poll (a peer sent nothing for 10 s)");
    if (ready == 0) {
      sched_yield();
      continue;
    }
    for (size_t i = 0; i < pfds.size();) {
      if (pfds[i].revents != 0) {
        uint64_t got;
        readAll(pfds[i].fd, &got, sizeof got);
        pfds[i] = pfds.back();
        pfds.pop_back();
      } else {
        ++i;
      }
    }
  }
}

// Per op, the slowest rank's microseconds: median and mean.
std::pair<double, double> latency(const std::vector<int> &fds, int exchanges, int ops, bool spin) {
  std::vector<pollfd> pfds;
  for (int i = 0; i < 50; ++i) exchange(fds, pfds, 0, spin);
  barrier();
  std::vector<double> t(static_cast<size_t>(ops));
  for (int i = 0; i < ops; ++i) {
    const double start = now();
    for (int e = 0; e < exchanges; ++e) exchange(fds, pfds, static_cast<uint64_t>(i), spin);
    t[static_cast<size_t>(i)] = (now() - start) * 1e6;
  }
  maxOverRanks(t.data(), t.size());
  return {median(t), mean(t)};
}

// Streams `bytes` to `to` and takes as many from `from` (the same socket where they are one
// rank), both at once; seconds.
double stream(int to, int from, int64_t bytes, std::vector<char> &buf) {
  for (int fd : {to, from}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  int64_t sent = 0, got = 0;
  const double start = now();
  while (sent < bytes || got < bytes) {
    if (to == from) {
      pollfd p{to, static_cast<short>((sent < bytes ? POLLOUT : 0) | (got < bytes ? POLLIN : 0)), 0};
      poll(&p, 1, 10000);
    } else {
      pollfd p[2] = {{to, static_cast<short>(sent < bytes ? POLLOUT : 0), 0},
                     {from, static_cast<short>(got < bytes ? POLLIN : 0), 0}};
      poll(p, 2, 10000);
    }
    const size_t half = buf.size() / 2;
    if (sent < bytes) {
      const ssize_t k = send(to, buf.data(), std::min<int64_t>(static_cast<int64_t>(half), bytes - sent), MSG_NOSIGNAL);
      if (k > 0) sent += k;
      else if (k < 0 && errno != EAGAIN && errno != EINTR) fail("send");
    }
    if (got < bytes) {
      const ssize_t k = recv(from, buf.data() + half, std::min<int64_t>(static_cast<int64_t>(half), bytes - got), 0);
      if (k > 0) got += k;
      else if (k == 0 || (errno != EAGAIN && errno != EINTR)) fail("recv");
    }
  }
  const double took = now() - start;
  for (int fd : {to, from}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return took;
}

bool parseSize(const char *text, int64_t *out) {
  char *end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || v < 0) return false;
  double scale = 1;
  if (*end == 'K' || *end == 'k') scale = 1024, ++end;
  else if (*end == 'M' || *end == 'm') scale = 1024.0 * 1024, ++end;
  else if (*end == 'G' || *end == 'g') scale = 1024.0 * 1024 * 1024, ++end;
  if (*end != '\0') return false;
  *out = static_cast<int64_t>(v * scale);
  return true;
}

int usage(const char *why) {
  if (worldRank() == 0) {
    if (why != nullptr) std::fprintf(stderr, "hora-link: %s\n", why);
    std::fprintf(stderr,
                 "usage: hora-link [--ops N] [--bytes SIZE] [--sizes S1,S2,...]\n"
                 "  the network between this job's hosts over plain TCP: latency of one and two\n"
                 "  all-to-all exchanges of 8 bytes, each rank's rate to the next host, and the\n"
                 "  allreduce bound that rate gives for each of --sizes (default 4,1M,64M)\n");
  }
  return 2;
}

int run(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(nullptr);
      return 0;
    }
    if (i + 1 >= argc) return usage(("missing a value after " + a).c_str());
    const char *v = argv[++i];
    if (a == "--ops") {
      o.ops = std::atoi(v);
      if (o.ops < 1) return usage("--ops takes a positive count");
    } else if (a == "--bytes") {
      if (!parseSize(v, &o.bytes) || o.bytes < 1) return usage("--bytes takes a size such as 256M");
    } else if (a == "--sizes") {
      o.sizes.clear();
      std::string list = v;
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        int64_t s = 0;
        if (!parseSize(list.substr(at, comma - at).c_str(), &s) || s < 1) return usage("--sizes takes sizes such as 4,64M");
        o.sizes.push_back(s);
        at = comma + 1;
      }
    } else {
      return usage(("unknown option " + a).c_str());
    }
  }
  const std::vector<RankInfo> ranks = gatherRanks();
  const int me = worldRank(), n = worldSize();
  std::map<std::string, std::vector<int>> byHost;
  std::vector<std::string> hostOrder;
  for (int r = 0; r < n; ++r) {
    auto &v = byHost[ranks[static_cast<size_t>(r)].host];
    if (v.empty()) hostOrder.push_back(ranks[static_cast<size_t>(r)].host);
    v.push_back(r);
  }
  const int H = static_cast<int>(hostOrder.size());
  const int R = static_cast<int>(byHost[hostOrder[0]].size());
  bool even = true;
  for (const auto &h : byHost) even = even && static_cast<int>(h.second.size()) == R;
  if (me == 0) {
    std::printf("# hora-link: plain TCP sockets (TCP_NODELAY) between the ranks of %d host%s x %s rank%s, "
                "launched by %s\n",
                H, H == 1 ? "" : "s", even ? std::to_string(R).c_str() : "uneven", R == 1 && even ? "" : "s",
                launcherName());
    printRanks(stdout, ranks);
  }
  if (n < 2) {
    if (me == 0) std::printf("# one rank: nothing to measure\n");
    return 0;
  }
  const std::vector<int> fds = connectMesh(ranks);
  std::pair<double, double> two{0, 0};
  if (me == 0) {
    std::printf("#\n# latency: 8 bytes from every rank to every other, each op's slowest rank, %d ops; a rank\n"
                "# waits asleep in poll, or spins (poll without a timeout, yielding the core between looks)\n", o.ops);
    std::printf("#   exchanges    wait  median(us)    mean(us)\n");
  }
  for (bool spin : {false, true}) {
    for (int exchanges : {1, 2}) {
      const auto t = latency(fds, exchanges, o.ops, spin);
      if (exchanges == 2) two = two.first == 0 ? t : (t.first < two.first ? t : two);
      if (me == 0) {
        std::printf("    %9d  %6s  %10.1f  %10.1f%s\n", exchanges, spin ? "spin" : "sleep", t.first, t.second,
                    exchanges == 2 ? "   (a small allreduce of hora: negotiation, then data)" : "");
      }
    }
  }
  if (H < 2 || !even) {
    if (me == 0) {
      std::printf("# bandwidth: %s\n", H < 2 ? "every rank on one host: no network between hosts to measure"
                                             : "hosts with different numbers of ranks: not measured");
    }
    for (int fd : fds) if (fd >= 0) close(fd);
    return 0;
  }
  // The rank of my local index on the next host and on the previous one.
  const std::vector<int> &mine = byHost[ranks[static_cast<size_t>(me)].host];
  const int h = static_cast<int>(std::find(hostOrder.begin(), hostOrder.end(), ranks[static_cast<size_t>(me)].host) -
                                 hostOrder.begin());
  const int l = static_cast<int>(std::find(mine.begin(), mine.end(), me) - mine.begin());
  const int next = byHost[hostOrder[static_cast<size_t>((h + 1) % H)]][static_cast<size_t>(l)];
  const int prev = byHost[hostOrder[static_cast<size_t>((h + H - 1) % H)]][static_cast<size_t>(l)];
  std::vector<char> buf(8 << 20, 1);
  stream(fds[static_cast<size_t>(next)], fds[static_cast<size_t>(prev)], std::min<int64_t>(o.bytes, 16 << 20), buf);
  std::vector<double> rates;
  for (int rep = 0; rep < 3; ++rep) {
    barrier();
    const double t = maxOverRanks(stream(fds[static_cast<size_t>(next)], fds[static_cast<size_t>(prev)], o.bytes, buf));
    rates.push_back(static_cast<double>(o.bytes) / t / 1e9);
  }
  const double rate = median(rates);
  if (me == 0) {
    std::printf("#\n# bandwidth: each rank streams %.0f MiB to its counterpart on the next host while it takes as\n"
                "# much from the previous, all %d ranks at once; the slowest rank, median of 3\n",
                static_cast<double>(o.bytes) / (1 << 20), n);
    std::printf("#   per rank, each way: %.4g GB/s   (out of each host: %.4g GB/s)\n", rate, rate * R);
    std::printf("#\n# allreduce bound: every host sends 2(H-1)/H of the vector to other hosts, its %d rank%s sharing it\n",
                R, R == 1 ? "" : "s");
    std::printf("#        size   bound(us)  algbw(GB/s)\n");
    for (int64_t s : o.sizes) {
      // Below a message's worth the two exchanges of the latency test (the faster wait) are the
      // bound instead.
      const double bytesOut = static_cast<double>(s) * 2.0 * (H - 1) / H / R;
      const double t = std::max(bytesOut / (rate * 1e9) * 1e6, two.first);
      std::printf("  %12lld  %10.1f  %11.4g\n", static_cast<long long>(s), t, static_cast<double>(s) / (t * 1e3));
    }
  }
  for (int fd : fds) if (fd >= 0) close(fd);
  return 0;
}

}  // namespace
}  // namespace hora::bench

int main(int argc, char **argv) { return hora::bench::runBenchmark(argc, argv, "hora-link", hora::bench::run); }
