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
#include <sys/uio.h>
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
#include "core/collectives/link_backend.h"
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

void throwGlooError(const char *what, int rank, const std::exception &e, const char *file,
                    int line) {
  const auto *mesh = dynamic_cast<const MeshError *>(&e);
  const std::string text = mesh != nullptr ? mesh->message() : e.what();
  hora_status_t status = HORA_ERR_BACKEND;
  if (mesh != nullptr) {
    status = mesh->status();  // the mesh's own transfers say what failed
  } else if (contains(text, "Timed out") || contains(text, "timed out") || contains(text, "Timeout") ||
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
    : context_(std::move(context)), rank_(context_->rank), size_(context_->size),
      sends_(static_cast<size_t>(size_)), recvs_(static_cast<size_t>(size_)) {
  tuning_.smallBytes = size_t{64} << 10;
  tuning_.chunkBytes = size_t{64} << 10;
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
    throw MeshError(HORA_ERR_PEER_LOST, detail::concat("Connection closed by peer ", name, " (rank ",
                                                       peer, ") while ", what));
  }
  const bool lost = error == EPIPE || error == ECONNRESET || error == ECONNREFUSED;
  throw MeshError(lost                   ? HORA_ERR_PEER_LOST
                  : error == ETIMEDOUT   ? HORA_ERR_TIMEOUT
                                         : HORA_ERR_BACKEND,
                  detail::concat(what, " rank ", peer, " ", name, ": ", std::strerror(error),
                                 error == EPIPE || error == ECONNRESET ? " (connection reset)" : ""));
}

Link::Ticket GlooMesh::post(int peer, bool send, void *data, size_t bytes) {
  interrupted_.check();
  if (outOfStep_) {
    throw MeshError(HORA_ERR_BACKEND, "the gloo mesh is out of step after a failed collective");
  }
  Queue &queue = (send ? sends_ : recvs_)[static_cast<size_t>(peer)];
  queue.pending.push_back({static_cast<uint8_t *>(data), bytes, 0});
  pendingBytes_ += bytes;
  // The ticket: the message's place in its queue, the peer, the direction.
  return (queue.posted++ << 21) | (static_cast<uint64_t>(peer) << 1) | (send ? 1u : 0u);
}

Link::Ticket GlooMesh::postSend(int peer, const void *data, size_t bytes) {
  return post(peer, true, const_cast<void *>(data), bytes);
}

Link::Ticket GlooMesh::postRecv(int peer, void *data, size_t bytes) {
  return post(peer, false, data, bytes);
}

bool GlooMesh::isDone(Ticket ticket) const {
  const auto peer = static_cast<size_t>((ticket >> 1) & 0xfffff);
  const Queue &queue = ((ticket & 1u) != 0 ? sends_ : recvs_)[peer];
  return (ticket >> 21) < queue.completed;
}

size_t GlooMesh::pump(int peer, bool send, Queue &queue) {
  iovec parts[16];
  int count = 0;
  size_t room = slice();
  for (auto it = queue.pending.begin(); it != queue.pending.end() && count < 16 && room > 0; ++it) {
    const size_t n = std::min(room, it->bytes - it->moved);
    parts[count++] = {it->data + it->moved, n};
    room -= n;
  }
  size_t moved = 0;
  if (room < slice()) {
    const int fd = sockets_[static_cast<size_t>(peer)];
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = send ? ::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT)
                           : ::recvmsg(fd, &message, MSG_DONTWAIT);
    if (n == 0 && !send) fail(peer, "reading", 0);
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        fail(peer, send ? "writing to" : "reading from", errno);
      }
    } else {
      moved = static_cast<size_t>(n);
    }
  }
  pendingBytes_ -= moved;
  // Complete what is whole, empty messages included.
  for (size_t left = moved; !queue.pending.empty();) {
    Transfer &head = queue.pending.front();
    const size_t n = std::min(left, head.bytes - head.moved);
    head.moved += n;
    left -= n;
    if (head.moved < head.bytes) break;
    queue.pending.pop_front();
    ++queue.completed;
  }
  return moved;
}

bool GlooMesh::progress() {
  bool moved = false;
  for (int peer = 0; peer < size_; ++peer) {
    Queue &out = sends_[static_cast<size_t>(peer)], &in = recvs_[static_cast<size_t>(peer)];
    if (!out.pending.empty() && pump(peer, true, out) > 0) moved = true;
    if (!in.pending.empty() && pump(peer, false, in) > 0) moved = true;
  }
  return moved;
}

void GlooMesh::wait(Ticket ticket) {
  if (isDone(ticket)) return;
  const int peer = static_cast<int>((ticket >> 1) & 0xfffff);
  Deadline deadline(timeoutMs_);
  const bool brief = pendingBytes_ <= tuning_.chunkBytes;
  while (!isDone(ticket)) {
    if (progress()) {
      deadline.progressed();
    } else if (!isDone(ticket)) {
      await(peer, deadline, brief);
    }
  }
}

void GlooMesh::drop(Ticket ticket) {
  if (isDone(ticket)) return;
  // The streams can no longer be told apart: nothing more goes over this mesh.
  outOfStep_ = true;
  for (std::vector<Queue> *side : {&sends_, &recvs_}) {
    for (Queue &queue : *side) queue.pending.clear();
  }
  pendingBytes_ = 0;
}

void GlooMesh::guard(const char *what, const std::function<void()> &body) {
  glooCall(what, rank_, body);
}

void GlooMesh::await(int peer, Deadline &deadline, bool brief) {
  interrupted_.check();
  std::vector<pollfd> &fds = pollFds_;
  fds.clear();
  for (int p = 0; p < size_; ++p) {
    const bool out = !sends_[static_cast<size_t>(p)].pending.empty();
    const bool in = !recvs_[static_cast<size_t>(p)].pending.empty();
    if (!out && !in) continue;
    const int fd = sockets_[static_cast<size_t>(p)];
    if (in) {
      // The messages of a collective alternate in both directions, which puts Linux's TCP in its
      // interactive mode: it delays ACKs to ride on the next reply, and a sender that needs them
      // (more in flight than the window it was given) waits for the 40 ms delayed-ACK timer or a
      // tail-loss probe. Quick ACKs for what is read next avoid that.
      const int on = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &on, sizeof on);
    }
    fds.push_back({fd, static_cast<short>((out ? POLLOUT : 0) | (in ? POLLIN : 0)), 0});
  }
  const auto count = static_cast<nfds_t>(fds.size());
  if (brief && spinUs_.count() > 0) {
    // A reply to a small message comes within one network round trip when the peer is running:
    // looking for it spares this thread a sleep and a wake-up (bare sockets between two
    // namespace hosts: 20 against 85 us for two exchanges, bench/hora_link.cpp).
    const auto end = std::chrono::steady_clock::now() + spinUs_;
    do {
      if (poll(fds.data(), count, 0) > 0) return;
      sched_yield();  // a peer on this core may be the one to answer
    } while (std::chrono::steady_clock::now() < end);
  }
  int waitMs = -1;
  if (timeoutMs_ >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline.at - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      throw MeshError(HORA_ERR_TIMEOUT, detail::concat("Timed out after ", timeoutMs_,
                                                       " ms waiting for rank ", peer, " ",
                                                       peerNames_[static_cast<size_t>(peer)]));
    }
    waitMs = static_cast<int>(std::min<int64_t>(left + 1, 1 << 30));
  }
  if (poll(fds.data(), count, waitMs) < 0 && errno != EINTR) {
    throw MeshError(HORA_ERR_BACKEND, detail::concat("poll: ", std::strerror(errno)));
  }
}

void GlooMesh::Deadline::progressed() {
  if (patience.count() >= 0) at = std::chrono::steady_clock::now() + patience;
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
  plane_ = std::make_unique<LinkControlPlane>(mesh_);
}

GlooGroup::~GlooGroup() {
  for (const std::string &address : peerAddresses_) {
    if (!address.empty()) PeerAddressBook::instance().remove(address);
  }
}

}  // namespace hora
