// SPDX-License-Identifier: Apache-2.0
// What the engine is handed rather than builds: the world it runs in, the groups (process sets) in
// it, and the data planes for each group. lib/core owns these interfaces; lib/bootstrap and
// lib/backends implement them, and the composition root (lib/api/runtime.cpp) picks the
// implementations and hands them to Engine::start.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/control_plane.h"
#include "core/device_executor.h"

namespace hora {

struct Topology {
  int rank = 0;
  int size = 1;
  int localRank = 0;  // among the ranks of this host
  int localSize = 1;
  int crossRank = 0;  // among the ranks with this local rank, one per host
  int crossSize = 1;
};

// A side channel on which each rank of a group says, about once a second, what it is doing (a
// line of text the engine writes: see core/stall_watch.h), so that a rank left waiting can tell
// which peers have not taken part, and what each did last. Never blocks on a peer; a peer that
// is stopped or dead simply goes quiet. Used from the set's watchdog thread.
class Presence {
 public:
  virtual ~Presence() = default;
  // Makes `line` this rank's latest word to every other rank of the group.
  virtual void publish(const std::string &line) = 0;
  // The latest word of each rank of the group, by group rank ("" where none arrived yet).
  virtual std::vector<std::string> collect() = 0;
  // The group's first failure: `line` becomes it unless a rank declared one before (the first
  // declaration wins). Optional: a channel without it declares nothing.
  virtual void declareFailure(const std::string &line) { (void)line; }
  // The first failure declared in the group, or "" (none yet, or the channel has no such word).
  // One cheap look: the watch asks every tick.
  virtual std::string declaredFailure() { return ""; }
};

// A set of ranks with its own private channels: the world, or a process set. Negotiation runs
// over control(); a backend made for the group (Fabric::cpuBackend) moves the data.
class Group {
 public:
  virtual ~Group() = default;
  virtual ControlPlane &control() = 0;
  int rank() { return control().rank(); }
  int size() { return control().size(); }
  // The group is unusable (a peer is lost or a collective timed out, for the reason given):
  // teardown must then not make collective calls that could hang.
  virtual void poison(int status, const std::string &why) = 0;
  // Whether the control plane writes to sockets (a write to a lost peer then raises SIGPIPE in
  // the writing thread unless it is blocked there).
  virtual bool usesSockets() const = 0;
  // The group's side channel, or nullptr where it has none.
  virtual Presence *presence() { return nullptr; }
  // Any thread (a set's abort, SetEngine::abort): makes this rank's waits on the group's channels
  // end soon with Error(why) instead of waiting up to HORA_TIMEOUT_S for a peer, and lets the
  // peers see that this rank left where the channel can (a closed connection). The group is
  // unusable afterwards. Default: nothing (the waits end at their deadline).
  virtual void interrupt(const Status &why) { (void)why; }
};

// The world a launcher formed: who this rank is, and how to make groups in it.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual const char *launcher() const = 0;  // "mpi", "env", "slurm", "single"
  virtual const Topology &topology() const = 0;
  // Where the world met, for the init log line ("store 10.0.0.1:29500"); empty if nowhere.
  virtual std::string rendezvousPoint() const { return ""; }
  // The world as a group; called once.
  virtual std::unique_ptr<Group> worldGroup() = 0;
  // Collective over the world, from the thread that owns `world`: the group of `ranks` (sorted,
  // distinct world ranks). Ranks outside it get nullptr.
  virtual std::unique_ptr<Group> createGroup(Group &world, const std::vector<int> &ranks) = 0;
  // Collective over `parent` (the world or a process set), from the thread that owns it, as
  // MPI_Comm_split: the ranks of `parent` that pass the same color >= 0 form a group, ordered by
  // key, then by rank in `parent`. A rank that passes a negative color gets nullptr. Used for the
  // groups a hierarchical collective needs inside a set (its ranks on one host; one rank per host).
  virtual std::unique_ptr<Group> splitGroup(Group &parent, int color, int key) = 0;
  // The runtime stopped for a failure and is going: keep what the other ranks may still read a
  // moment longer (the store rank 0 serves holds every rank's last word, which names the first
  // failure in the peers' errors). Bounded; default: nothing.
  virtual void lingerAfterFailure() {}
};

// For Bootstrap::splitGroup: every rank's (color, key), gathered over `parent`'s control plane,
// and this rank's place among those of its color. rank/size are -1/0 for a negative color.
struct SplitPlace {
  int rank = -1;
  int size = 0;
};
SplitPlace splitPlace(ControlPlane &parent, int color, int key);

// Everything the engine needs from below, in one object the composition root builds. Each
// method throws Error with a status and the reason on failure.
class Fabric {
 public:
  virtual ~Fabric() = default;
  // Forms the world from the environment. Called once, on the world set's thread.
  virtual std::unique_ptr<Bootstrap> formWorld() = 0;
  // The CPU data plane for `group` (the world or a process set), made on the set's thread.
  // Collective over the group.
  virtual std::unique_ptr<Backend> cpuBackend(Bootstrap &world, Group &group) = 0;
  // The executor for tensors on a GPU for the set behind `control`: `device` is a CUDA ordinal.
  // Collective over the set.
  virtual std::unique_ptr<DeviceExecutor> deviceExecutor(ControlPlane &control, int device,
                                                         DeviceHooks hooks) = 0;
  // The GPU of a rank none of whose tensors named one (it joined before its first CUDA op).
  virtual int defaultDevice(int localRank) = 0;
  // The calling thread's GPU context, put back as it was when the result is dropped: a caller's
  // thread that runs a set's cycles (SetEngine::drive) may launch its device work there.
  virtual std::shared_ptr<void> keepDeviceContext() { return nullptr; }
};

}  // namespace hora
