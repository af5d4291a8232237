// SPDX-License-Identifier: Apache-2.0
// MPI bootstrap: MPI_Init_thread unless the program did it, communicators, topology, and the
// control plane over non-blocking collectives (so waiting for peers can time out).
#include "bootstrap/mpi/mpi_bootstrap.h"

#include <time.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "base/interrupt.h"
#include "base/knobs.h"
#include "base/logging.h"

namespace hora {
namespace {

// hora finalizes MPI only if it initialized it, and only at process exit: after hora_shutdown a
// later hora_init in the same process must find MPI still usable.
bool gWeInitializedMpi = false;

// Tags on the private communicators below.
constexpr int kFaultTag = 1;  // "I gave up": 4 bytes of status, then the reason
constexpr int kBeatTag = 2;   // a Presence line

// A set's abort (MpiCommGroup::interrupt): every MPI wait of this process throws it.
Interrupt gInterrupted;
// Why the MPI plane of this process is broken (see mpiPlaneBroken), set once.
std::mutex gBrokenMutex;  // guards gBrokenStatus, gBrokenWhy and the notices' sending
std::atomic<bool> gBroken{false};
int gBrokenStatus = HORA_SUCCESS;
std::string gBrokenWhy;
bool gBrokenByPeer = false;  // a peer's notice broke it: nothing to tell the others
bool gNoticeSent = false;
// A duplicate of MPI_COMM_WORLD for the notices, made by the first world of the process and kept
// (hora_init after hora_shutdown reuses it: every rank starts the same number of worlds).
MPI_Comm gFaultComm = MPI_COMM_NULL;

// Records why the plane broke, without telling the peers yet (mpiPlaneBroken does, with the
// engine's fuller words); false if it already was broken.
bool recordBroken(int status, const std::string &why, bool byPeer) {
  std::lock_guard<std::mutex> lock(gBrokenMutex);
  if (gBroken.load()) return false;
  gBrokenStatus = status;
  gBrokenWhy = why;
  gBrokenByPeer = byPeer;
  gBroken = true;
  return true;
}

// A peer's notice, if one arrived: the plane is then broken here too.
void takeFaultNotice() {
  if (gFaultComm == MPI_COMM_NULL || gBroken.load(std::memory_order_relaxed)) return;
  int flag = 0;
  MPI_Message message;
  MPI_Status st;
  if (MPI_Improbe(MPI_ANY_SOURCE, kFaultTag, gFaultComm, &flag, &message, &st) != MPI_SUCCESS ||
      !flag) {
    return;
  }
  int bytes = 0;
  MPI_Get_count(&st, MPI_BYTE, &bytes);
  std::string text(static_cast<size_t>(std::max(bytes, 4)), '\0');
  MPI_Mrecv(&text[0], bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE);
  // The peer's own status stays in the notice; here the job lost that peer.
  recordBroken(HORA_ERR_PEER_LOST,
               "rank " + std::to_string(st.MPI_SOURCE) + " gave up on the job: " + text.substr(4),
               /*byPeer=*/true);
}

int worldRankOrMinus1() {
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

class MpiControlPlane final : public ControlPlane {
 public:
  MpiControlPlane(MPI_Comm comm, double timeoutS) : comm_(comm), timeoutS_(timeoutS) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Each operation runs on buffers of its own (Buffers), which a timed-out wait keeps alive.
  void allreduceAnd(std::vector<uint64_t> &words) override {
    throwIfMpiBroken();
    auto b = std::make_shared<Buffers>();
    b->words = words;
    MPI_Request req;
    HORA_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, b->words.data(), static_cast<int>(b->words.size()),
                                  MPI_UINT64_T, MPI_BAND, comm_, &req));
    waitMpi(&req, timeoutS_, "negotiation (waiting for every rank to start the same cycle)", b);
    words = b->words;
  }

  std::vector<std::string> gatherToRoot(const std::string &blob) override {
    throwIfMpiBroken();
    auto b = std::make_shared<Buffers>();
    b->text = blob;
    b->length = static_cast<int64_t>(blob.size());
    b->lengths.resize(rank_ == 0 ? static_cast<size_t>(size_) : 0);
    MPI_Request req;
    HORA_CHECK_MPI(MPI_Igather(&b->length, 1, MPI_INT64_T, b->lengths.data(), 1, MPI_INT64_T, 0, comm_, &req));
    waitMpi(&req, timeoutS_, "negotiation (gathering requests at the coordinator)", b);
    std::vector<int> &counts = b->counts, &displs = b->displs;
    if (rank_ == 0) {
      int64_t total = 0;
      for (int64_t n : b->lengths) {
        if (n > INT_MAX || total > INT_MAX - n) {
          HORA_THROW(HORA_ERR_INTERNAL, "control message of ", total + n, " bytes is too large");
        }
        counts.push_back(static_cast<int>(n));
        displs.push_back(static_cast<int>(total));
        total += n;
      }
      b->all.resize(static_cast<size_t>(total));
    }
    HORA_CHECK_MPI(MPI_Igatherv(b->text.data(), static_cast<int>(b->length), MPI_BYTE, &b->all[0],
                                counts.data(), displs.data(), MPI_BYTE, 0, comm_, &req));
    waitMpi(&req, timeoutS_, "negotiation (gathering requests at the coordinator)", b);
    std::vector<std::string> out;
    for (size_t r = 0; r < counts.size(); ++r) {
      out.push_back(b->all.substr(static_cast<size_t>(displs[r]), static_cast<size_t>(counts[r])));
    }
    return out;
  }

  void broadcastFromRoot(std::string &blob) override {
    throwIfMpiBroken();
    auto b = std::make_shared<Buffers>();
    b->length = static_cast<int64_t>(blob.size());
    MPI_Request req;
    HORA_CHECK_MPI(MPI_Ibcast(&b->length, 1, MPI_INT64_T, 0, comm_, &req));
    waitMpi(&req, timeoutS_, "negotiation (waiting for the coordinator's responses)", b);
    if (b->length > INT_MAX) HORA_THROW(HORA_ERR_INTERNAL, "response list of ", b->length, " bytes");
    b->all = blob;
    b->all.resize(static_cast<size_t>(b->length));
    HORA_CHECK_MPI(MPI_Ibcast(&b->all[0], static_cast<int>(b->length), MPI_BYTE, 0, comm_, &req));
    waitMpi(&req, timeoutS_, "negotiation (waiting for the coordinator's responses)", b);
    blob = b->all;
  }

 private:
  struct Buffers {
    std::vector<uint64_t> words;
    int64_t length = 0;
    std::vector<int64_t> lengths;
    std::vector<int> counts, displs;
    std::string text, all;
  };
  MPI_Comm comm_;
  double timeoutS_;
  int rank_ = 0;
  int size_ = 1;
};

// Presence over a private communicator: each line is a short message to every peer, at most one
// in flight per peer (a stopped peer costs one buffered message); collect() drains what arrived.
// Called from the set's watchdog thread, so the world needs MPI_THREAD_MULTIPLE.
class MpiPresence final : public Presence {
 public:
  explicit MpiPresence(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    sends_.assign(static_cast<size_t>(size_), MPI_REQUEST_NULL);
    buffers_.resize(static_cast<size_t>(size_));
    latest_.resize(static_cast<size_t>(size_));
  }
  ~MpiPresence() override {
    if (mpiPlaneIsBroken()) return;  // no MPI call after that, and the sends may stay pending
    for (MPI_Request &r : sends_) {
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);  // eager: the bytes are already out
    }
  }

  void publish(const std::string &line) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (mpiPlaneIsBroken()) return;
    drain();
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request &req = sends_[static_cast<size_t>(r)];
      int done = 1;
      if (req != MPI_REQUEST_NULL && MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) continue;
      if (!done) continue;  // the last one is still on its way
      std::string &buffer = buffers_[static_cast<size_t>(r)];
      buffer = line;
      MPI_Isend(buffer.data(), static_cast<int>(buffer.size()), MPI_BYTE, r, kBeatTag, comm_, &req);
    }
  }

  std::vector<std::string> collect() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!mpiPlaneIsBroken()) drain();
    return latest_;
  }

  // Collective over the group, once nobody publishes any more, before the communicator is freed:
  // consumes every line still on its way. A line that arrived after its receiver freed the
  // communicator would wait in Open MPI for a communicator of the same context id, and one made
  // later for a smaller group (a process set) would take it from a rank it does not have, which
  // crashes ob1 (mca_pml_ob1_add_comm). One byte from every rank to every other, on the same
  // communicator, arrives after that rank's last line (MPI does not let messages of one sender on
  // one communicator overtake each other); after it, drain() finds every line.
  void quiesce() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (mpiPlaneIsBroken()) return;
    MPI_Waitall(size_, sends_.data(), MPI_STATUSES_IGNORE);
    std::vector<char> out(static_cast<size_t>(size_)), in(static_cast<size_t>(size_));
    if (MPI_Alltoall(out.data(), 1, MPI_CHAR, in.data(), 1, MPI_CHAR, comm_) != MPI_SUCCESS) return;
    drain();
  }

 private:
  void drain() {
    for (;;) {
      int flag = 0;
      MPI_Message message;
      MPI_Status st;
      if (MPI_Improbe(MPI_ANY_SOURCE, kBeatTag, comm_, &flag, &message, &st) != MPI_SUCCESS || !flag) return;
      int bytes = 0;
      MPI_Get_count(&st, MPI_BYTE, &bytes);
      std::string text(static_cast<size_t>(bytes), '\0');
      MPI_Mrecv(bytes > 0 ? &text[0] : nullptr, bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      if (st.MPI_SOURCE >= 0 && st.MPI_SOURCE < size_) latest_[static_cast<size_t>(st.MPI_SOURCE)] = text;
    }
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::mutex mutex_;  // guards everything below
  std::vector<MPI_Request> sends_;
  std::vector<std::string> buffers_;  // what each pending send reads
  std::vector<std::string> latest_;
};

class MpiCommGroup final : public MpiGroup {
 public:
  // Takes ownership of `control` and makes private duplicates of it for data and presence (the
  // latter only with MPI_THREAD_MULTIPLE: it is used from the watchdog thread).
  MpiCommGroup(MPI_Comm control, double timeoutS, bool presence) : control_(control) {
    HORA_CHECK_MPI(MPI_Comm_dup(control_, &data_));
    HORA_CHECK_MPI(MPI_Comm_dup(control_, &presenceComm_));
    // Errors come back as codes (turned into HORA_ERR_BACKEND) instead of aborting the job.
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(presenceComm_, MPI_ERRORS_RETURN);
    plane_ = std::make_unique<MpiControlPlane>(control_, timeoutS);
    if (presence) presence_ = std::make_unique<MpiPresence>(presenceComm_);
  }
  ~MpiCommGroup() override {
    // Freeing is collective in effect; skip it when a peer may never take part.
    if (presence_ && !poisoned_ && !mpiPlaneIsBroken()) presence_->quiesce();
    presence_.reset();
    if (!poisoned_ && !mpiPlaneIsBroken()) {
      MPI_Comm_free(&control_);
      MPI_Comm_free(&data_);
      MPI_Comm_free(&presenceComm_);
    }
  }
  ControlPlane &control() override { return *plane_; }
  void poison(int status, const std::string &why) override {
    poisoned_ = true;
    mpiPlaneBroken(status, why);
  }
  // A posted MPI collective cannot be cancelled: as after a timeout, the plane of this process
  // is broken. Makes no MPI call (any thread may abort; MPI may not allow a second one): every
  // wait throws at its next look, and the engine then poisons the group, which tells the peers.
  void interrupt(const Status &why) override { gInterrupted.raise(why); }
  bool usesSockets() const override { return false; }
  Presence *presence() override { return presence_.get(); }
  MPI_Comm dataComm() const override { return data_; }
  MPI_Comm controlComm() const { return control_; }

 private:
  MPI_Comm control_ = MPI_COMM_NULL;
  MPI_Comm data_ = MPI_COMM_NULL;
  MPI_Comm presenceComm_ = MPI_COMM_NULL;
  std::unique_ptr<MpiControlPlane> plane_;
  std::unique_ptr<MpiPresence> presence_;
  bool poisoned_ = false;
};

class MpiWorld final : public Bootstrap {
 public:
  explicit MpiWorld(double timeoutS) : timeoutS_(timeoutS) {
    int initialized = 0, finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      HORA_THROW(HORA_ERR_UNSUPPORTED,
                 "hora_init: MPI was already finalized in this process; MPI cannot start again");
    }
    if (mpiPlaneIsBroken()) {
      std::lock_guard<std::mutex> lock(gBrokenMutex);
      HORA_THROW(HORA_ERR_UNSUPPORTED, "hora_init: the MPI plane of this process broke in an "
                 "earlier runtime and cannot be used again (", gBrokenWhy, ")");
    }
    MPI_Initialized(&initialized);
    int provided = 0;
    if (!initialized) {
      // MULTIPLE: each process set has its own hora thread, and the application may keep using
      // MPI from its own threads next to hora's.
      HORA_CHECK_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      gWeInitializedMpi = true;
    } else {
      MPI_Query_thread(&provided);
    }
    threadLevel_ = provided;
    if (provided < MPI_THREAD_SERIALIZED) {
      HORA_LOG(kWarning) << "MPI was initialized with thread level " << provided
                         << "; hora calls MPI from its own thread and needs MPI_THREAD_SERIALIZED"
                            " (MPI_THREAD_MULTIPLE for process sets, or if the application also "
                            "calls MPI)";
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &topology_.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &topology_.size);
    MPI_Comm local, cross;
    HORA_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, topology_.rank,
                                       MPI_INFO_NULL, &local));
    MPI_Comm_rank(local, &topology_.localRank);
    MPI_Comm_size(local, &topology_.localSize);
    HORA_CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, topology_.localRank, topology_.rank, &cross));
    MPI_Comm_rank(cross, &topology_.crossRank);
    MPI_Comm_size(cross, &topology_.crossSize);
    MPI_Comm_free(&local);
    MPI_Comm_free(&cross);
    if (gFaultComm == MPI_COMM_NULL) {
      HORA_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &gFaultComm));
      MPI_Comm_set_errhandler(gFaultComm, MPI_ERRORS_RETURN);
    }
  }

  const char *launcher() const override { return "mpi"; }
  const Topology &topology() const override { return topology_; }

  std::unique_ptr<Group> worldGroup() override {
    MPI_Comm control;
    HORA_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &control));
    return std::make_unique<MpiCommGroup>(control, timeoutS_, threadLevel_ >= MPI_THREAD_MULTIPLE);
  }

  std::unique_ptr<Group> createGroup(Group &world, const std::vector<int> &ranks) override {
    if (threadLevel_ < MPI_THREAD_MULTIPLE) {
      HORA_THROW(HORA_ERR_UNSUPPORTED, "hora_process_set_create: process sets run on threads of "
                 "their own and need MPI_THREAD_MULTIPLE; MPI was initialized with level ",
                 threadLevel_);
    }
    auto &parent = dynamic_cast<MpiCommGroup &>(world);
    const bool member = std::binary_search(ranks.begin(), ranks.end(), topology_.rank);
    MPI_Comm comm;
    HORA_CHECK_MPI(MPI_Comm_split(parent.controlComm(), member ? 0 : MPI_UNDEFINED,
                                  topology_.rank, &comm));
    if (!member) return nullptr;
    return std::make_unique<MpiCommGroup>(comm, timeoutS_, /*presence=*/true);
  }

  std::unique_ptr<Group> splitGroup(Group &parent, int color, int key) override {
    auto &group = dynamic_cast<MpiCommGroup &>(parent);
    MPI_Comm comm;
    HORA_CHECK_MPI(MPI_Comm_split(group.controlComm(), color < 0 ? MPI_UNDEFINED : color, key, &comm));
    if (color < 0) return nullptr;
    return std::make_unique<MpiCommGroup>(comm, timeoutS_, /*presence=*/false);
  }

 private:
  double timeoutS_;
  int threadLevel_ = MPI_THREAD_SINGLE;
  Topology topology_;
};

}  // namespace

void finalizeMpiIfOurs() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!gWeInitializedMpi || !initialized || finalized) return;
  if (mpiPlaneIsBroken()) {
    std::lock_guard<std::mutex> lock(gBrokenMutex);
    HORA_LOG(kWarning) << "not calling MPI_Finalize at exit: it would wait for the rank that is "
                          "missing (" << gBrokenWhy << "); mpirun ends the job when a rank exits "
                          "without it";
    return;
  }
  MPI_Finalize();
}

void mpiPlaneBroken(int status, const std::string &why) {
  std::lock_guard<std::mutex> lock(gBrokenMutex);
  if (gNoticeSent || gBrokenByPeer) return;
  if (!gBroken.load()) gBrokenStatus = status;
  gBrokenWhy = why;  // the engine's words: the local timeout's, and who was missing
  gNoticeSent = true;
  // The last MPI calls of this process: a notice to every other rank, sent and never waited for
  // (the buffer is leaked on purpose; a stopped rank's copy may stay pending).
  if (gFaultComm != MPI_COMM_NULL) {
    int me = 0, n = 1;
    MPI_Comm_rank(gFaultComm, &me);
    MPI_Comm_size(gFaultComm, &n);
    auto *notice = new std::string(4, '\0');
    const int32_t code = status;
    std::memcpy(&(*notice)[0], &code, sizeof code);
    notice->append(why);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      MPI_Request req;
      if (MPI_Isend(notice->data(), static_cast<int>(notice->size()), MPI_BYTE, r, kFaultTag,
                    gFaultComm, &req) == MPI_SUCCESS) {
        MPI_Request_free(&req);
      }
    }
  }
  gBroken = true;
}

bool mpiPlaneIsBroken() { return gBroken.load(std::memory_order_acquire); }

void throwIfMpiBroken() {
  if (!gBroken.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(gBrokenMutex);
  throw Error(static_cast<hora_status_t>(gBrokenStatus), gBrokenWhy, __FILE__, __LINE__);
}

void throwMpiError(const char *call, int code, const char *file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "code %d", code);
  std::string name(call);
  name = name.substr(0, name.find('('));
  throw Error(HORA_ERR_BACKEND,
              detail::concat(name, " failed on rank ", worldRankOrMinus1(), ": ", text), file, line);
}

void waitMpi(MPI_Request *requests, int count, double timeoutS, const char *what,
             const std::shared_ptr<void> &buffers, MpiWait how) {
  using Clock = std::chrono::steady_clock;
  int done = 0;
  for (int spin = 0; spin < 256; ++spin) {
    HORA_CHECK_MPI(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE));
    if (done) return;
  }
  const auto start = Clock::now();
  const auto limit = std::chrono::duration<double>(timeoutS);
  long pauseNs = 2000;
  for (uint64_t round = 0;; ++round) {
    HORA_CHECK_MPI(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE));
    if (done) return;
    if (how == MpiWait::kBusy && (round & 1023) != 0) continue;  // data in flight: keep it moving
    takeFaultNotice();
    throwIfMpiBroken();
    gInterrupted.check();
    if (Clock::now() - start > limit) {
      // Leaked on purpose (once per timed-out operation; the plane is broken after one).
      static std::mutex abandonedMutex;  // guards *abandoned
      static auto *abandoned = new std::vector<std::shared_ptr<void>>();
      {
        std::lock_guard<std::mutex> lock(abandonedMutex);
        abandoned->push_back(buffers);
      }
      const std::string why = detail::concat(
          what, ": no answer from every rank after ", timeoutS,
          " s (HORA_TIMEOUT_S); a rank may have stopped submitting, exited or hung");
      recordBroken(HORA_ERR_TIMEOUT, why, /*byPeer=*/false);  // the engine tells the peers
      HORA_THROW(HORA_ERR_TIMEOUT, why);
    }
    if (how == MpiWait::kPatient) {
      timespec pause{0, pauseNs};
      nanosleep(&pause, nullptr);
      pauseNs = std::min(pauseNs * 2, 500000L);
    }
  }
}

std::unique_ptr<Bootstrap> createMpiBootstrap(double timeoutS) {
  return std::make_unique<MpiWorld>(timeoutS);
}

}  // namespace hora
