// SPDX-License-Identifier: Apache-2.0
// An elastic worker's side of the agents' rounds: joining the next world, and noticing that one
// is forming. horarun's agents (tools/horarun) decide who is in each world; see docs/elastic.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "bootstrap/bootstrap.h"
#include "bootstrap/env/tcp_store.h"

namespace hora {

// Keys, under the agents' prefix P (HORA_STORE_PREFIX):
//   P w/open          the number g of the world the agents are forming now (they set it)
//   P w<g>/n          counter: every worker that asks to be in world g adds 1, getting k
//   P w<g>/reg/<k>    the k-th worker's id (HORA_ELASTIC_ID)
//   P w<g>/world      the agents' answer: "ok\n" and the member ids in rank order, one a line,
//                     or "error <status>\n" and why (too few workers, the job is over)
//   P w<g>/update     set while world g runs when the agents want a new one (a worker waits
//                     to join, or one was lost): its members should re-form at a safe point
struct ElasticPlace {
  int rank = -1;
  int size = 0;
  uint64_t world = 0;  // g
};

// Asks to be in the world the agents are forming and waits for their answer; a worker they
// left out (it asked after they closed that world) asks again for the next one. Throws the
// agents' Error, or HORA_ERR_TIMEOUT after timeoutS without an answer.
ElasticPlace joinElasticWorld(TcpStoreClient &store, const std::string &prefix, const std::string &id,
                              double timeoutS);

// The store key whose presence says that world g is to be replaced.
std::string elasticUpdateKey(const std::string &prefix, uint64_t world);

// Process-wide: the elastic world this process is in now (set by the env bootstrap once it
// has its place, before the world forms; cleared when that world ends: an earlier world may end
// after the next one began, so leaving names the world), and whether the agents want a new one.
// `store`: a connection of its own (no long waits on it), kept for the checks.
void enterElasticWorld(const std::shared_ptr<TcpStoreClient> &store, const std::string &updateKey);
void leaveElasticWorld(const std::string &updateKey);
// elasticWorldChanged() (declared in bootstrap/bootstrap.h for the API) asks the store of the
// world entered here.

}  // namespace hora
