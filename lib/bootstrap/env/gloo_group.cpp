// SPDX-License-Identifier: Apache-2.0
// GlooGroup: Gloo rendezvous through hora's store, and the control plane on Gloo collectives.
#include "bootstrap/env/gloo_group.h"

#include <gloo/alltoall.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <dirent.h>
#include <poll.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "base/knobs.h"
#include "base/logging.h"
#include "base/process.h"
#include "bootstrap/env/auth.h"
#include "base/test_points.h"
#include "bootstrap/env/pair_auth.h"
#include "core/forming.h"

namespace hora {
namespace {

std::chrono::milliseconds toMs(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// Gloo's rendezvous store interface over hora's TCP store, every key under one prefix.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<TcpStoreClient> store, std::string prefix)
      : store_(std::move(store)), prefix_(std::move(prefix)) {}
  void set(const std::string &key, const std::vector<char> &data) override {
    store_->set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string &key) override {
    const std::string v = store_->get(prefix_ + key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string> &keys) override { store_->wait(prefixed(keys)); }
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override {
    store_->wait(prefixed(keys), static_cast<double>(timeout.count()) / 1000.0);
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string> &keys) const {
    std::vector<std::string> out;
    for (const std::string &k : keys) out.push_back(prefix_ + k);
    return out;
  }
  std::shared_ptr<TcpStoreClient> store_;
  std::string prefix_;
};

class GlooControlPlane final : public ControlPlane {
 public:
  explicit GlooControlPlane(std::shared_ptr<GlooMesh> mesh) : mesh_(std::move(mesh)) {}
  int rank() const override { return mesh_->rank(); }
  int size() const override { return mesh_->size(); }

  void allreduceAnd(std::vector<uint64_t> &words) override {
    if (words.empty() || size() == 1) return;
    glooCall(label("negotiation (waiting for every rank to start the same cycle)",
                   "the AND of every rank's words"),
             rank(), [&] {
      mesh_->allreduce(words.data(), words.size(), sizeof(uint64_t),
                       [](void *dst, const void *src, size_t n) {
                         auto *d = static_cast<uint64_t *>(dst);
                         const auto *s = static_cast<const uint64_t *>(src);
                         for (size_t i = 0; i < n; ++i) d[i] &= s[i];
                       });
    });
  }

  std::vector<std::string> gatherToRoot(const std::string &blob) override {
    if (size() == 1) return {blob};
    std::vector<std::string> out;
    glooCall(label("negotiation (gathering requests at the coordinator)",
                   "gathering every rank's words at rank 0"),
             rank(), [&] { out = mesh_->gatherToRoot(blob); });
    return out;
  }

  void broadcastFromRoot(std::string &blob) override {
    if (size() == 1) return;
    glooCall(label("negotiation (waiting for the coordinator's responses)",
                   "rank 0's words to every rank"),
             rank(), [&] { mesh_->broadcastFromRoot(blob); });
  }

 private:
  // The collective in the engine's words, or while a group forms (the phase names the purpose)
  // in plain ones.
  static const char *label(const char *negotiating, const char *forming) {
    return FormingScope::current().empty() ? negotiating : forming;
  }
  std::shared_ptr<GlooMesh> mesh_;
};

// How long a peer-loss error waits for a named peer on this host to be seen gone (see peerIn).
constexpr std::chrono::milliseconds kPeerExitSettle{1000};

bool contains(const std::string &text, const char *needle) {
  return text.find(needle) != std::string::npos;
}

// Which rank a Gloo error is about. Gloo names only a socket address ("Connection closed by peer
// [10.0.0.2]:40213"): on the side that connected, the address the peer's pair listens on. So
// every group learns, when it connects, each peer's listening address, host and pid, and
// records them here, process-wide, for the error path: the address names the peer where it
// appears; otherwise a peer on this host that has exited does.
class PeerAddressBook {
 public:
  struct Peer {
    std::string who;  // "rank 2 of 4"
    std::string host;
    long pid = 0;
  };
  static PeerAddressBook &instance() {
    static auto *book = new PeerAddressBook();  // never destroyed: errors may come at exit
    return *book;
  }
  void add(const std::string &address, Peer peer) {
    std::lock_guard<std::mutex> lock(mutex_);
    byAddress_[address] = std::move(peer);
  }
  void remove(const std::string &address) {
    std::lock_guard<std::mutex> lock(mutex_);
    byAddress_.erase(address);
  }
  // Who `text` is about, for the error message: the peer whose recorded address it holds, and
  // the peers on this host that have exited (a survivor may see a peer that left after its own
  // error before it sees the first loss), e.g. "rank 2 of 4 (pid 123, exited)" or "rank 0 of 4;
  // exited: rank 2 of 4 (pid 123)". "" if neither is known.
  //
  // With `settle` > 0 (a lost connection), a named peer on this host that does not yet look gone
  // is looked at again until `settle` has passed: a peer that closed its end on purpose (its own
  // shutdown) may exit a moment later, and on a loaded host the survivor can read the reset
  // before the dying peer's state says so. The wait is bounded and happens only on the error path.
  std::string peerIn(const std::string &text, std::chrono::milliseconds settle) const {
    std::map<std::string, Peer> peers;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      peers = byAddress_;  // not held across the waits below
    }
    const Peer *named = nullptr;
    for (size_t open = text.find('['); open != std::string::npos && named == nullptr;
         open = text.find('[', open + 1)) {
      const size_t close = text.find("]:", open);
      if (close == std::string::npos) break;
      size_t end = close + 2;
      while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
      auto it = peers.find(text.substr(open, end - open));
      if (it != peers.end()) named = &it->second;
    }
    const std::string here = hostName();
    auto local = [&](const Peer &p) { return p.host == here && p.pid > 0; };
    if (named != nullptr && local(*named) && settle.count() > 0) {
      const auto deadline = std::chrono::steady_clock::now() + settle;
      while (!processGone(named->pid) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    std::string out = named != nullptr ? named->who : "";
    std::string others;
    for (const auto &entry : peers) {
      const Peer &p = entry.second;
      if (!local(p) || !processGone(p.pid)) continue;
      if (&p == named) {
        out += detail::concat(" (pid ", p.pid, ", exited)");
      } else {
        others += detail::concat(others.empty() ? "" : ", ", p.who, " (pid ", p.pid, ")");
      }
    }
    if (others.empty()) return out;
    return out.empty() ? others + " exited" : out + "; exited: " + others;
  }

 private:
  mutable std::mutex mutex_;  // guards byAddress_ (Gloo's threads and the engine's read it)
  std::map<std::string, Peer> byAddress_;
};

struct PeerCard {
  std::string address, host;
  long pid = 0;
};

// Every rank sends each peer the address of its own pair to that peer, its host and its pid
// (one 320-byte slot a peer).
std::vector<PeerCard> exchangePeerCards(const std::shared_ptr<gloo::Context> &context) {
  constexpr size_t kWidth = 320;
  const auto n = static_cast<size_t>(context->size);
  std::vector<char> mine(n * kWidth, '\0'), theirs(n * kWidth, '\0');
  const std::string tail = "\n" + hostName() + "\n" + std::to_string(getpid());
  for (int peer = 0; peer < context->size; ++peer) {
    if (peer == context->rank) continue;
    const std::string card = context->getPair(peer)->address().str() + tail;
    std::memcpy(&mine[static_cast<size_t>(peer) * kWidth], card.data(),
                std::min(card.size(), kWidth - 1));
  }
  gloo::AlltoallOptions opts(context);
  opts.setInput(mine.data(), mine.size());
  opts.setOutput(theirs.data(), theirs.size());
  gloo::alltoall(opts);
  std::vector<PeerCard> out(n);
  for (size_t peer = 0; peer < n; ++peer) {
    if (static_cast<int>(peer) == context->rank) continue;
    const std::string card(&theirs[peer * kWidth]);
    const size_t a = card.find('\n'), b = card.rfind('\n');
    if (a == std::string::npos || b == a) continue;
    out[peer].address = card.substr(0, a);
    out[peer].host = card.substr(a + 1, b - a - 1);
    out[peer].pid = std::atol(card.c_str() + b + 1);
  }
  return out;
}


// "1,3" for messages.
std::string rankWords(const std::vector<int> &ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out;
}

// One exchange of `width` bytes with every peer over its pair: out[peer] goes to that peer,
// in[peer] comes from it. Throws Error(HORA_ERR_TIMEOUT) naming the peers that sent nothing.
void exchangeWithPeers(const std::shared_ptr<gloo::Context> &context, std::vector<char> &out,
                       std::vector<char> &in, size_t width, std::chrono::milliseconds timeout,
                       const char *what) {
  const int n = context->size, me = context->rank;
  const uint64_t slot = static_cast<uint64_t>(context->nextSlot());
  auto send = context->createUnboundBuffer(out.data(), out.size());
  auto recv = context->createUnboundBuffer(in.data(), in.size());
  for (int peer = 0; peer < n; ++peer) {
    if (peer == me) continue;
    recv->recv(peer, slot, static_cast<size_t>(peer) * width, width);
    send->send(peer, slot, static_cast<size_t>(peer) * width, width);
  }
  std::vector<bool> heard(static_cast<size_t>(n), false);
  heard[static_cast<size_t>(me)] = true;
  try {
    for (int i = 0; i + 1 < n; ++i) {
      int from = -1;
      recv->waitRecv(&from, timeout);
      if (from >= 0 && from < n) heard[static_cast<size_t>(from)] = true;
    }
    for (int i = 0; i + 1 < n; ++i) send->waitSend(nullptr, timeout);
  } catch (const std::exception &e) {
    std::vector<int> silent;
    for (int r = 0; r < n; ++r) {
      if (!heard[static_cast<size_t>(r)]) silent.push_back(r);
    }
    HORA_THROW(HORA_ERR_TIMEOUT, "checking the job token on the gloo mesh (", what, "): ",
               silent.empty() ? std::string("a peer") : rankWords(silent), " of ", n,
               " did not answer rank ", me, " in time (", e.what(), ")");
  }
}

}  // namespace

void authenticateGlooPairs(const std::shared_ptr<gloo::Context> &context, const std::string &token,
                           double timeoutS) {
  if (token.empty() || context->size == 1) return;
  const int n = context->size, me = context->rank;
  const auto timeout = toMs(timeoutS);
  const std::string label = "hora-pair/1";
  auto slotOf = [](std::vector<char> &v, int peer, size_t width) { return &v[static_cast<size_t>(peer) * width]; };
  // Round 1: a fresh nonce for each peer.
  std::vector<char> myNonces(static_cast<size_t>(n) * kNonceBytes), theirNonces(myNonces.size());
  const std::string random = randomBytes(myNonces.size());
  std::memcpy(myNonces.data(), random.data(), random.size());
  exchangeWithPeers(context, myNonces, theirNonces, kNonceBytes, timeout, "nonces");
  // Round 2: answer each peer's nonce, bound to both ranks and to our own nonce.
  std::vector<char> myProofs(static_cast<size_t>(n) * kProofBytes), theirProofs(myProofs.size());
  const std::string meText = std::to_string(me);
  for (int peer = 0; peer < n; ++peer) {
    if (peer == me) continue;
    const std::string peerText = std::to_string(peer);
    const std::string theirs(slotOf(theirNonces, peer, kNonceBytes), kNonceBytes);
    const std::string mine(slotOf(myNonces, peer, kNonceBytes), kNonceBytes);
    const std::string proof = proveToken(token, label, {&meText, &peerText, &theirs, &mine});
    std::memcpy(slotOf(myProofs, peer, kProofBytes), proof.data(), kProofBytes);
  }
  exchangeWithPeers(context, myProofs, theirProofs, kProofBytes, timeout, "proofs");
  std::vector<int> failed;
  for (int peer = 0; peer < n; ++peer) {
    if (peer == me) continue;
    const std::string peerText = std::to_string(peer);
    const std::string theirs(slotOf(theirNonces, peer, kNonceBytes), kNonceBytes);
    const std::string mine(slotOf(myNonces, peer, kNonceBytes), kNonceBytes);
    const std::string expected = proveToken(token, label, {&peerText, &meText, &mine, &theirs});
    if (!proofsEqual(std::string(slotOf(theirProofs, peer, kProofBytes), kProofBytes), expected)) {
      failed.push_back(peer);
    }
  }
  if (!failed.empty()) {
    HORA_LOG(kWarning) << "gloo mesh: the connection to " << rankWords(failed)
                       << " did not prove the job token";
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "the gloo connection from rank ", me, " to ",
               rankWords(failed), " of ", n,
               " did not prove the job token (HORA_JOB_TOKEN): a process without it took that "
               "rank's place, or the ranks were started with different tokens");
  }
}

namespace {
}  // namespace

void throwGlooError(const char *what, int rank, const std::exception &e, const char *file,
                    int line) {
  const std::string text = e.what();
  hora_status_t status = HORA_ERR_BACKEND;
  if (contains(text, "Timed out") || contains(text, "timed out") || contains(text, "Timeout") ||
      contains(text, "timeout")) {
    status = HORA_ERR_TIMEOUT;
  } else if (contains(text, "closed") || contains(text, "reset") || contains(text, "Broken pipe") ||
             contains(text, "Connection refused") || contains(text, "EOF")) {
    status = HORA_ERR_PEER_LOST;
  }
  const std::string peer = PeerAddressBook::instance().peerIn(
      text, status == HORA_ERR_PEER_LOST ? kPeerExitSettle : std::chrono::milliseconds(0));
  throw Error(status,
              detail::concat(what, " failed on rank ", rank, " (gloo): ",
                             peer.empty() ? "" : status == HORA_ERR_PEER_LOST
                                                     ? "lost " + peer + ": "
                                                     : "waiting for " + peer + ": ",
                             text),
              file, line);
}

// ---- GlooMesh ----------------------------------------------------------------------------------

namespace {

// After setup the mesh owns each pair's socket: messages are raw bytes matched by order (the
// lengths are known to both sides), and a control message whose length only the sender knows
// travels as [u64 length][bytes].

// Recursive doubling sends the whole buffer log2(size) times but takes log2(size) rounds; the
// ring sends 2(size-1)/size of it in 2(size-1) rounds and reduces only its share. Measured on 2
// local ranks with full-duplex transfers, the ring wins from about 64 KiB up
// (docs/gloo-speed.md).
constexpr size_t kDoublingLimit = size_t{64} << 10;

// The socket of each pair, found by both of its ends: Gloo does not hand it out. The local end
// alone is not enough: where this rank connected (rather than accepted), the kernel may give two
// of its pairs' connections one local port, since their remote ends differ, and a socket found by
// that port alone can be the pair to another rank (whose messages then go to the wrong peer,
// seen as a lost message).
std::vector<int> pairSockets(gloo::Context &context, const std::vector<std::string> &remote) {
  std::vector<std::pair<std::string, std::string>> ends(static_cast<size_t>(context.size));
  for (int peer = 0; peer < context.size; ++peer) {
    if (peer == context.rank) continue;
    ends[static_cast<size_t>(peer)] = {context.getPair(peer)->address().str(),
                                       remote[static_cast<size_t>(peer)]};
  }
  return socketsByEnds(ends);
}

}  // namespace

std::vector<int> socketsByEnds(const std::vector<std::pair<std::string, std::string>> &ends) {
  std::map<std::pair<std::string, std::string>, int> byEnds;
  if (DIR *dir = opendir("/proc/self/fd")) {
    while (dirent *entry = readdir(dir)) {
      const int fd = std::atoi(entry->d_name);
      struct stat st {};
      if (entry->d_name[0] < '0' || entry->d_name[0] > '9' || fstat(fd, &st) != 0 ||
          !S_ISSOCK(st.st_mode)) {
        continue;
      }
      sockaddr_storage local{}, peer{};
      socklen_t localLength = sizeof local, peerLength = sizeof peer;
      if (getsockname(fd, reinterpret_cast<sockaddr *>(&local), &localLength) != 0 ||
          (local.ss_family != AF_INET && local.ss_family != AF_INET6) ||
          getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &peerLength) != 0) {
        continue;  // not a connected inet socket
      }
      byEnds[{gloo::transport::tcp::Address(local).str(),
              gloo::transport::tcp::Address(peer).str()}] = fd;
    }
    closedir(dir);
  }
  std::vector<int> out(ends.size(), -1);
  for (size_t i = 0; i < ends.size(); ++i) {
    if (ends[i].first.empty()) continue;
    auto it = byEnds.find(ends[i]);
    if (it != byEnds.end()) out[i] = it->second;
  }
  return out;
}

namespace {

}  // namespace

GlooMesh::GlooMesh(std::shared_ptr<gloo::Context> context,
                   const std::vector<std::string> &peerAddresses)
    : context_(std::move(context)), rank_(context_->rank), size_(context_->size) {
  const auto timeout = context_->getTimeout();
  timeoutMs_ = timeout == gloo::kNoTimeout ? -1 : static_cast<int64_t>(timeout.count());
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) context_->getPair(peer)->setSync(/*sync=*/true, /*busyPoll=*/false);
  }
  sockets_ = pairSockets(*context_, peerAddresses);
  peerNames_.assign(static_cast<size_t>(size_), std::string());
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const int fd = sockets_[static_cast<size_t>(peer)];
    if (fd < 0) {
      throw std::runtime_error(detail::concat("no socket found for the gloo pair to rank ", peer));
    }
    sockaddr_storage addr{};
    socklen_t length = sizeof addr;
    peerNames_[static_cast<size_t>(peer)] =
        getpeername(fd, reinterpret_cast<sockaddr *>(&addr), &length) == 0
            ? gloo::transport::tcp::Address(addr).str()
            : "";
    // Gloo sized the send buffer for the small messages of the setup (which also turned the
    // kernel's autotuning off): give a large transfer room to stream. The kernel clamps it to
    // net.core.wmem_max.
    const int sendBuffer = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sendBuffer, sizeof sendBuffer);
  }
}

uint8_t *GlooMesh::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void GlooMesh::interrupt(const Status &why) {
  if (!interrupted_.raise(why)) return;
  for (int fd : sockets_) {
    if (fd >= 0) shutdown(fd, SHUT_RDWR);  // the descriptor stays open: no reuse race
  }
}

void GlooMesh::fail(int peer, const char *what, int error) const {
  interrupted_.check();  // a shut-down socket fails as a lost peer would: say why instead
  const std::string &name = peerNames_[static_cast<size_t>(peer)];
  if (error == 0) {
    throw std::runtime_error(detail::concat("Connection closed by peer ", name, " (rank ", peer,
                                            ") while ", what));
  }
  throw std::runtime_error(
      detail::concat(what, " rank ", peer, " ", name, ": ", std::strerror(error),
                     error == EPIPE || error == ECONNRESET ? " (connection reset)" : ""));
}

size_t GlooMesh::sendSome(int to, const uint8_t *data, size_t bytes) {
  const ssize_t n = ::send(sockets_[static_cast<size_t>(to)], data, std::min(slice(), bytes),
                           MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n > 0) return static_cast<size_t>(n);
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) fail(to, "writing to", errno);
  return 0;
}

size_t GlooMesh::recvSome(int from, uint8_t *data, size_t bytes) {
  const ssize_t n =
      ::recv(sockets_[static_cast<size_t>(from)], data, std::min(slice(), bytes), MSG_DONTWAIT);
  if (n > 0) return static_cast<size_t>(n);
  if (n == 0) fail(from, "reading", 0);
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) fail(from, "reading from", errno);
  return 0;
}

void GlooMesh::await(int to, int from, Deadline &deadline, bool brief) {
  interrupted_.check();
  pollfd fds[2];
  nfds_t count = 0;
  if (to >= 0) fds[count++] = {sockets_[static_cast<size_t>(to)], POLLOUT, 0};
  if (from >= 0) {
    const int fd = sockets_[static_cast<size_t>(from)];
    // The messages of a collective alternate in both directions, which puts Linux's TCP in its
    // interactive mode: it delays ACKs to ride on the next reply, and a sender that needs them
    // (more in flight than the window it was given) waits for the 40 ms delayed-ACK timer or a
    // tail-loss probe. Quick ACKs for what is read next avoid that.
    const int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &on, sizeof on);
    if (count == 1 && fds[0].fd == fd) {
      fds[0].events |= POLLIN;
    } else {
      fds[count++] = {fd, POLLIN, 0};
    }
  }
  if (brief && spinUs_.count() > 0) {
    // A reply to a small message comes within one network round trip when the peer is running:
    // looking for it spares this thread a sleep and a wake-up (bare sockets between two
    // namespace hosts: 20 against 85 us for two exchanges, bench/hora_link.cpp).
    const auto end = std::chrono::steady_clock::now() + spinUs_;
    do {
      if (poll(fds, count, 0) > 0) return;
      sched_yield();  // a peer on this core may be the one to answer
    } while (std::chrono::steady_clock::now() < end);
  }
  int waitMs = -1;
  if (timeoutMs_ >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline.at - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      const int peer = from >= 0 ? from : to;
      throw std::runtime_error(detail::concat("Timed out after ", timeoutMs_,
                                              " ms waiting for rank ", peer, " ",
                                              peerNames_[static_cast<size_t>(peer)]));
    }
    waitMs = static_cast<int>(std::min<int64_t>(left + 1, 1 << 30));
  }
  if (poll(fds, count, waitMs) < 0 && errno != EINTR) {
    throw std::runtime_error(detail::concat("poll: ", std::strerror(errno)));
  }
}

void GlooMesh::Deadline::progressed() {
  if (patience.count() >= 0) at = std::chrono::steady_clock::now() + patience;
}

void GlooMesh::exchange(int to, const void *send, size_t sendBytes, int from, void *recv,
                        size_t recvBytes, const std::function<void(size_t, size_t)> &onChunk) {
  if (to < 0) sendBytes = 0;
  if (from < 0) recvBytes = 0;
  if (sendBytes == 0 && recvBytes == 0) return;
  const auto *src = static_cast<const uint8_t *>(send);
  auto *dst = static_cast<uint8_t *>(recv);
  size_t sent = 0, got = 0, reduced = 0;
  Deadline deadline(timeoutMs_);
  while (sent < sendBytes || got < recvBytes) {
    size_t moved = 0;
    if (sent < sendBytes) {
      const size_t n = sendSome(to, src + sent, sendBytes - sent);
      sent += n;
      moved += n;
    }
    if (got < recvBytes) {
      const size_t n = recvSome(from, dst + got, recvBytes - got);
      got += n;
      moved += n;
      while (onChunk && (got - reduced >= chunkBytes_ || (got == recvBytes && reduced < got))) {
        const size_t length = std::min(chunkBytes_, got - reduced);
        onChunk(reduced, length);
        reduced += length;
      }
    }
    if (moved > 0) {
      deadline.progressed();
    } else {
      await(sent < sendBytes ? to : -1, got < recvBytes ? from : -1, deadline,
            sendBytes + recvBytes <= chunkBytes_);
    }
  }
}

void GlooMesh::allreduce(void *buf, size_t count, size_t elementSize, const Reduce &reduce) {
  if (size_ == 1 || count == 0) return;
  const size_t bytes = count * elementSize;
  if (bytes <= kDoublingLimit || count < static_cast<size_t>(size_)) {
    recursiveDoubling(buf, bytes, elementSize, reduce);
  } else {
    ring(buf, count, elementSize, reduce);
  }
}

// Pairs of ranks swap their whole buffers and combine, log2(size) times; with a size that is
// not a power of two, the first 2 x extra ranks fold in pairs first and get the result back
// last. Both partners of a swap compute lower-rank op higher-rank from equal operands, so every
// rank ends with the same bits.
void GlooMesh::recursiveDoubling(void *buf, size_t bytes, size_t elementSize, const Reduce &reduce) {
  auto *data = static_cast<uint8_t *>(buf);
  uint8_t *theirs = scratch(bytes);
  const size_t count = bytes / elementSize;
  auto combine = [&](int peer) {
    if (peer < rank_) {
      reduce(theirs, data, count);
      std::memcpy(data, theirs, bytes);
    } else {
      reduce(data, theirs, count);
    }
  };
  int pow2 = 1;
  while (pow2 * 2 <= size_) pow2 *= 2;
  const int extra = size_ - pow2;
  int virt = rank_ - extra;
  if (rank_ < 2 * extra) {
    if (rank_ % 2 == 0) {
      exchange(rank_ + 1, data, bytes, -1, nullptr, 0);
      virt = -1;
    } else {
      exchange(-1, nullptr, 0, rank_ - 1, theirs, bytes);
      combine(rank_ - 1);
      virt = rank_ / 2;
    }
  }
  if (virt >= 0) {
    for (int mask = 1; mask < pow2; mask <<= 1) {
      const int other = virt ^ mask;
      const int peer = other < extra ? 2 * other + 1 : other + extra;
      exchange(peer, data, bytes, peer, theirs, bytes);
      combine(peer);
    }
  }
  if (rank_ < 2 * extra) {
    if (rank_ % 2 == 1) {
      exchange(rank_ - 1, data, bytes, -1, nullptr, 0);
    } else {
      exchange(-1, nullptr, 0, rank_ + 1, data, bytes);
    }
  }
}

// Reduce-scatter then allgather around the ring, size blocks of whole elements. Each block is
// reduced along one fixed chain of ranks, then copied to everyone: the same bits everywhere.
//
// The 2(size-1) steps run as one stream each way: step k sends the block that step k-1 received
// (reduced, during the reduce-scatter), so its bytes go out as soon as they have been reduced or
// received, without waiting for the step to end on either side. Receiving never waits for
// anything, so the stream cannot deadlock.
void GlooMesh::ring(void *buf, size_t count, size_t elementSize, const Reduce &reduce) {
  auto *data = static_cast<uint8_t *>(buf);
  const auto n = static_cast<size_t>(size_);
  std::vector<size_t> offset(n + 1, 0);
  for (size_t b = 0; b < n; ++b) {
    offset[b + 1] = offset[b] + (count / n + (b < count % n ? 1 : 0)) * elementSize;
  }
  auto block = [&](int b) { return static_cast<size_t>((b % size_ + size_) % size_); };
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  const int scatterSteps = size_ - 1, steps = 2 * (size_ - 1);
  auto outBlock = [&](int k) {
    return k < scatterSteps ? block(rank_ - k) : block(rank_ + 1 - (k - scatterSteps));
  };
  auto inBlock = [&](int k) {
    return k < scatterSteps ? block(rank_ - k - 1) : block(rank_ - (k - scatterSteps));
  };
  auto length = [&](size_t b) { return offset[b + 1] - offset[b]; };
  uint8_t *theirs = scratch(offset[1] - offset[0]);  // block 0 is the largest
  int sendStep = 0, recvStep = 0;
  size_t sent = 0;            // bytes of step sendStep's block gone out
  size_t got = 0, done = 0;   // bytes of step recvStep's block received, and reduced (or final)
  Deadline deadline(timeoutMs_);
  while (sendStep < steps || recvStep < steps) {
    size_t moved = 0;
    size_t ready = 0;  // how much of the current send block may go out
    if (sendStep < steps) {
      const size_t total = length(outBlock(sendStep));
      ready = sendStep == 0 || sendStep - 1 < recvStep ? total : done;
      // While the block is still being reduced, send whole slices only: fewer, larger writes.
      if (ready < total) ready = sent + (ready - sent) / slice() * slice();
      if (sent < ready) {
        const size_t n = sendSome(right, data + offset[outBlock(sendStep)] + sent, ready - sent);
        sent += n;
        moved += n;
      }
      if (sent == total) {
        ++sendStep;
        sent = 0;
        continue;
      }
    }
    if (recvStep < steps) {
      const size_t in = inBlock(recvStep), total = length(in);
      uint8_t *mine = data + offset[in];
      const bool reducing = recvStep < scatterSteps;
      if (got < total) {
        const size_t n = recvSome(left, (reducing ? theirs : mine) + got, total - got);
        got += n;
        moved += n;
      }
      if (reducing) {
        while (got - done >= chunkBytes_ || (got == total && done < got)) {
          const size_t chunk = std::min(chunkBytes_, got - done);
          reduce(mine + done, theirs + done, chunk / elementSize);
          done += chunk;
        }
      } else {
        done = got;
      }
      if (done == total) {
        ++recvStep;
        got = done = 0;
        continue;
      }
    }
    if (moved > 0) {
      deadline.progressed();
    } else {
      const bool canSend = sendStep < steps && sent < ready;
      await(canSend ? right : -1, recvStep < steps ? left : -1, deadline);
    }
  }
}

void GlooMesh::broadcast(void *buf, size_t bytes, int root) {
  if (size_ == 1 || bytes == 0) return;
  const int virt = (rank_ - root + size_) % size_;
  int mask = 1;
  for (; mask < size_; mask <<= 1) {
    if (virt & mask) {
      exchange(-1, nullptr, 0, (virt - mask + root) % size_, buf, bytes);
      break;
    }
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (virt + mask < size_) exchange((virt + mask + root) % size_, buf, bytes, -1, nullptr, 0);
  }
}

void GlooMesh::allgatherv(const void *in, void *out, const std::vector<size_t> &bytes) {
  const auto n = static_cast<size_t>(size_);
  std::vector<size_t> offset(n + 1, 0);
  for (size_t r = 0; r < n; ++r) offset[r + 1] = offset[r] + bytes[r];
  auto *data = static_cast<uint8_t *>(out);
  const auto me = static_cast<size_t>(rank_);
  if (bytes[me] > 0 && data + offset[me] != in) std::memmove(data + offset[me], in, bytes[me]);
  auto block = [&](int b) { return static_cast<size_t>((b % size_ + size_) % size_); };
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  for (int step = 0; step + 1 < size_; ++step) {
    const size_t send = block(rank_ - step), recv = block(rank_ - step - 1);
    exchange(right, data + offset[send], bytes[send], left, data + offset[recv], bytes[recv]);
  }
}

void GlooMesh::alltoallv(const void *in, const std::vector<size_t> &sendBytes, void *out,
                         const std::vector<size_t> &recvBytes) {
  const auto n = static_cast<size_t>(size_);
  std::vector<size_t> sendAt(n + 1, 0), recvAt(n + 1, 0);
  for (size_t r = 0; r < n; ++r) {
    sendAt[r + 1] = sendAt[r] + sendBytes[r];
    recvAt[r + 1] = recvAt[r] + recvBytes[r];
  }
  const auto *src = static_cast<const uint8_t *>(in);
  auto *dst = static_cast<uint8_t *>(out);
  const auto me = static_cast<size_t>(rank_);
  if (sendBytes[me] > 0) std::memmove(dst + recvAt[me], src + sendAt[me], sendBytes[me]);
  for (int step = 1; step < size_; ++step) {
    const auto to = static_cast<size_t>((rank_ + step) % size_);
    const auto from = static_cast<size_t>((rank_ + size_ - step) % size_);
    exchange(static_cast<int>(to), src + sendAt[to], sendBytes[to], static_cast<int>(from),
             dst + recvAt[from], recvBytes[from]);
  }
}

void GlooMesh::sendBlob(int to, const std::string &blob) {
  const uint64_t length = blob.size();
  uint8_t *message = scratch(sizeof length + blob.size());
  std::memcpy(message, &length, sizeof length);
  std::memcpy(message + sizeof length, blob.data(), blob.size());
  exchange(to, message, sizeof length + blob.size(), -1, nullptr, 0);
}

std::string GlooMesh::recvBlob(int from) {
  uint64_t length = 0;
  exchange(-1, nullptr, 0, from, &length, sizeof length);
  std::string blob(length, '\0');
  exchange(-1, nullptr, 0, from, blob.data(), blob.size());
  return blob;
}

std::vector<std::string> GlooMesh::gatherToRoot(const std::string &blob) {
  if (rank_ != 0) {
    sendBlob(0, blob);
    return {};
  }
  std::vector<std::string> out(static_cast<size_t>(size_));
  out[0] = blob;
  for (int r = 1; r < size_; ++r) out[static_cast<size_t>(r)] = recvBlob(r);
  return out;
}

void GlooMesh::broadcastFromRoot(std::string &blob) {
  int mask = 1;
  for (; mask < size_; mask <<= 1) {
    if (rank_ & mask) {
      blob = recvBlob(rank_ - mask);
      break;
    }
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (rank_ + mask < size_) sendBlob(rank_ + mask, blob);
  }
}

GlooGroup::GlooGroup(std::shared_ptr<TcpStoreClient> store, const std::string &prefix, int rank,
                     int size, const std::string &localAddress, double timeoutS,
                     std::unique_ptr<Presence> presence)
    : timeoutS_(timeoutS), presence_(std::move(presence)) {
  Presence *word = presence_.get();
  formingPhase(word, rank, size, "connecting the gloo mesh", [&] {
    glooCall("connecting the gloo mesh", rank, [&] {
      gloo::transport::tcp::attr attr;
      attr.hostname = localAddress;
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context->setTimeout(toMs(timeoutS));
      StoreAdapter adapter(store, prefix);
      context->connectFullMesh(adapter, device);
      context_ = context;
    });
  });
  // Before anything travels on the mesh: every pair proves the job token (no token: nothing).
  formingPhase(word, rank, size, "checking the job token on the gloo mesh", [&] {
    glooCall("checking the job token on the gloo mesh", rank,
             [&] { authenticateGlooPairs(context_, store->token(), timeoutS); });
  });
  std::vector<PeerCard> cards;
  formingPhase(word, rank, size, "exchanging the gloo mesh's addresses", [&] {
    glooCall("exchanging the mesh's addresses", rank, [&] { cards = exchangePeerCards(context_); });
  });
  for (int peer = 0; peer < size; ++peer) {
    const PeerCard &card = cards[static_cast<size_t>(peer)];
    if (peer == rank || card.address.empty()) continue;
    HORA_LOG(kDebug) << "gloo: rank " << peer << " (" << card.host << ", pid " << card.pid
                     << ")'s pair to rank " << rank << " listens at " << card.address;
    PeerAddressBook::instance().add(
        card.address, {detail::concat("rank ", peer, " of ", size), card.host, card.pid});
    peerAddresses_.push_back(card.address);
  }
  // From here on every message of this group goes through the mesh, in the caller's thread. A
  // pair taken out of Gloo's device thread on one side only is a trap: bytes that a rank which
  // has switched writes to a peer which has not are read by the peer's Gloo device thread as the
  // header of a Gloo message, and are lost (the peer then waits for them until the timeout).
  // So no rank writes to the mesh until every rank has switched: each says so in the store, and
  // waits for the others to say so, before its first transfer.
  formingPhase(word, rank, size, "switching the gloo mesh to hora's transfers", [&] {
    testPoint("mesh-switch", rank);
    std::vector<std::string> remote(static_cast<size_t>(size));
    for (int peer = 0; peer < size; ++peer) remote[static_cast<size_t>(peer)] = cards[static_cast<size_t>(peer)].address;
    glooCall("switching the gloo mesh to synchronous pairs", rank,
             [&] { mesh_ = std::make_shared<GlooMesh>(context_, remote); });
    storeBarrier(*store, prefix + "switched/", rank, size, timeoutS,
                 "switched its gloo pairs to hora's transfers");
  });
  plane_ = std::make_unique<GlooControlPlane>(mesh_);
}

GlooGroup::~GlooGroup() {
  for (const std::string &address : peerAddresses_) {
    if (!address.empty()) PeerAddressBook::instance().remove(address);
  }
}

}  // namespace hora
