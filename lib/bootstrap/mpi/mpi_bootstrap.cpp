// SPDX-License-Identifier: Apache-2.0
// MPI bootstrap: MPI_Init_thread unless the program did it, communicators, topology, and the
// control plane over non-blocking collectives (so waiting for peers can time out).
#include "bootstrap/mpi/mpi_bootstrap.h"

#include <time.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <algorithm>
#include <mutex>
#include <vector>

#include "base/knobs.h"
#include "base/logging.h"

namespace hora {
namespace {

// hora finalizes MPI only if it initialized it, and only at process exit: after hora_shutdown a
// later hora_init in the same process must find MPI still usable.
bool gWeInitializedMpi = false;

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
    auto b = std::make_shared<Buffers>();
    b->words = words;
    MPI_Request req;
    HORA_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, b->words.data(), static_cast<int>(b->words.size()),
                                  MPI_UINT64_T, MPI_BAND, comm_, &req));
    waitMpi(&req, timeoutS_, "negotiation (waiting for every rank to start the same cycle)", b);
    words = b->words;
  }

  std::vector<std::string> gatherToRoot(const std::string &blob) override {
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

class MpiCommGroup final : public MpiGroup {
 public:
  // Takes ownership of `control` and makes a private duplicate of it for data.
  MpiCommGroup(MPI_Comm control, double timeoutS) : control_(control) {
    HORA_CHECK_MPI(MPI_Comm_dup(control_, &data_));
    // Errors come back as codes (turned into HORA_ERR_BACKEND) instead of aborting the job.
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
    plane_ = std::make_unique<MpiControlPlane>(control_, timeoutS);
  }
  ~MpiCommGroup() override {
    // Freeing is collective in effect; skip it when a peer may never take part.
    if (!poisoned_) {
      MPI_Comm_free(&control_);
      MPI_Comm_free(&data_);
    }
  }
  ControlPlane &control() override { return *plane_; }
  void poison() override { poisoned_ = true; }
  bool usesSockets() const override { return false; }
  MPI_Comm dataComm() const override { return data_; }
  MPI_Comm controlComm() const { return control_; }

 private:
  MPI_Comm control_ = MPI_COMM_NULL;
  MPI_Comm data_ = MPI_COMM_NULL;
  std::unique_ptr<MpiControlPlane> plane_;
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
  }

  const char *launcher() const override { return "mpi"; }
  const Topology &topology() const override { return topology_; }

  std::unique_ptr<Group> worldGroup() override {
    MPI_Comm control;
    HORA_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &control));
    return std::make_unique<MpiCommGroup>(control, timeoutS_);
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
    return std::make_unique<MpiCommGroup>(comm, timeoutS_);
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
  if (gWeInitializedMpi && initialized && !finalized) MPI_Finalize();
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

void waitMpi(MPI_Request *request, double timeoutS, const char *what,
             const std::shared_ptr<void> &buffers) {
  using Clock = std::chrono::steady_clock;
  int done = 0;
  for (int spin = 0; spin < 256; ++spin) {
    HORA_CHECK_MPI(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return;
  }
  const auto start = Clock::now();
  const auto limit = std::chrono::duration<double>(timeoutS);
  long pauseNs = 2000;
  for (;;) {
    HORA_CHECK_MPI(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (Clock::now() - start > limit) {
      // Leaked on purpose (once per timed-out operation; the runtime is poisoned after one).
      static std::mutex abandonedMutex;  // guards *abandoned
      static auto *abandoned = new std::vector<std::shared_ptr<void>>();
      {
        std::lock_guard<std::mutex> lock(abandonedMutex);
        abandoned->push_back(buffers);
      }
      HORA_THROW(HORA_ERR_TIMEOUT, what, ": no answer from every rank after ", timeoutS,
                 " s (HORA_TIMEOUT_S); a rank may have stopped submitting, exited or hung");
    }
    timespec pause{0, pauseNs};
    nanosleep(&pause, nullptr);
    pauseNs = std::min(pauseNs * 2, 500000L);
  }
}

std::unique_ptr<Bootstrap> createMpiBootstrap(double timeoutS) {
  return std::make_unique<MpiWorld>(timeoutS);
}

}  // namespace hora
