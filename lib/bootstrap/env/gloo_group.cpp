// SPDX-License-Identifier: Apache-2.0
// GlooGroup: Gloo rendezvous through hora's store, and the control plane on Gloo collectives.
#include "bootstrap/env/gloo_group.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "base/logging.h"
#include "base/process.h"
#include "bootstrap/env/auth.h"
#include "bootstrap/env/pair_auth.h"

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
  GlooControlPlane(std::shared_ptr<gloo::Context> context, double timeoutS)
      : context_(std::move(context)), timeout_(toMs(timeoutS)) {}
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  void allreduceAnd(std::vector<uint64_t> &words) override {
    if (words.empty() || context_->size == 1) return;
    glooCall("negotiation (waiting for every rank to start the same cycle)", rank(), [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(words.data(), words.size());
      opts.setReduceFunction([](void *c, const void *a, const void *b, size_t n) {
        auto *out = static_cast<uint64_t *>(c);
        const auto *x = static_cast<const uint64_t *>(a);
        const auto *y = static_cast<const uint64_t *>(b);
        for (size_t i = 0; i < n; ++i) out[i] = x[i] & y[i];
      });
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  std::vector<std::string> gatherToRoot(const std::string &blob) override {
    if (context_->size == 1) return {blob};
    // Control messages are small: gather them everywhere (allgatherv) and keep them at rank 0.
    const size_t n = static_cast<size_t>(context_->size);
    std::vector<int64_t> lengths(n);
    int64_t mine = static_cast<int64_t>(blob.size());
    glooCall("negotiation (gathering requests at the coordinator)", rank(), [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(&mine, 1);
      opts.setOutput(lengths.data(), n);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
    std::vector<size_t> counts(n);
    size_t total = 0;
    for (size_t r = 0; r < n; ++r) {
      counts[r] = static_cast<size_t>(lengths[r]);
      total += counts[r];
    }
    std::string all(total + 1, '\0');  // +1: never a zero-sized buffer
    std::string in = blob;
    in.push_back('\0');
    glooCall("negotiation (gathering requests at the coordinator)", rank(), [&] {
      gloo::AllgathervOptions opts(context_);
      opts.setInput(&in[0], blob.size());
      opts.setOutput(&all[0], counts);
      opts.setTimeout(timeout_);
      gloo::allgatherv(opts);
    });
    if (rank() != 0) return {};
    std::vector<std::string> out;
    size_t at = 0;
    for (size_t r = 0; r < n; ++r) {
      out.push_back(all.substr(at, counts[r]));
      at += counts[r];
    }
    return out;
  }

  void broadcastFromRoot(std::string &blob) override {
    if (context_->size == 1) return;
    int64_t length = static_cast<int64_t>(blob.size());
    glooCall("negotiation (waiting for the coordinator's responses)", rank(), [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setRoot(0);
      opts.setOutput(&length, 1);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
    if (length == 0) {
      blob.clear();
      return;
    }
    blob.resize(static_cast<size_t>(length));
    glooCall("negotiation (waiting for the coordinator's responses)", rank(), [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setRoot(0);
      opts.setOutput(&blob[0], blob.size());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

 private:
  std::shared_ptr<gloo::Context> context_;
  std::chrono::milliseconds timeout_;
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
  if (contains(text, "Timed out") || contains(text, "timed out") || contains(text, "Timeout")) {
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

GlooGroup::GlooGroup(std::shared_ptr<TcpStoreClient> store, const std::string &prefix, int rank,
                     int size, const std::string &localAddress, double timeoutS)
    : timeoutS_(timeoutS) {
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
  // Before anything travels on the mesh: every pair proves the job token (no token: nothing).
  glooCall("checking the job token on the gloo mesh", rank,
           [&] { authenticateGlooPairs(context_, store->token(), timeoutS); });
  std::vector<PeerCard> cards;
  glooCall("exchanging the mesh's addresses", rank, [&] { cards = exchangePeerCards(context_); });
  for (int peer = 0; peer < size; ++peer) {
    const PeerCard &card = cards[static_cast<size_t>(peer)];
    if (peer == rank || card.address.empty()) continue;
    HORA_LOG(kDebug) << "gloo: rank " << peer << " (" << card.host << ", pid " << card.pid
                     << ")'s pair to rank " << rank << " listens at " << card.address;
    PeerAddressBook::instance().add(
        card.address, {detail::concat("rank ", peer, " of ", size), card.host, card.pid});
    peerAddresses_.push_back(card.address);
  }
  plane_ = std::make_unique<GlooControlPlane>(context_, timeoutS);
}

GlooGroup::~GlooGroup() {
  for (const std::string &address : peerAddresses_) {
    if (!address.empty()) PeerAddressBook::instance().remove(address);
  }
}

}  // namespace hora
