// SPDX-License-Identifier: Apache-2.0
// The TCP store: a poll(2) loop on one thread serving every client, and the blocking client.
#include "bootstrap/env/tcp_store.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "base/error.h"
#include "base/logging.h"
#include "base/process.h"
#include "bootstrap/env/auth.h"

namespace hora {

// Wire protocol. Every message is a frame: u32 body length, then the body; integers are little
// endian. Request body: u8 command, u32 wait in ms (get/wait only), u32 argument count, then
// each argument as u32 length + bytes. Reply body: u8 status, then the payload: get -> the value,
// add -> i64, check -> u8, timed-out get/wait -> u32 missing count, u32 n, n keys (u32 + bytes),
// error -> a message. One request is in flight per connection; replies come in order.
//
// Every connection starts with a handshake (docs/security.md), in the same frames:
//   client: hello [magic, session, client nonce Nc]
//   server: ok [u8 token required, server nonce Ns, server proof or ""]   (busy + why: another
//           session; the client retries later)
//   client: proof [client proof or ""]
//   server: ok, or failed + why, and closes
// where a proof is HMAC-SHA256(token, label, Nc, Ns) with label "hora-store/1 server" or
// "hora-store/1 client": each side proves the token against a nonce the other just chose, so a
// recorded proof is worth nothing on another connection. Until the handshake is done a frame
// may hold at most kMaxHandshakeBody bytes and only the next handshake step.
namespace {

using Clock = std::chrono::steady_clock;

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5, kHello = 6, kProof = 7 };
enum ReplyStatus : uint8_t { kOk = 0, kTimedOut = 1, kFailed = 2, kBusy = 3 };

const char kMagic[] = "hora-store/1";
const char kServerLabel[] = "hora-store/1 server";
const char kClientLabel[] = "hora-store/1 client";

// The largest request: a set of the largest key and value (a wait on many keys fits too).
constexpr uint32_t kMaxBody = kStoreMaxValue + kStoreMaxKey + 64;
constexpr uint32_t kMaxArgs = 1u << 16;
constexpr size_t kMinRequest = 1 + 4 + 4;
constexpr uint32_t kMaxHandshakeBody = 1024;
// Connections that have not finished the handshake: past this, a new one closes the oldest.
constexpr size_t kMaxUnproven = 64;
// A connection stops being read once this much is buffered but not yet handled.
constexpr size_t kMaxBuffered = size_t{kMaxBody} + 4 + 65536;
// Keys named in a timeout reply (the count of all missing keys travels too).
constexpr uint32_t kMaxNamedKeys = 16;
// Refused connections and failing accepts: at most one log line this often.
constexpr std::chrono::milliseconds kLogInterval{5000};

void putU32(std::string &out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void putI64(std::string &out, int64_t v) {
  const uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
uint32_t getU32(const char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
int64_t getI64(const char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return static_cast<int64_t>(v);
}

// Bounds-checked reads over one received body.
class Reader {
 public:
  Reader(const char *data, size_t size) : p_(data), end_(data + size) {}
  bool u8(uint8_t *v) {
    if (end_ - p_ < 1) return false;
    *v = static_cast<uint8_t>(*p_++);
    return true;
  }
  bool u32(uint32_t *v) {
    if (end_ - p_ < 4) return false;
    *v = getU32(p_);
    p_ += 4;
    return true;
  }
  bool bytes(std::string *v) {
    uint32_t n = 0;
    if (!u32(&n) || static_cast<size_t>(end_ - p_) < n) return false;
    v->assign(p_, n);
    p_ += n;
    return true;
  }
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  const char *here() const { return p_; }

 private:
  const char *p_;
  const char *end_;
};

std::string errnoText(int err) {
  std::string s = std::strerror(err);
  if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z' && (s.size() < 2 || !(s[1] >= 'A' && s[1] <= 'Z'))) {
    s[0] = static_cast<char>(s[0] - 'A' + 'a');
  }
  return s;
}

// Keys are binary-safe; messages show them printable.
std::string quoteKey(const std::string &key) {
  std::string out = "'";
  static const char kHex[] = "0123456789abcdef";
  for (unsigned char c : key) {
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out + "'";
}

std::string peerName(const sockaddr_storage &addr) {
  char host[NI_MAXHOST] = {0}, serv[NI_MAXSERV] = {0};
  if (getnameinfo(reinterpret_cast<const sockaddr *>(&addr), sizeof addr, host, sizeof host, serv,
                  sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return formatHostPort(host, std::atoi(serv));
}

// Which process listens on `port`, from /proc/net/tcp{,6} (socket inode) and /proc/*/fd (who
// holds that inode): "pid 1234 (python3)", or "" when /proc does not tell (other users' fds are
// unreadable without privileges).
std::string findPortOwner(int port) {
  std::set<std::string> listening, other;
  for (const char *table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
            timeout >> inode)) {
        continue;
      }
      const size_t colon = local.rfind(':');
      if (colon == std::string::npos || inode == "0") continue;
      if (std::strtol(local.c_str() + colon + 1, nullptr, 16) != port) continue;
      (state == "0A" ? listening : other).insert(inode);
    }
  }
  const std::set<std::string> &inodes = listening.empty() ? other : listening;
  if (inodes.empty()) return "";
  DIR *proc = opendir("/proc");
  if (proc == nullptr) return "";
  std::string owner;
  while (owner.empty()) {
    dirent *entry = readdir(proc);
    if (entry == nullptr) break;
    const char *pid = entry->d_name;
    if (pid[0] < '0' || pid[0] > '9') continue;
    const std::string fdDir = std::string("/proc/") + pid + "/fd";
    DIR *fds = opendir(fdDir.c_str());
    if (fds == nullptr) continue;
    while (dirent *fd = readdir(fds)) {
      char target[128] = {0};
      const std::string link = fdDir + "/" + fd->d_name;
      const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
      if (n <= 9 || std::strncmp(target, "socket:[", 8) != 0) continue;
      const std::string inode(target + 8, static_cast<size_t>(n) - 9);
      if (inodes.count(inode) == 0) continue;
      std::ifstream commFile(std::string("/proc/") + pid + "/comm");
      std::string comm;
      std::getline(commFile, comm);
      owner = std::string("pid ") + pid + (comm.empty() ? "" : " (" + comm + ")");
      break;
    }
    closedir(fds);
  }
  closedir(proc);
  return owner;
}

}  // namespace

std::string formatHostPort(const std::string &host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

// ------------------------------------------------------------------------------------------------
// Server

struct TcpStoreServer::Impl {
  enum class Stage { kHello, kProof, kReady };
  struct Connection {
    int fd = -1;
    std::string peer;
    std::string in;  // received, not yet handled from inPos on
    size_t inPos = 0;
    std::string out;  // replies not yet written
    Stage stage = Stage::kHello;
    std::string clientNonce, serverNonce;
    Clock::time_point accepted, lastRead;
    bool waiting = false;  // a get/wait is parked in waiters; later requests stay queued
    bool peerClosed = false;
    bool closeWhenFlushed = false;  // refused: the last reply goes out, then the connection closes
    bool dead = false;  // closed at the end of this loop turn
  };
  struct Waiter {
    uint64_t connection;
    uint8_t command;
    std::vector<std::string> keys;
    size_t next = 0;  // keys before this exist
    Clock::time_point deadline;
  };

  StoreServerOptions options;
  std::vector<int> listenFds;
  std::vector<std::string> listening;
  int wakeRead = -1, wakeWrite = -1;
  int port = 0;
  std::atomic<bool> stop{false};
  std::thread thread;

  // Owned by the store thread once it runs (the constructor fills none of it).
  std::map<uint64_t, Connection> connections;
  uint64_t nextConnection = 1;
  std::list<Waiter> waiters;
  std::unordered_map<std::string, std::string> data;
  // accept() failing for want of descriptors or memory: the listening sockets stay readable, so
  // they are left out of poll until this time (backoff doubling to 1 s) instead of spinning.
  Clock::time_point acceptPausedUntil{};
  std::chrono::milliseconds acceptBackoff{0};
  LogLimiter refusedLog{kLogInterval};
  LogLimiter acceptLog{kLogInterval};

  ~Impl() {
    for (int fd : listenFds) close(fd);
    for (int fd : {wakeRead, wakeWrite}) {
      if (fd >= 0) close(fd);
    }
  }

  void run();
  void acceptAll(int listenFd);
  void readFrom(Connection &c);
  void flush(Connection &c);
  void handleFrames(uint64_t id, Connection &c);
  bool handle(uint64_t id, Connection &c, Reader &body, std::string *why);
  bool handshake(uint64_t id, Connection &c, uint8_t command, std::vector<std::string> &args,
                 std::string *why);
  void reply(uint64_t id, uint8_t status, const std::string &payload);
  void protocolError(Connection &c, const std::string &why);
  void refuse(Connection &c, const std::string &why);
  Clock::time_point idleDeadline(const Connection &c) const;
  void keySet(const std::string &key);
  bool advance(Waiter &w) const;
  void answer(Waiter &w, bool timedOut);
};

Clock::time_point TcpStoreServer::Impl::idleDeadline(const Connection &c) const {
  const auto idle = std::chrono::microseconds(static_cast<int64_t>(options.idleTimeoutS * 1e6));
  if (c.stage != Stage::kReady) return c.accepted + idle;
  // Part of a request has arrived and the rest does not come.
  const size_t avail = c.in.size() - c.inPos;
  if (avail == 0 || c.waiting) return Clock::time_point::max();
  if (avail >= 4 && avail >= 4 + size_t{getU32(c.in.data() + c.inPos)}) return Clock::time_point::max();
  return c.lastRead + idle;
}

void TcpStoreServer::Impl::run() {
  pthread_setname_np(pthread_self(), "hora-store");
  // Whoever reads this process's stderr (a launcher's pipe) may stop reading: the store goes on
  // serving and drops log lines instead of blocking in write(2).
  NonBlockingLog neverBlock;
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  while (!stop.load()) {
    fds.clear();
    ids.clear();
    fds.push_back({wakeRead, POLLIN, 0});
    const bool accepting = Clock::now() >= acceptPausedUntil;
    for (int fd : listenFds) fds.push_back({fd, static_cast<short>(accepting ? POLLIN : 0), 0});
    const size_t first = fds.size();
    for (auto &[id, c] : connections) {
      short events = 0;
      if (c.in.size() - c.inPos < (c.stage == Stage::kReady ? kMaxBuffered : 4 * size_t{kMaxHandshakeBody})) {
        events |= POLLIN;
      }
      if (!c.out.empty()) events |= POLLOUT;
      fds.push_back({c.fd, events, 0});
      ids.push_back(id);
    }
    // A connection whose wait was answered during the last turn may hold queued requests.
    bool queued = false;
    Clock::time_point wake = Clock::time_point::max();
    for (auto &[id, c] : connections) {
      const size_t avail = c.in.size() - c.inPos;
      queued = queued || (!c.waiting && !c.dead && c.out.size() < kMaxBuffered && avail >= 4 &&
                          avail >= 4 + size_t{getU32(c.in.data() + c.inPos)});
      wake = std::min(wake, idleDeadline(c));
    }
    for (const Waiter &w : waiters) wake = std::min(wake, w.deadline);
    if (!accepting) wake = std::min(wake, acceptPausedUntil);
    int timeoutMs = -1;
    if (queued) {
      timeoutMs = 0;
    } else if (wake != Clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now());
      timeoutMs = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left.count() + 1, INT_MAX)));
    }
    const int ready = poll(fds.data(), fds.size(), timeoutMs);
    if (ready < 0) {
      if (errno == EINTR) continue;
      HORA_LOG(kError) << "hora-store: poll failed (" << errnoText(errno)
                       << "); the store stops and its clients lose their connections";
      break;
    }
    if (fds[0].revents != 0) {
      char drain[64];
      while (read(wakeRead, drain, sizeof drain) > 0) {
      }
    }
    for (size_t i = 1; i < first; ++i) {
      if (fds[i].revents & POLLIN) acceptAll(fds[i].fd);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = connections.find(ids[i]);
      if (it == connections.end()) continue;
      Connection &c = it->second;
      const short revents = fds[i + first].revents;
      if (revents & (POLLIN | POLLHUP | POLLERR)) readFrom(c);
      if (!c.dead) handleFrames(ids[i], c);
      if (!c.dead && !c.out.empty()) flush(c);
      if (c.peerClosed) {
        if (c.stage != Stage::kReady && !c.closeWhenFlushed) {
          refuse(c, c.in.size() == c.inPos ? "closed before the handshake finished"
                                           : "closed in the middle of a handshake message");
        }
        c.dead = true;
      }
      if (c.closeWhenFlushed && c.out.empty()) c.dead = true;
    }
    const Clock::time_point now = Clock::now();
    for (auto it = waiters.begin(); it != waiters.end();) {
      if (it->deadline <= now) {
        answer(*it, true);
        it = waiters.erase(it);
      } else {
        ++it;
      }
    }
    for (auto &[id, c] : connections) {
      if (c.dead || idleDeadline(c) > now) continue;
      if (c.stage != Stage::kReady) {
        refuse(c, c.closeWhenFlushed ? "did not read its refusal" : "no handshake within " +
                                                                          detail::concat(options.idleTimeoutS) + " s");
      } else {
        protocolError(c, "sent part of a request, then nothing for " + detail::concat(options.idleTimeoutS) + " s");
      }
      c.dead = true;
    }
    for (auto it = connections.begin(); it != connections.end();) {
      if (it->second.dead) {
        const uint64_t id = it->first;
        waiters.remove_if([id](const Waiter &w) { return w.connection == id; });
        close(it->second.fd);
        it = connections.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto &[id, c] : connections) close(c.fd);
  connections.clear();
  waiters.clear();
}

void TcpStoreServer::Impl::acceptAll(int listenFd) {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd = accept4(listenFd, reinterpret_cast<sockaddr *>(&addr), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) return;
      // Out of descriptors or memory: the pending connection stays queued and the socket
      // readable. Pause accepting (10 ms doubling to 1 s) rather than spin on it.
      acceptBackoff = std::min(std::max(acceptBackoff * 2, std::chrono::milliseconds(10)),
                               std::chrono::milliseconds(1000));
      acceptPausedUntil = Clock::now() + acceptBackoff;
      uint64_t suppressed = 0;
      if (acceptLog.allow(&suppressed)) {
        HORA_LOG(kWarning) << "hora-store: accept failed (" << errnoText(err) << ", "
                           << connections.size() << " connections open); pausing accepts"
                           << (suppressed ? " (" + std::to_string(suppressed) + " more failures since the last report)"
                                          : std::string());
      }
      return;
    }
    acceptBackoff = std::chrono::milliseconds(0);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Connection c;
    c.fd = fd;
    c.peer = peerName(addr);
    c.accepted = c.lastRead = Clock::now();
    // A connection counts against the limit only once it has finished the handshake (proved
    // the job token, where there is one). Until then it is one of at most kMaxUnproven; a new
    // one past that closes the oldest of them, so that strangers holding connections open
    // cannot keep a rank out: its handshake takes one round trip, theirs never ends.
    size_t unproven = 0;
    auto oldest = connections.end();
    for (auto it = connections.begin(); it != connections.end(); ++it) {
      if (it->second.stage == Stage::kReady || it->second.dead) continue;
      ++unproven;
      if (oldest == connections.end() || it->second.accepted < oldest->second.accepted) oldest = it;
    }
    if (unproven >= kMaxUnproven && oldest != connections.end()) {
      refuse(oldest->second, "closed to make room for a newer connection: " +
                                 std::to_string(unproven) + " connections had not finished the "
                                 "handshake (at most " + std::to_string(kMaxUnproven) + ")");
      oldest->second.dead = true;
      shutdown(oldest->second.fd, SHUT_RDWR);
    }
    connections.emplace(nextConnection++, std::move(c));
  }
}

void TcpStoreServer::Impl::readFrom(Connection &c) {
  char buffer[65536];
  // Before the handshake a connection may send one small message: a stranger streaming data
  // is cut off after a few KiB, not 64 MiB.
  const size_t cap = c.stage == Stage::kReady ? kMaxBuffered : 4 * size_t{kMaxHandshakeBody};
  while (c.in.size() - c.inPos < cap) {
    const ssize_t n = recv(c.fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      c.in.append(buffer, static_cast<size_t>(n));
      c.lastRead = Clock::now();
      continue;
    }
    if (n == 0) {
      c.peerClosed = true;  // handle what arrived, then close
    } else if (errno == EINTR) {
      continue;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
      c.dead = true;
    }
    return;
  }
}

void TcpStoreServer::Impl::flush(Connection &c) {
  size_t sent = 0;
  while (sent < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;  // POLLOUT finishes it
    } else {
      c.dead = true;
      break;
    }
  }
  c.out.erase(0, sent);
}

void TcpStoreServer::Impl::protocolError(Connection &c, const std::string &why) {
  if (c.stage != Stage::kReady) {
    refuse(c, why);
    c.dead = true;
    return;
  }
  HORA_LOG(kWarning) << "hora-store: closing the connection from " << c.peer << ": " << why;
  c.dead = true;
}

// A connection that never became a client: logged (rate-limited, so a port scan or a flood
// of strangers costs one line per few seconds), closed by the caller.
void TcpStoreServer::Impl::refuse(Connection &c, const std::string &why) {
  uint64_t suppressed = 0;
  if (!refusedLog.allow(&suppressed)) return;
  HORA_LOG(kWarning) << "hora-store: refused a connection from " << c.peer << ": " << why
                     << (suppressed ? " (and " + std::to_string(suppressed) +
                                          " more refused since the last report)"
                                    : std::string());
}

void TcpStoreServer::Impl::handleFrames(uint64_t id, Connection &c) {
  // A client whose replies pile up unread gets no more service until it reads them.
  while (!c.dead && !c.closeWhenFlushed && !c.waiting && c.out.size() < kMaxBuffered) {
    const size_t avail = c.in.size() - c.inPos;
    if (avail < 4) break;
    const uint32_t length = getU32(c.in.data() + c.inPos);
    if (c.stage != Stage::kReady && (length < kMinRequest || length > kMaxHandshakeBody)) {
      refuse(c, "not a hora store client (a first message of " + std::to_string(length) + " bytes)");
      c.dead = true;
      break;
    }
    if (length < kMinRequest) {
      protocolError(c, "request of " + std::to_string(length) + " bytes (at least " +
                           std::to_string(kMinRequest) + ")");
      break;
    }
    if (length > kMaxBody) {
      // A client of ours that went too far: tell it why, then close.
      const std::string why = "a request of " + std::to_string(length) +
                              " bytes exceeds the store's limit of " + std::to_string(kMaxBody) +
                              " bytes (keys up to " + std::to_string(kStoreMaxKey) +
                              " bytes, values up to " + std::to_string(kStoreMaxValue) + ")";
      HORA_LOG(kWarning) << "hora-store: closing the connection from " << c.peer << ": " << why;
      reply(id, kFailed, why);
      c.closeWhenFlushed = true;
      break;
    }
    if (avail < 4 + size_t{length}) break;
    Reader body(c.in.data() + c.inPos + 4, length);
    c.inPos += 4 + size_t{length};
    std::string why;
    if (!handle(id, c, body, &why)) {
      protocolError(c, why);
      break;
    }
  }
  if (c.inPos == c.in.size()) {
    c.in.clear();
    c.inPos = 0;
  } else if (c.inPos > 65536 && c.inPos > c.in.size() / 2) {
    c.in.erase(0, c.inPos);
    c.inPos = 0;
  }
}

bool TcpStoreServer::Impl::handle(uint64_t id, Connection &c, Reader &body, std::string *why) {
  uint8_t command = 0;
  uint32_t waitMs = 0, argc = 0;
  if (!body.u8(&command) || !body.u32(&waitMs) || !body.u32(&argc)) {
    *why = "truncated request header";
    return false;
  }
  if (command < kSet || command > kProof) {
    *why = "unknown command " + std::to_string(command);
    return false;
  }
  // Each argument needs at least its 4-byte length, which bounds argc by the body size too.
  if (argc > kMaxArgs || size_t{argc} * 4 > body.left()) {
    *why = "request claims " + std::to_string(argc) + " arguments";
    return false;
  }
  std::vector<std::string> args(argc);
  for (std::string &a : args) {
    if (!body.bytes(&a)) {
      *why = "argument length runs past the end of the request";
      return false;
    }
  }
  if (body.left() != 0) {
    *why = std::to_string(body.left()) + " stray bytes after the arguments";
    return false;
  }
  static const size_t kArity[] = {0, 2, 1, 2, SIZE_MAX, SIZE_MAX, 3, 1};
  if (kArity[command] != SIZE_MAX && args.size() != kArity[command]) {
    *why = "command " + std::to_string(command) + " with " + std::to_string(args.size()) +
           " arguments (expected " + std::to_string(kArity[command]) + ")";
    return false;
  }
  if (c.stage != Stage::kReady || command == kHello || command == kProof) {
    return handshake(id, c, command, args, why);
  }
  // Keys are bounded on their own (the frame bound covers values).
  for (size_t i = 0; i < args.size(); ++i) {
    const bool isValue = (command == kSet || command == kAdd) && i == 1;
    if (args[i].size() > (isValue ? kStoreMaxValue : kStoreMaxKey)) {
      const std::string message = std::string(isValue ? "a value of " : "a key of ") +
                                  std::to_string(args[i].size()) +
                                  " bytes exceeds the store's limit of " +
                                  std::to_string(isValue ? kStoreMaxValue : kStoreMaxKey) + " bytes";
      HORA_LOG(kWarning) << "hora-store: closing the connection from " << c.peer << ": " << message;
      reply(id, kFailed, message);
      c.closeWhenFlushed = true;
      return true;
    }
  }
  switch (command) {
    case kSet: {
      std::string &slot = data[args[0]];
      slot = std::move(args[1]);
      reply(id, kOk, "");
      keySet(args[0]);
      return true;
    }
    case kAdd: {
      if (args[1].size() != 8) {
        *why = "add with a delta of " + std::to_string(args[1].size()) + " bytes (expected 8)";
        return false;
      }
      const int64_t delta = getI64(args[1].data());
      auto it = data.find(args[0]);
      int64_t value = 0;
      if (it != data.end()) {
        // Counters are kept as decimal text so that get() shows them readably.
        const std::string &text = it->second;
        char *end = nullptr;
        errno = 0;
        const long long parsed = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || errno != 0 || end != text.c_str() + text.size()) {
          reply(id, kFailed, "key " + quoteKey(args[0]) + " holds a value that is not an integer");
          return true;
        }
        value = parsed;
      }
      if ((delta > 0 && value > INT64_MAX - delta) || (delta < 0 && value < INT64_MIN - delta)) {
        reply(id, kFailed, "adding " + std::to_string(delta) + " to key " + quoteKey(args[0]) +
                               " (" + std::to_string(value) + ") overflows int64");
        return true;
      }
      value += delta;
      data[args[0]] = std::to_string(value);
      std::string payload;
      putI64(payload, value);
      reply(id, kOk, payload);
      keySet(args[0]);
      return true;
    }
    case kCheck: {
      bool all = true;
      for (const std::string &k : args) all = all && data.count(k) != 0;
      reply(id, kOk, std::string(1, all ? '\1' : '\0'));
      return true;
    }
    case kGet:
    case kWait: {
      Waiter w{id, command, std::move(args), 0, Clock::now() + std::chrono::milliseconds(waitMs)};
      if (advance(w)) {
        answer(w, false);
      } else if (waitMs == 0) {
        answer(w, true);
      } else {
        // Parked: other clients keep being served while this one waits for its keys.
        c.waiting = true;
        waiters.push_back(std::move(w));
      }
      return true;
    }
  }
  return false;
}

bool TcpStoreServer::Impl::handshake(uint64_t id, Connection &c, uint8_t command,
                                     std::vector<std::string> &args, std::string *why) {
  if (c.stage == Stage::kHello && command == kHello) {
    if (args[0] != kMagic || args[2].size() != kNonceBytes) {
      *why = "not a hora store client (a hello of another protocol)";
      return false;
    }
    if (!options.session.empty() && !args[1].empty() && args[1] != options.session) {
      // A rank of a later runtime, early: rank 0 will soon serve that runtime here.
      reply(id, kBusy, "this store serves the runtime '" + options.session + "', not '" + args[1] + "'");
      c.closeWhenFlushed = true;
      return true;
    }
    c.clientNonce = std::move(args[2]);
    c.serverNonce = randomBytes(kNonceBytes);
    std::string payload(1, options.token.empty() ? '\0' : '\1');
    putU32(payload, static_cast<uint32_t>(c.serverNonce.size()));
    payload += c.serverNonce;
    const std::string proof = options.token.empty()
                                  ? std::string()
                                  : proveToken(options.token, kServerLabel, {&c.clientNonce, &c.serverNonce});
    putU32(payload, static_cast<uint32_t>(proof.size()));
    payload += proof;
    c.stage = Stage::kProof;
    reply(id, kOk, payload);
    return true;
  }
  if (c.stage == Stage::kProof && command == kProof) {
    if (!options.token.empty()) {
      const std::string expected = proveToken(options.token, kClientLabel, {&c.clientNonce, &c.serverNonce});
      if (!proofsEqual(args[0], expected)) {
        refuse(c, args[0].empty() ? "no job token (HORA_JOB_TOKEN is set for this job)"
                                  : "wrong job token (its proof does not match HORA_JOB_TOKEN)");
        reply(id, kFailed, args[0].empty()
                               ? "this store requires the job's token: set HORA_JOB_TOKEN to it"
                               : "wrong job token: HORA_JOB_TOKEN differs from the job's");
        c.closeWhenFlushed = true;
        return true;
      }
    }
    size_t members = 0;
    for (const auto &entry : connections) members += entry.second.stage == Stage::kReady ? 1 : 0;
    if (options.maxConnections > 0 && members >= options.maxConnections) {
      const std::string full = std::to_string(members) + " clients are connected (limit " +
                               std::to_string(options.maxConnections) + ")";
      refuse(c, full);
      reply(id, kBusy, "the store is full: " + full);
      c.closeWhenFlushed = true;
      return true;
    }
    c.stage = Stage::kReady;
    c.clientNonce.clear();
    c.serverNonce.clear();
    reply(id, kOk, "");
    return true;
  }
  *why = c.stage == Stage::kReady ? "a handshake message after the handshake"
                                  : "not a hora store client (a request before the handshake)";
  return false;
}

bool TcpStoreServer::Impl::advance(Waiter &w) const {
  while (w.next < w.keys.size() && data.count(w.keys[w.next]) != 0) ++w.next;
  return w.next == w.keys.size();
}

void TcpStoreServer::Impl::answer(Waiter &w, bool timedOut) {
  auto it = connections.find(w.connection);
  if (it == connections.end()) return;
  it->second.waiting = false;
  if (!timedOut) {
    reply(w.connection, kOk, w.command == kGet ? data[w.keys[0]] : std::string());
    return;
  }
  std::vector<const std::string *> missing;
  for (size_t i = w.next; i < w.keys.size(); ++i) {
    if (data.count(w.keys[i]) == 0) missing.push_back(&w.keys[i]);
  }
  std::string payload;
  putU32(payload, static_cast<uint32_t>(missing.size()));
  const uint32_t named = std::min<uint32_t>(kMaxNamedKeys, static_cast<uint32_t>(missing.size()));
  putU32(payload, named);
  for (uint32_t i = 0; i < named; ++i) {
    putU32(payload, static_cast<uint32_t>(missing[i]->size()));
    payload += *missing[i];
  }
  reply(w.connection, kTimedOut, payload);
}

void TcpStoreServer::Impl::keySet(const std::string &key) {
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (it->keys[it->next] == key && advance(*it)) {
      answer(*it, false);
      it = waiters.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpStoreServer::Impl::reply(uint64_t id, uint8_t status, const std::string &payload) {
  auto it = connections.find(id);
  if (it == connections.end()) return;
  Connection &c = it->second;
  putU32(c.out, static_cast<uint32_t>(1 + payload.size()));
  c.out.push_back(static_cast<char>(status));
  c.out += payload;
  if (!c.dead) flush(c);
}

namespace {

sockaddr_storage withPort(sockaddr_storage s, int port) {
  if (s.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6 *>(&s)->sin6_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in *>(&s)->sin_port = htons(static_cast<uint16_t>(port));
  }
  return s;
}

// Every address to listen on for `host` ("" = the wildcards: the IPv6 one as a dual-stack
// socket, reachable over IPv4 too, else the IPv4 one where the host has no IPv6).
std::vector<std::pair<sockaddr_storage, socklen_t>> bindCandidates(const std::string &host,
                                                                   const std::string &where) {
  std::vector<std::pair<sockaddr_storage, socklen_t>> out;
  if (host.empty()) {
    sockaddr_in6 any6{};
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    sockaddr_in any4{};
    any4.sin_family = AF_INET;
    any4.sin_addr.s_addr = htonl(INADDR_ANY);
    sockaddr_storage s6{}, s4{};
    std::memcpy(&s6, &any6, sizeof any6);
    std::memcpy(&s4, &any4, sizeof any4);
    return {{s6, sizeof any6}, {s4, sizeof any4}};
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo *found = nullptr;
  const int rc = getaddrinfo(host.c_str(), "0", &hints, &found);
  if (rc != 0) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "cannot serve the store on ", where, ": cannot resolve '",
               host, "' (", gai_strerror(rc), ")");
  }
  for (addrinfo *a = found; a != nullptr; a = a->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, a->ai_addr, a->ai_addrlen);
    bool seen = false;
    for (const auto &[o, len] : out) seen = seen || (len == a->ai_addrlen && std::memcmp(&o, &s, len) == 0);
    if (!seen) out.push_back({s, static_cast<socklen_t>(a->ai_addrlen)});
  }
  freeaddrinfo(found);
  return out;
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string &host, int port, StoreServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (port < 0 || port > 65535) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "store port ", port, " is outside 0..65535");
  }
  impl_->options = std::move(options);
  const std::string shown = host.empty() ? hostNameOr("this host") : host;
  const std::string where = formatHostPort(shown, port);

  // Named host: listen on each of its addresses that is on this host. Wildcard: on the first
  // wildcard that works.
  auto listenOn = [&](const std::string &h) {
    std::string lastError = "no address to bind";
    int chosenPort = port;
    for (const auto &[address, length] : bindCandidates(h, where)) {
      if (h.empty() && !impl_->listenFds.empty()) break;
      sockaddr_storage a = withPort(address, chosenPort);
      const int family = a.ss_family;
      const int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        lastError = errnoText(errno);
        continue;
      }
      const int one = 1, zero = 0;
      // SO_REUSEADDR: a restarted job can reuse the port while the last run's sockets linger in
      // TIME_WAIT. It does not let two live listeners share the port (that needs SO_REUSEPORT).
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, h.empty() ? &zero : &one, sizeof one);
      if (bind(fd, reinterpret_cast<sockaddr *>(&a), length) != 0 || listen(fd, SOMAXCONN) != 0) {
        const int err = errno;
        close(fd);
        if (err == EADDRINUSE) {
          const std::string owner = chosenPort == 0 ? "" : findPortOwner(chosenPort);
          HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "MASTER_PORT ", chosenPort, " on ", shown,
                     " is in use by ", owner.empty() ? "another process" : owner,
                     "; pick a free port or stop the process holding it");
        }
        lastError = errnoText(err);
        continue;
      }
      sockaddr_storage bound{};
      socklen_t len = sizeof bound;
      getsockname(fd, reinterpret_cast<sockaddr *>(&bound), &len);
      chosenPort = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&bound)->sin6_port
                                                     : reinterpret_cast<sockaddr_in *>(&bound)->sin_port);
      char text[NI_MAXHOST] = {0};
      getnameinfo(reinterpret_cast<sockaddr *>(&bound), len, text, sizeof text, nullptr, 0, NI_NUMERICHOST);
      impl_->listenFds.push_back(fd);
      impl_->listening.push_back(formatHostPort(text, chosenPort));
      impl_->port = chosenPort;
    }
    return lastError;
  };
  std::string lastError = listenOn(host);
  if (impl_->listenFds.empty() && !host.empty() && impl_->options.anyIfNotLocal) {
    HORA_LOG(kInfo) << "hora-store: " << host << " is not an address of this host (" << lastError
                    << "); listening on every interface (HORA_STORE_BIND chooses one)";
    lastError = listenOn("");
  }
  if (impl_->listenFds.empty()) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "cannot serve the store on ", where, ": ", lastError);
  }
  HORA_LOG(kDebug) << "hora-store: listening on " << [&] {
    std::string all;
    for (const std::string &l : impl_->listening) all += (all.empty() ? "" : ", ") + l;
    return all;
  }() << (impl_->options.token.empty() ? " (no job token)" : " (job token required)");

  int pipeFds[2];
  if (pipe2(pipeFds, O_NONBLOCK | O_CLOEXEC) != 0) {
    HORA_THROW(HORA_ERR_INTERNAL, "store: pipe2 failed: ", errnoText(errno));
  }
  impl_->wakeRead = pipeFds[0];
  impl_->wakeWrite = pipeFds[1];
  // Everything that can fail is done: the thread only serves.
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stop = true;
  const char one = 1;
  ssize_t ignored = write(impl_->wakeWrite, &one, 1);
  (void)ignored;
  impl_->thread.join();
}

int TcpStoreServer::port() const { return impl_->port; }

std::vector<std::string> TcpStoreServer::listening() const { return impl_->listening; }

// ------------------------------------------------------------------------------------------------
// Client

struct TcpStoreClient::Reply {
  uint8_t status = kOk;
  std::string payload;
};

namespace {

// One connection attempt to every address of host:port, each bounded by `deadline`. Returns the
// connected socket (non-blocking) or -1 with *why set.
int tryConnect(const std::string &host, int port, Clock::time_point deadline, std::string *why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo *found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    *why = std::string("cannot resolve '") + host + "': " + gai_strerror(rc);
    return -1;
  }
  int result = -1;
  for (addrinfo *a = found; a != nullptr && result < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      *why = errnoText(errno);
      continue;
    }
    int err = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        pollfd p{fd, POLLOUT, 0};
        const int ready = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
        err = ETIMEDOUT;
        if (ready > 0) {
          socklen_t len = sizeof err;
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        }
      }
    }
    if (err == 0) {
      // Connecting to a local port nobody listens on can, rarely, connect the socket to itself
      // (TCP simultaneous open when the kernel picks the same port as the source): not a store.
      sockaddr_storage self{}, peer{};
      socklen_t selfLen = sizeof self, peerLen = sizeof peer;
      getsockname(fd, reinterpret_cast<sockaddr *>(&self), &selfLen);
      getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &peerLen);
      if (selfLen == peerLen && std::memcmp(&self, &peer, selfLen) == 0) err = ECONNREFUSED;
    }
    if (err != 0) {
      *why = errnoText(err);
      close(fd);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    result = fd;
  }
  freeaddrinfo(found);
  return result;
}

Clock::time_point deadlineAfter(double s) {
  // Clamp so that an "infinite" timeout does not overflow the clock.
  const double capped = std::min(std::max(s, 0.0), 1e8);
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(capped * 1e6));
}

int msUntil(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left.count() + 1, INT_MAX)));
}

}  // namespace

std::shared_ptr<TcpStoreClient> TcpStoreClient::reconnect() const { return reconnect(timeoutS_); }

std::shared_ptr<TcpStoreClient> TcpStoreClient::reconnect(double timeoutS) const {
  return std::make_shared<TcpStoreClient>(host_, port_, timeoutS, options_);
}

TcpStoreClient::TcpStoreClient(const std::string &host, int port, double timeoutS,
                               StoreClientOptions options)
    : host_(host),
      port_(port),
      timeoutS_(timeoutS),
      options_(std::move(options)),
      address_(formatHostPort(host, port)) {
  if (port <= 0 || port > 65535) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "store port ", port, " is outside 1..65535");
  }
  const Clock::time_point deadline = deadlineAfter(timeoutS);
  auto backoff = std::chrono::milliseconds(10);
  std::string why = "not tried";
  for (;;) {
    full_ = closedInHandshake_ = false;  // what the last attempt met decides the message
    fd_ = tryConnect(host_, port_, deadline, &why);
    if (fd_ >= 0) {
      if (handshake(&why, std::chrono::duration<double>(deadline - Clock::now()).count()) == 0) return;
      // Refused for now (the server of an earlier runtime, or full): a fresh connection later.
      if (fd_ >= 0) close(fd_);
      fd_ = -1;
      lost_.clear();
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  if (full_ || closedInHandshake_) {
    // The store answered: it is there, but would not keep this process connected.
    HORA_THROW(HORA_ERR_TIMEOUT, "the store at ", address_, " did not let this process in for ",
               timeoutS, " s (", why, "): ",
               full_ ? "as many clients as it takes are connected (4 x WORLD_SIZE + 64); "
                       "is a process outside the job holding connections with the job's token?"
                     : "it closed this process's connections during the handshake, as it does "
                       "when connections that never finish it (a stranger's) crowd in");
  }
  HORA_THROW(HORA_ERR_TIMEOUT, "master ", address_, " unreachable after ", timeoutS, " s (",
             why, "); is rank 0 running and MASTER_ADDR/MASTER_PORT right?");
}

int TcpStoreClient::handshake(std::string *why, double timeoutS) {
  const std::string magic = kMagic;
  const std::string nonce = randomBytes(kNonceBytes);
  const double saved = timeoutS_;
  timeoutS_ = std::min(std::max(timeoutS, 0.1), saved);  // a silent stranger must not hold us
  Reply hello;
  try {
    hello = request(kHello, {&magic, &options_.session, &nonce}, 0);
  } catch (const Error &e) {
    timeoutS_ = saved;
    if (e.status() == HORA_ERR_INVALID_ARGUMENT) throw;
    *why = "handshake: " + e.message();
    if (e.status() == HORA_ERR_PEER_LOST) closedInHandshake_ = true;
    return 1;
  }
  if (hello.status == kBusy) {
    timeoutS_ = saved;
    *why = hello.payload + "; waiting for rank 0 to serve this one";
    return 1;
  }
  Reader r(hello.payload.data(), hello.payload.size());
  uint8_t required = 0;
  std::string serverNonce, serverProof;
  if (hello.status != kOk || !r.u8(&required) || !r.bytes(&serverNonce) || !r.bytes(&serverProof) ||
      r.left() != 0 || serverNonce.size() != kNonceBytes) {
    timeoutS_ = saved;
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "the store at ", address_,
               " answered the handshake with a malformed message: is another program using this port?");
  }
  const std::string &token = options_.token;
  if (required == 0 && !token.empty()) {
    timeoutS_ = saved;
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "the store at ", address_,
               " does not ask for a job token, but HORA_JOB_TOKEN is set here: rank 0 runs without "
               "it (set the same HORA_JOB_TOKEN on every rank), or a stranger serves this port");
  }
  const bool serverProved =
      !token.empty() && proofsEqual(serverProof, proveToken(token, kServerLabel, {&nonce, &serverNonce}));
  // Our proof goes out even when the store's did not check out, so that a real store with
  // another token can log the refusal.
  const std::string mine = token.empty() ? std::string() : proveToken(token, kClientLabel, {&nonce, &serverNonce});
  try {
    const Reply proof = request(kProof, {&mine}, 0);
    if (proof.status == kBusy) {  // full: members may leave; a fresh connection later
      timeoutS_ = saved;
      *why = proof.payload;
      full_ = true;
      return 1;
    }
  } catch (const Error &e) {
    timeoutS_ = saved;
    if (e.status() != HORA_ERR_INVALID_ARGUMENT) {
      *why = "handshake: " + e.message();
      return 1;
    }
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "the store at ", address_, " refused this process: ",
               e.message().substr(e.message().rfind("store: ", 0) == 0 ? 7 : 0),
               token.empty() ? " (horarun sets one for every job it starts)" : "");
  }
  timeoutS_ = saved;
  if (required != 0 && !serverProved) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "the store at ", address_,
               " could not prove it knows this job's token (HORA_JOB_TOKEN): a store of another "
               "job, or a stranger, serves this port");
  }
  return 0;
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) close(fd_);
}

void TcpStoreClient::fail(int status, const std::string &why) {
  // The stream may hold half a request or a late reply: never use it again.
  lost_ = why;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  if (status == HORA_ERR_TIMEOUT) HORA_THROW(HORA_ERR_TIMEOUT, why);
  HORA_THROW(HORA_ERR_PEER_LOST, why);
}

TcpStoreClient::Reply TcpStoreClient::request(uint8_t command,
                                              const std::vector<const std::string *> &args,
                                              double waitS) {
  size_t size = kMinRequest;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool isValue = (command == kSet || command == kAdd) && i == 1;
    if (command != kHello && command != kProof && !isValue && args[i]->size() > kStoreMaxKey) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "store key ", quoteKey(args[i]->substr(0, 64)),
                 args[i]->size() > 64 ? "..." : "", " of ", args[i]->size(),
                 " bytes exceeds the store's limit of ", kStoreMaxKey, " bytes");
    }
    if (isValue && args[i]->size() > kStoreMaxValue) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "a store value of ", args[i]->size(),
                 " bytes exceeds the store's limit of ", kStoreMaxValue, " bytes");
    }
    size += 4 + args[i]->size();
  }
  if (size > kMaxBody || args.size() > kMaxArgs) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "store request of ", size, " bytes in ", args.size(),
               " keys/values exceeds the store's limit of ", kMaxBody, " bytes and ", kMaxArgs,
               " keys");
  }
  std::string frame;
  frame.reserve(4 + size);
  putU32(frame, static_cast<uint32_t>(size));
  frame.push_back(static_cast<char>(command));
  const double waitMs = std::ceil(std::min(std::max(waitS, 0.0) * 1000.0, 4294967295.0));
  putU32(frame, static_cast<uint32_t>(waitMs));
  putU32(frame, static_cast<uint32_t>(args.size()));
  for (const std::string *a : args) {
    putU32(frame, static_cast<uint32_t>(a->size()));
    frame += *a;
  }

  std::lock_guard<std::mutex> lock(mutex_);
  const std::string lostPrefix = "lost the connection to the store at " + address_;
  if (!lost_.empty()) HORA_THROW(HORA_ERR_PEER_LOST, lost_);
  // The store answers other requests at once and get/wait at their own deadline; beyond that
  // (plus slack for a busy store) it is stuck or gone.
  const double answerS = (command == kGet || command == kWait ? waitS : std::max(timeoutS_, 1.0)) + 2.0;
  const Clock::time_point deadline = deadlineAfter(answerS);

  size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t n = send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      if (poll(&p, 1, msUntil(deadline)) == 0) {
        fail(HORA_ERR_TIMEOUT, "the store at " + address_ + " did not take a request within " +
                                   detail::concat(answerS) + " s; it is stuck or overloaded");
      }
      continue;
    }
    fail(HORA_ERR_PEER_LOST, lostPrefix + " (" + errnoText(errno) + ")");
  }

  // Header, then body.
  std::string in;
  size_t want = 4;
  bool haveHeader = false;
  char buffer[65536];
  while (in.size() < want) {
    const ssize_t n = recv(fd_, buffer, std::min(sizeof buffer, want - in.size()), 0);
    if (n > 0) {
      in.append(buffer, static_cast<size_t>(n));
      if (!haveHeader && in.size() == 4) {
        const uint32_t length = getU32(in.data());
        if (length < 1 || length > kMaxBody + 64) {
          fail(HORA_ERR_PEER_LOST, lostPrefix + " (a reply of " + std::to_string(length) +
                                       " bytes: not a hora store?)");
        }
        haveHeader = true;
        want = 4 + size_t{length};
      }
      continue;
    }
    if (n == 0) fail(HORA_ERR_PEER_LOST, lostPrefix + " (closed by the store)");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      fail(HORA_ERR_PEER_LOST, lostPrefix + " (" + errnoText(errno) + ")");
    }
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, msUntil(deadline)) == 0) {
      fail(HORA_ERR_TIMEOUT, "the store at " + address_ + " did not answer within " +
                                 detail::concat(answerS) + " s; it is stuck or overloaded");
    }
  }
  Reply reply;
  reply.status = static_cast<uint8_t>(in[4]);
  reply.payload = in.substr(5);
  if (reply.status == kFailed) HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "store: ", reply.payload);
  return reply;
}

namespace {

// The keys a timed-out get/wait reply names: "'a', 'b' and 3 more".
std::string missingKeys(const std::string &payload) {
  Reader r(payload.data(), payload.size());
  uint32_t total = 0, named = 0;
  if (!r.u32(&total) || !r.u32(&named)) return "?";
  std::string out;
  for (uint32_t i = 0; i < named; ++i) {
    std::string key;
    if (!r.bytes(&key)) break;
    out += (i == 0 ? "" : ", ") + quoteKey(key);
  }
  if (total > named) out += " and " + std::to_string(total - named) + " more";
  return out;
}

}  // namespace

void TcpStoreClient::set(const std::string &key, const std::string &value) {
  request(kSet, {&key, &value}, 0);
}

namespace {
std::atomic<bool> gAbandoned{false};  // see TcpStoreClient::takeAbandoned
}  // namespace

bool TcpStoreClient::takeAbandoned() { return gAbandoned.exchange(false); }

TcpStoreClient::Reply TcpStoreClient::waitingRequest(uint8_t command,
                                                     const std::vector<const std::string *> &args,
                                                     double waitS) {
  if (abandonKey_.empty()) return request(command, args, waitS);
  const Clock::time_point deadline = deadlineAfter(std::max(waitS, 0.0));
  for (;;) {
    const double left = std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
    const double slice = std::min(left, kAbandonSliceS);
    Reply r = request(command, args, slice);
    if (r.status != kTimedOut || slice >= left) return r;
    if (request(kCheck, {&abandonKey_}, 0).payload == std::string(1, '\1')) {
      const std::string why = request(kGet, {&abandonKey_}, 0).payload;
      gAbandoned = true;
      HORA_THROW(HORA_ERR_PEER_LOST, "horarun's agents gave up on the world this rank was forming (",
                 why, ") and form another");
    }
  }
}

std::string TcpStoreClient::get(const std::string &key) {
  Reply r = waitingRequest(kGet, {&key}, timeoutS_);
  if (r.status == kTimedOut) {
    HORA_THROW(HORA_ERR_TIMEOUT, "timed out after ", timeoutS_, " s waiting for key ",
               quoteKey(key), " in the store at ", address_);
  }
  return std::move(r.payload);
}

int64_t TcpStoreClient::add(const std::string &key, int64_t delta) {
  std::string encoded;
  putI64(encoded, delta);
  const Reply r = request(kAdd, {&key, &encoded}, 0);
  if (r.payload.size() != 8) {
    HORA_THROW(HORA_ERR_PEER_LOST, "store at ", address_, " sent a malformed reply to add");
  }
  return getI64(r.payload.data());
}

bool TcpStoreClient::check(const std::vector<std::string> &keys) {
  std::vector<const std::string *> args;
  for (const std::string &k : keys) args.push_back(&k);
  const Reply r = request(kCheck, args, 0);
  return r.payload.size() == 1 && r.payload[0] != 0;
}

void TcpStoreClient::wait(const std::vector<std::string> &keys) { wait(keys, timeoutS_); }

void TcpStoreClient::wait(const std::vector<std::string> &keys, double timeoutS) {
  if (keys.empty()) return;
  std::vector<const std::string *> args;
  for (const std::string &k : keys) args.push_back(&k);
  const Reply r = waitingRequest(kWait, args, timeoutS);
  if (r.status == kTimedOut) {
    if (keys.size() == 1) {
      HORA_THROW(HORA_ERR_TIMEOUT, "timed out after ", timeoutS, " s waiting for key ",
                 quoteKey(keys[0]), " in the store at ", address_);
    }
    HORA_THROW(HORA_ERR_TIMEOUT, "timed out after ", timeoutS, " s waiting for ",
               keys.size(), " keys in the store at ", address_, "; missing ", missingKeys(r.payload));
  }
}

void storeBarrier(TcpStoreClient &store, const std::string &prefix, int rank, int size,
                  double timeoutS, const char *done) {
  if (size <= 1) return;
  store.set(prefix + std::to_string(rank), "");
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeoutS);
  } catch (const Error &e) {
    if (e.status() != HORA_ERR_TIMEOUT) throw;
    std::string missing;
    int count = 0;
    for (int r = 0; r < size; ++r) {
      bool here = true;
      try {
        here = store.check({keys[static_cast<size_t>(r)]});
      } catch (const Error &) {
        throw e;
      }
      if (!here) {
        missing += (missing.empty() ? "" : ",") + std::to_string(r);
        ++count;
      }
    }
    HORA_THROW(HORA_ERR_TIMEOUT, count == 1 ? "rank " : "ranks ", missing, " of ", size,
               count == 1 ? " has" : " have", " not ", done, " within ", timeoutS,
               " s (HORA_TIMEOUT_S)");
  }
}

}  // namespace hora
