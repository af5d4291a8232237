// SPDX-License-Identifier: Apache-2.0
// UcxComm: worker, endpoints, tagged messages (the Link) and the event-driven wait.
#include "backends/ucx/ucx_comm.h"

#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "base/error.h"
#include "base/logging.h"
#include "base/process.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxRanks = 1 << 16;  // the sender's rank has 16 tag bits

[[noreturn]] void throwUcx(const char *what, ucs_status_t status) {
  HORA_THROW(HORA_ERR_BACKEND, "UCX: ", what, ": ", ucs_status_string(status));
}

void check(ucs_status_t status, const char *what) {
  if (status != UCS_OK) throwUcx(what, status);
}

void onEndpointError(void *arg, ucp_ep_h, ucs_status_t status) {
  auto *who = static_cast<std::pair<UcxComm *, int> *>(arg);
  who->first->peerFailed(who->second, status);
}

// How long a wait polls before it sleeps on the event fd (HORA_UCX_SPIN_US). A reply on this
// host or across a fast link comes within tens of microseconds; longer waits are a peer that has
// not arrived.
std::chrono::nanoseconds spinBudget(const Knobs &knobs) {
  return std::chrono::nanoseconds(static_cast<int64_t>(knobs.ucxSpinUs * 1000));
}

// The algorithm tables' figures (core/collectives/algorithms.h): HORA_UCX_DIRECT_KB,
// HORA_UCX_SMALL_KB, HORA_UCX_CHUNK_KB; UCX moves to every peer at once; topology-aware unless
// HORA_HIERARCHICAL=off.
LinkTuning tuningFrom(const Knobs &knobs) {
  LinkTuning t;
  t.directBytes = static_cast<size_t>(knobs.ucxDirectKiB) << 10;
  t.smallBytes = static_cast<size_t>(knobs.ucxSmallKiB) << 10;
  t.chunkBytes = static_cast<size_t>(knobs.ucxChunkKiB) << 10;
  t.concurrentPeers = true;
  t.topologyAware = knobs.hierarchical != "off";
  return t;
}

void put64(std::string &out, uint64_t v) { out.append(reinterpret_cast<const char *>(&v), 8); }
uint64_t get64(const std::string &in, size_t &at) {
  HORA_ENFORCE(at + 8 <= in.size(), "UCX address exchange: truncated message");
  uint64_t v;
  std::memcpy(&v, in.data() + at, 8);
  at += 8;
  return v;
}

// Whether UCX_TLS (unset, a list, or "^list" for all but those) lets UCX use its TCP transport.
bool tcpAllowed(const char *tls) {
  if (tls == nullptr || *tls == '\0') return true;
  const std::string list(tls);
  const bool names = list.find("tcp") != std::string::npos;
  if (list[0] == '^') return !names;
  return names || list.find("all") != std::string::npos;
}

}  // namespace

UcxComm::UcxComm(Group &group, const Knobs &knobs)
    : rank_(group.rank()), size_(group.size()), timeoutS_(knobs.timeoutS), tuning_(tuningFrom(knobs)),
      spin_(spinBudget(knobs)) {
  if (size_ > kMaxRanks) {
    HORA_THROW(HORA_ERR_UNSUPPORTED, "the UCX plane serves at most ", kMaxRanks, " ranks, not ", size_);
  }
  sendSeq_.assign(static_cast<size_t>(size_), 0);
  recvSeq_.assign(static_cast<size_t>(size_), 0);
  outstanding_.assign(static_cast<size_t>(size_), 0);
  // Start UCX here, then agree over the group's control plane that every rank could, so that a
  // rank where UCX cannot start makes every rank give up alike (the caller may fall back).
  // Whether every rank is alone on its host: then every message crosses a network, where UCX's
  // rendezvous (a request, then the data, then an acknowledgement, per message) leaves a slow
  // link idle between chunks; eager sends keep it busy (1 Gbit/s links, 2 hosts x 1 rank, 64 MiB:
  // 0.66-0.81 of the link with rendezvous, 0.93 without). Where ranks share a host, rendezvous
  // over shared memory (a single copy through CMA) is worth more, and the default stays.
  const std::vector<std::string> identities = group.control().gatherToRoot(hostIdentity());
  std::string alone(1, '0');
  if (rank_ == 0) {
    std::set<std::string> distinct(identities.begin(), identities.end());
    alone[0] = distinct.size() == identities.size() ? '1' : '0';
  }
  group.control().broadcastFromRoot(alone);
  std::string failed;
  try {
    startWorker(/*eagerOnly=*/alone == "1" && environmentValue("UCX_RNDV_THRESH") == nullptr);
  } catch (const Error &e) {
    failed = e.what();
  }
  std::vector<uint64_t> ok(1, failed.empty() ? 1 : 0);
  group.control().allreduceAnd(ok);
  try {
    if (!failed.empty()) HORA_THROW(HORA_ERR_BACKEND, failed);
    if (ok[0] == 0) HORA_THROW(HORA_ERR_BACKEND, "UCX could not start on another rank of the set");
    exchangeAddresses(group);
    startKeeper();
  } catch (...) {
    closeEndpoints();
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
    throw;
  }
}

void UcxComm::startWorker(bool eagerOnly) {
  ucp_config_t *config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "reading UCX_* configuration");
  if (eagerOnly) {
    ucp_config_modify(config, "RNDV_THRESH", "inf");
    // Every message then goes eager, cut into TCP segments of UCX_TCP_TX_SEG_SIZE (8 KiB by
    // default) and received through buffers of UCX_TCP_RX_SEG_SIZE (64 KiB), each a send, a
    // receive and a copy: larger ones carry a 64 MiB allreduce between 2 namespace hosts 11-13%
    // faster (median of 6 alternating runs, docs/ucx.md). Only the TCP transport has these keys
    // (UCX warns about a key no transport takes, so not where UCX_TLS rules TCP out); what the
    // user set stays.
    if (tcpAllowed(environmentValue("UCX_TLS"))) {
      if (environmentValue("UCX_TCP_TX_SEG_SIZE") == nullptr) ucp_config_modify(config, "TX_SEG_SIZE", "64k");
      if (environmentValue("UCX_TCP_RX_SEG_SIZE") == nullptr) ucp_config_modify(config, "RX_SEG_SIZE", "256k");
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  const ucs_status_t made = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (made != UCS_OK) {
    context_ = nullptr;
    throwUcx("creating a context (ucp_init)", made);
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // the set's cycles: one thread at a time
  if (const ucs_status_t s = ucp_worker_create(context_, &wp, &worker_); s != UCS_OK) {
    worker_ = nullptr;
    throwUcx("creating a worker", s);
  }
  check(ucp_worker_get_efd(worker_, &eventFd_), "getting the worker's event descriptor");
}

UcxComm::~UcxComm() {
  stopKeeper();
  closeEndpoints();
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

void UcxComm::exchangeAddresses(Group &group) {
  ucp_address_t *address = nullptr;
  size_t length = 0;
  check(ucp_worker_get_address(worker_, &address, &length), "getting the worker address");
  // Each entry: this process's host identity, its pid, its worker address.
  std::string mine;
  const std::string identity = hostIdentity();
  put64(mine, identity.size());
  mine += identity;
  put64(mine, static_cast<uint64_t>(getpid()));
  mine.append(reinterpret_cast<const char *>(address), length);
  ucp_worker_release_address(worker_, address);

  // Rank 0 collects every address, adds the secret, and sends the lot to everyone.
  std::vector<std::string> all = group.control().gatherToRoot(mine);
  std::string table;
  if (rank_ == 0) {
    uint64_t secret = 0;
    if (getrandom(&secret, sizeof secret, 0) != static_cast<ssize_t>(sizeof secret)) {
      secret = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
    }
    put64(table, secret);
    for (const std::string &a : all) {
      put64(table, a.size());
      table += a;
    }
  }
  group.control().broadcastFromRoot(table);
  size_t at = 0;
  secret_ = (get64(table, at) & 0xffffull) << 48;
  std::vector<std::string> addresses, identities;
  pids_.assign(static_cast<size_t>(size_), 0);
  sameHost_.assign(static_cast<size_t>(size_), false);
  for (int r = 0; r < size_; ++r) {
    const uint64_t n = get64(table, at);
    HORA_ENFORCE(at + n <= table.size(), "UCX address exchange: truncated table");
    const std::string entry = table.substr(at, n);
    at += n;
    size_t in = 0;
    const uint64_t idLength = get64(entry, in);
    const size_t in0 = in;
    HORA_ENFORCE(in + idLength + 8 <= entry.size(), "UCX address exchange: truncated entry");
    sameHost_[static_cast<size_t>(r)] = entry.compare(in, idLength, identity) == 0;
    in += idLength;
    pids_[static_cast<size_t>(r)] = static_cast<pid_t>(get64(entry, in));
    addresses.push_back(entry.substr(in));
    identities.push_back(entry.substr(in0, idLength));
  }
  for (int r = 0; r < size_; ++r) {
    size_t h = 0;
    while (h < hosts_.size() && identities[static_cast<size_t>(hosts_[h][0])] != identities[static_cast<size_t>(r)]) ++h;
    if (h == hosts_.size()) hosts_.emplace_back();
    hosts_[h].push_back(r);
    if (r == rank_) hostIndex_ = static_cast<int>(h);
  }

  failed_.assign(static_cast<size_t>(size_), UCS_OK);
  eps_.assign(static_cast<size_t>(size_), nullptr);
  errArgs_.reserve(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) errArgs_.emplace_back(this, r);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t *>(addresses[static_cast<size_t>(r)].data());
    // UCX reports a lost remote peer only in PEER mode, which its shared-memory transports do
    // not offer; a peer on this host gets NONE (shared memory) and a liveness check by pid.
    ep.err_mode = sameHost_[static_cast<size_t>(r)] ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = onEndpointError;
    ep.err_handler.arg = &errArgs_[static_cast<size_t>(r)];
    const ucs_status_t s = ucp_ep_create(worker_, &ep, &eps_[static_cast<size_t>(r)]);
    if (s != UCS_OK) {
      HORA_THROW(HORA_ERR_BACKEND, "UCX: connecting rank ", rank_, " to rank ", r, ": ",
                 ucs_status_string(s));
    }
  }
}

// UCX finishes a protocol only while both sides progress: a rendezvous send completes when the
// receiver has fetched the data and acknowledged it, and a rank whose collective is over may have
// that acknowledgement still queued. An idle rank (no collective, its engine waiting for work)
// would leave the sender waiting forever. The keeper progresses the worker whenever it has
// events and no collective holds it, and sleeps on its event descriptor otherwise.
void UcxComm::startKeeper() {
  keeperStop_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (keeperStop_ < 0) HORA_THROW(HORA_ERR_BACKEND, "eventfd: ", std::strerror(errno));
  keeper_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "hora-ucx");
    for (;;) {
      bool armed = false, held = false;
      {
        std::unique_lock<std::mutex> hold(mutex_, std::try_to_lock);
        if (hold.owns_lock()) {
          held = true;
          while (ucp_worker_progress(worker_) != 0) {
          }
          armed = ucp_worker_arm(worker_) == UCS_OK;
        }
      }
      pollfd fds[2] = {{eventFd_, POLLIN, 0}, {keeperStop_, POLLIN, 0}};
      // A collective holds the worker (and progresses it): look again in a millisecond.
      const int limit = !held ? 1 : armed ? 1000 : 0;
      if (poll(armed ? fds : fds + 1, armed ? 2 : 1, limit) > 0 && (fds[1].revents & POLLIN) != 0) return;
    }
  });
}

void UcxComm::stopKeeper() {
  if (!keeper_.joinable()) return;
  const uint64_t one = 1;
  ssize_t ignored = write(keeperStop_, &one, sizeof one);
  (void)ignored;
  keeper_.join();
  close(keeperStop_);
}

void UcxComm::closeEndpoints() {
  // Flush what is still in flight to live peers (bounded), force the rest.
  std::vector<void *> closing;
  for (size_t r = 0; r < eps_.size(); ++r) {
    if (eps_[r] == nullptr) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = failed_[r] != UCS_OK ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void *req = ucp_ep_close_nbx(eps_[r], &p);
    if (UCS_PTR_IS_PTR(req)) closing.push_back(req);
    eps_[r] = nullptr;
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(2);
  while (!closing.empty() && Clock::now() < deadline) {
    ucp_worker_progress(worker_);
    closing.erase(std::remove_if(closing.begin(), closing.end(),
                                 [](void *req) {
                                   if (ucp_request_check_status(req) == UCS_INPROGRESS) return false;
                                   ucp_request_free(req);
                                   return true;
                                 }),
                  closing.end());
  }
  for (void *req : closing) ucp_request_free(req);  // UCX completes and releases them later
}

void UcxComm::peerFailed(int peer, ucs_status_t status) {
  if (failed_[static_cast<size_t>(peer)] == UCS_OK) failed_[static_cast<size_t>(peer)] = status;
}

bool UcxComm::armForNextCycle() {
  while (ucp_worker_progress(worker_) != 0) {
  }
  ucp_tag_recv_info_t info{};
  constexpr uint64_t kJobBits = 0xffffull << 48;
  if (ucp_tag_probe_nb(worker_, secret_, kJobBits, 0, &info) != nullptr) return false;
  const ucs_status_t armed = ucp_worker_arm(worker_);
  return armed == UCS_OK;  // UCS_ERR_BUSY: events pending
}

uint64_t UcxComm::tagFrom(int peer, uint32_t seq) const {
  return secret_ | (static_cast<uint64_t>(peer) << 32) | seq;
}
uint64_t UcxComm::tagTo(uint32_t seq) const { return tagFrom(rank_, seq); }

template <typename Involved>
void UcxComm::checkPeers(const char *what, Involved involved) {
  // Only the peers this wait depends on: a peer that has finished its part and left (the end of
  // a job) is no failure of a wait for another.
  // Peers on this host: by pid, at most every 100 ms (a wait wakes for every message).
  const Clock::time_point now = Clock::now();
  const bool due = now - lastPidCheck_ >= std::chrono::milliseconds(100);
  if (due) lastPidCheck_ = now;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || !involved(r)) continue;
    const pid_t pid = pids_[static_cast<size_t>(r)];
    if (due && sameHost_[static_cast<size_t>(r)] && kill(pid, 0) != 0 && errno == ESRCH) {
      peerFailed(r, UCS_ERR_CONNECTION_RESET);
    }
    if (failed_[static_cast<size_t>(r)] != UCS_OK) {
      HORA_THROW(HORA_ERR_PEER_LOST, what, ": rank ", rank_, " lost its connection to rank ", r,
                 " (UCX: ", ucs_status_string(failed_[static_cast<size_t>(r)]), ")");
    }
  }
}

template <typename Done, typename Involved>
void UcxComm::progressUntil(Done done, const char *what, Involved involved) {
  if (done()) return;
  const Clock::time_point start = Clock::now();
  const Clock::time_point spinEnd = start + spin_;
  while (Clock::now() < spinEnd) {
    if (ucp_worker_progress(worker_) == 0) sched_yield();  // a peer may need this core
    if (done()) return;
  }
  checkPeers(what, involved);
  const Clock::time_point deadline =
      start + std::chrono::nanoseconds(static_cast<int64_t>(timeoutS_ * 1e9));
  for (;;) {
    while (ucp_worker_progress(worker_) != 0) {
    }
    if (done()) return;
    interrupted_.check();
    checkPeers(what, involved);
    const ucs_status_t armed = ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
    check(armed, "arming the worker's event descriptor");
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      std::string who;
      for (int r = 0; r < size_; ++r) {
        if (r != rank_ && involved(r)) who += (who.empty() ? "" : ",") + std::to_string(r);
      }
      HORA_THROW(HORA_ERR_TIMEOUT, what, ": rank ", rank_, " waited ", timeoutS_,
                 " s (HORA_TIMEOUT_S) for rank ", who.empty() ? "?" : who);
    }
    // Wake at least every 100 ms: UCX reports a failed endpoint from progress.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    pollfd fd{eventFd_, POLLIN, 0};
    poll(&fd, 1, static_cast<int>(std::min<int64_t>(100, left + 1)));
  }
}

Link::Ticket UcxComm::track(void *request, int peer, bool isRecv, size_t bytes) {
  size_t i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
  } else {
    i = ops_.size();
    ops_.emplace_back();
  }
  ops_[i] = Op{request, peer, isRecv, bytes};
  ++outstanding_[static_cast<size_t>(peer)];
  return static_cast<Ticket>(i) + 1;
}

UcxComm::Op &UcxComm::slot(Ticket ticket) {
  const size_t i = static_cast<size_t>(ticket) - 1;
  HORA_ENFORCE(ticket != 0 && i < ops_.size() && ops_[i].peer >= 0, "UCX: no transfer has ticket ", ticket);
  return ops_[i];
}

void UcxComm::release(Ticket ticket) {
  Op &op = slot(ticket);
  --outstanding_[static_cast<size_t>(op.peer)];
  op = Op{};
  free_.push_back(static_cast<size_t>(ticket) - 1);
}

Link::Ticket UcxComm::postSend(int peer, const void *data, size_t bytes) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_contig(1);
  const uint64_t tag = tagTo(sendSeq_[static_cast<size_t>(peer)]++);
  void *req = ucp_tag_send_nbx(eps_[static_cast<size_t>(peer)], data, bytes, tag, &p);
  if (UCS_PTR_IS_ERR(req)) {
    checkPeers("send", [peer](int r) { return r == peer; });
    HORA_THROW(HORA_ERR_BACKEND, "UCX: rank ", rank_, " sending ", bytes, " bytes to rank ", peer, ": ",
               ucs_status_string(UCS_PTR_STATUS(req)));
  }
  return track(req, peer, false, bytes);
}

Link::Ticket UcxComm::postRecv(int peer, void *data, size_t bytes) {
  ucp_request_param_t p{};
  // Always a request (UCX 1.13 does not report the length of a receive that completes in the
  // call), so that complete() checks every message's length.
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.datatype = ucp_dt_make_contig(1);
  const uint64_t tag = tagFrom(peer, recvSeq_[static_cast<size_t>(peer)]++);
  void *req = ucp_tag_recv_nbx(worker_, data, bytes, tag, ~0ull, &p);
  if (UCS_PTR_IS_ERR(req)) {
    HORA_THROW(HORA_ERR_BACKEND, "UCX: rank ", rank_, " receiving ", bytes, " bytes from rank ", peer, ": ",
               ucs_status_string(UCS_PTR_STATUS(req)));
  }
  return track(req, peer, true, bytes);
}

bool UcxComm::complete(Op &op) {
  if (op.request == nullptr) return true;
  ucs_status_t status;
  ucp_tag_recv_info_t info{};
  if (op.isRecv) {
    status = ucp_tag_recv_request_test(op.request, &info);
  } else {
    status = ucp_request_check_status(op.request);
  }
  if (status == UCS_INPROGRESS) return false;
  ucp_request_free(op.request);
  op.request = nullptr;
  if (status != UCS_OK) {
    const int peer = op.peer;
    checkPeers(op.isRecv ? "receive" : "send", [peer](int r) { return r == peer; });
    HORA_THROW(status == UCS_ERR_MESSAGE_TRUNCATED ? HORA_ERR_INTERNAL : HORA_ERR_PEER_LOST, "UCX: rank ",
               rank_, op.isRecv ? " receiving from rank " : " sending to rank ", op.peer, ": ",
               ucs_status_string(status));
  }
  if (op.isRecv && info.length != op.bytes) {
    HORA_THROW(HORA_ERR_INTERNAL, "UCX: rank ", rank_, " expected ", op.bytes, " bytes from rank ", op.peer,
               " and got ", info.length);
  }
  return true;
}

void UcxComm::wait(Ticket ticket) {
  Op &op = slot(ticket);
  // The wait depends on this transfer's peer and on every peer the collective still has
  // transfers outstanding with: a lost one is named even while this one's peer is alive.
  const int peer = op.peer;
  progressUntil([&] { return complete(op); }, what_, [&](int r) { return r == peer || waitsOn(r); });
  release(ticket);
}

void UcxComm::drop(Ticket ticket) {
  Op &op = slot(ticket);
  if (op.request != nullptr) {
    ucp_request_cancel(worker_, op.request);
    // A cancelled request completes at the next progress; wait for it so that nothing writes
    // into the caller's buffer after this returns (bounded: UCX completes cancels at once).
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(1);
    while (ucp_request_check_status(op.request) == UCS_INPROGRESS && Clock::now() < deadline) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(op.request);
    op.request = nullptr;
  }
  release(ticket);
}

void UcxComm::sendBlob(const std::vector<int> &peers, const std::string &blob) {
  // One message a peer, all posted before the first wait. An empty blob is still a message: the
  // receiver waits for one (so not Transfers, which skips empty ones).
  std::vector<Ticket> tickets;
  try {
    for (int peer : peers) tickets.push_back(postSend(peer, blob.data(), blob.size()));
    for (size_t i = 0; i < tickets.size(); ++i) {
      wait(tickets[i]);
      tickets[i] = 0;
    }
  } catch (...) {
    for (Ticket t : tickets) {
      if (t != 0) drop(t);
    }
    throw;
  }
}

std::string UcxComm::recvBlob(int peer) {
  const uint64_t tag = tagFrom(peer, recvSeq_[static_cast<size_t>(peer)]);
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h message = nullptr;
  progressUntil(
      [&] {
        message = ucp_tag_probe_nb(worker_, tag, ~0ull, 1, &info);
        return message != nullptr;
      },
      what_, [peer](int r) { return r == peer; });
  ++recvSeq_[static_cast<size_t>(peer)];  // the probe took the message off UCX's queue
  std::string out(info.length, '\0');
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;  // the probe gave the length
  p.datatype = ucp_dt_make_contig(1);
  void *req = ucp_tag_msg_recv_nbx(worker_, out.data(), out.size(), message, &p);
  if (UCS_PTR_IS_ERR(req)) throwUcx("receiving a probed message", UCS_PTR_STATUS(req));
  if (req != nullptr) {
    // Tracked like any receive, so that a wait that throws cancels it before `out` goes.
    const Ticket ticket = track(req, peer, true, out.size());
    try {
      wait(ticket);
    } catch (...) {
      drop(ticket);
      throw;
    }
  }
  return out;
}

void UcxComm::guard(const char *what, const std::function<void()> &body) {
  const char *outer = what_;
  what_ = what;
  try {
    body();
  } catch (...) {
    what_ = outer;
    throw;
  }
  what_ = outer;
}

std::string UcxComm::transports() {
  // ucp_ep_print_info writes the endpoint's lanes ("lane[0]:  1:tcp/eth0.0 md[1] ..."); keep the
  // distinct transport/device names.
  std::string out;
  for (int r = 0; r < size_; ++r) {
    if (eps_[static_cast<size_t>(r)] == nullptr) continue;
    char *text = nullptr;
    size_t length = 0;
    FILE *f = open_memstream(&text, &length);
    if (f == nullptr) return out;
    ucp_ep_print_info(eps_[static_cast<size_t>(r)], f);
    fclose(f);
    std::set<std::string> names;
    const std::string info(text, length);
    free(text);
    size_t at = 0;
    while ((at = info.find("lane[", at)) != std::string::npos) {
      const size_t colon = info.find(':', at);
      if (colon == std::string::npos) break;
      size_t begin = info.find_first_not_of(" ", colon + 1);
      // "  1:tcp/eth0.0 md[1]": skip the resource index.
      const size_t idx = info.find(':', begin);
      const size_t end = info.find_first_of(" \n", begin);
      if (idx != std::string::npos && idx < end) begin = idx + 1;
      if (begin != std::string::npos && end != std::string::npos && end > begin) {
        names.insert(info.substr(begin, end - begin));
      }
      at = colon;
    }
    std::string joined;
    for (const std::string &n : names) joined += (joined.empty() ? "" : ",") + n;
    out += detail::concat(out.empty() ? "" : "; ", "rank ", r, ": ", joined.empty() ? "?" : joined);
  }
  return out;
}

std::string describeUcx() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  std::string out = detail::concat("UCX ", major, ".", minor, ".", release);
  ucp_config_t *config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return out + " (cannot read its configuration)";
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  ucp_context_h context = nullptr;
  const ucs_status_t s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) return out + ": " + ucs_status_string(s);
  char *text = nullptr;
  size_t length = 0;
  if (FILE *f = open_memstream(&text, &length)) {
    ucp_context_print_info(context, f);
    fclose(f);
    // "#     resource 0  :  md 0  dev 0  flags -- tcp/eth0": the transports UCX may pick from.
    std::set<std::string> names;
    const std::string info(text, length);
    size_t at = 0;
    while ((at = info.find("resource", at)) != std::string::npos) {
      const size_t eol = info.find('\n', at);
      const std::string line = info.substr(at, eol - at);
      const size_t last = line.find_last_of(' ');
      if (last != std::string::npos && line.find('/') != std::string::npos) names.insert(line.substr(last + 1));
      at = eol;
    }
    free(text);
    std::string joined;
    for (const std::string &n : names) joined += (joined.empty() ? "" : " ") + n;
    out += ", transports UCX may choose (UCX_TLS narrows them): " + joined;
  }
  ucp_cleanup(context);
  return out;
}

}  // namespace hora
