// SPDX-License-Identifier: Apache-2.0
// Hierarchical collectives for a process set that spans hosts: shared memory inside each host,
// the set's cross-host plane between them.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/knobs.h"
#include "core/backend.h"
#include "core/world.h"

namespace hora {

// Collective over `group` (a set whose ranks are on several hosts, `inner` its plane). Unless
// HORA_HIERARCHICAL=off, or no host holds two of its ranks, or the pieces below cannot be made on
// every rank, returns a backend that runs large allreduces hierarchically and forwards the rest
// to `inner`; otherwise returns `inner`, with the reason in *why.
//
// The pieces: the set's ranks on this host (a group of their own with a shared segment), and,
// for local index l below K (the fewest ranks any host holds, or fewer: HORA_HIER_OWNERS), the
// group of the ranks with local index l on every host, with a CPU plane of its own chosen as any
// set's is (UCX by default across hosts; HORA_CPU_BACKEND applies). An allreduce of N bytes then
// moves N/K bytes per owner across hosts, K owners per host in parallel (HierAllreduce): each
// host's link carries about the buffer once per direction, where a flat ring carries 2(P-1)/P
// times it through every rank.
//
// Its own planes come from `makePlane`, which the composition root (backends/registry.cpp)
// supplies: it decides what serves inside a host and what across hosts, and neither is wrapped
// hierarchically again. Collective over `group` as a plane's making is.
enum class HierPlane { kInsideHost, kAcrossHosts };
using MakeHierPlane = std::function<std::unique_ptr<Backend>(HierPlane which, Group &group)>;
std::unique_ptr<Backend> wrapHierarchical(std::unique_ptr<Backend> inner, Bootstrap &bootstrap,
                                          Group &group, const Knobs &knobs, const MakeHierPlane &makePlane,
                                          std::string *why);

}  // namespace hora
