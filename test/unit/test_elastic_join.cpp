// SPDX-License-Identifier: Apache-2.0
// An elastic worker's side of the agents' worlds (bootstrap/env/elastic.h), with this test as the
// agents: placement, a worker left out of a closed world asking again, the agents' error, the
// update key; and the agent store's variables (launch_config.h).
#include <unistd.h>

#include <map>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "base/error.h"
#include "bootstrap/env/elastic.h"
#include "bootstrap/env/launch_config.h"
#include "bootstrap/env/tcp_store.h"

namespace hora {
namespace {

const unsigned kWatchdog = alarm(120);

struct Agents {
  TcpStoreServer server{"127.0.0.1", 0};
  TcpStoreClient store{"127.0.0.1", server.port(), 10.0};
  std::shared_ptr<TcpStoreClient> client() {
    return std::make_shared<TcpStoreClient>("127.0.0.1", server.port(), 10.0);
  }
  // The k-th worker that asked to be in world g, waiting for it.
  std::string asked(int g, int k) {
    return store.get("P/w" + std::to_string(g) + "/reg/" + std::to_string(k));
  }
};

TEST(ElasticJoin, AgentsPlaceWorkersInTheirOrder) {
  Agents agents;
  agents.store.set("P/w/open", "0");
  ElasticPlace a, b;
  std::thread ta([&] { a = joinElasticWorld(*agents.client(), "P/", "host:1/0", 10); });
  std::thread tb([&] { b = joinElasticWorld(*agents.client(), "P/", "host:1/1", 10); });
  agents.store.wait({"P/w0/reg/1", "P/w0/reg/2"});
  agents.store.set("P/w/open", "1");
  agents.store.set("P/w0/world", "ok\nhost:1/1\nhost:1/0");
  ta.join();
  tb.join();
  EXPECT_EQ(a.rank, 1);
  EXPECT_EQ(b.rank, 0);
  EXPECT_EQ(a.size, 2);
  EXPECT_EQ(b.size, 2);
  EXPECT_EQ(a.world, 0u);
  EXPECT_EQ(elasticUpdateKey("P/", 3), "P/w3/update");
}

TEST(ElasticJoin, WorkerLeftOutAsksForTheNextWorld) {
  Agents agents;
  agents.store.set("P/w/open", "4");
  ElasticPlace late;
  std::thread t([&] { late = joinElasticWorld(*agents.client(), "P/", "h:2/7", 10); });
  EXPECT_EQ(agents.asked(4, 1), "h:2/7");
  agents.store.set("P/w/open", "5");
  agents.store.set("P/w4/world", "ok\nh:2/1");  // closed without it
  EXPECT_EQ(agents.asked(5, 1), "h:2/7");
  agents.store.set("P/w5/world", "ok\nh:2/1\nh:2/7");
  t.join();
  EXPECT_EQ(late.world, 5u);
  EXPECT_EQ(late.rank, 1);
  EXPECT_EQ(late.size, 2);
}

TEST(ElasticJoin, AgentsErrorReachesTheWorker) {
  Agents agents;
  agents.store.set("P/w/open", "0");
  agents.store.set("P/w0/world", "error 6\nonly 1 workers were ready, and --min-np is 2");
  try {
    joinElasticWorld(*agents.client(), "P/", "x/0", 10);
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_TIMEOUT);
    EXPECT_NE(e.message().find("horarun's agents: only 1 workers were ready, and --min-np is 2"),
              std::string::npos)
        << e.message();
  }
}

TEST(ElasticJoin, NoAnswerTimesOut) {
  Agents agents;
  agents.store.set("P/w/open", "0");
  try {
    joinElasticWorld(*agents.client(), "P/", "x/0", 0.3);
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_TIMEOUT);
    EXPECT_NE(e.message().find("elastic worker x/0"), std::string::npos) << e.message();
  }
}

TEST(ElasticJoin, WorldChangedFollowsTheUpdateKeyOfTheCurrentWorld) {
  Agents agents;
  auto world = agents.client();
  EXPECT_EQ(elasticWorldChanged(), 0);  // not in an elastic world
  enterElasticWorld(world, "P/w2/update");
  EXPECT_EQ(elasticWorldChanged(), 0);
  agents.store.set("P/w2/update", "a worker asks to join");
  EXPECT_EQ(elasticWorldChanged(), 1);
  // An earlier world ending after this one began must not take this one's key away.
  leaveElasticWorld("P/w1/update");
  EXPECT_EQ(elasticWorldChanged(), 1);
  leaveElasticWorld("P/w2/update");
  EXPECT_EQ(elasticWorldChanged(), 0);
}

EnvLookup envOf(const std::map<std::string, std::string> &vars) {
  return [vars](const char *name) -> const char * {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(AgentStore, ReplacesTheMasterForHoraOnly) {
  const LaunchConfig c = readEnvConfig(envOf({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"},
                                              {"RANK", "1"}, {"WORLD_SIZE", "2"},
                                              {"HORA_AGENT_STORE", "10.0.0.9:29400"},
                                              {"HORA_STORE_PREFIX", "rdzv/j/r3/"}}));
  EXPECT_TRUE(c.agentStore);
  EXPECT_EQ(c.masterAddr, "10.0.0.9");
  EXPECT_EQ(c.masterPort, 29400);
  EXPECT_EQ(c.storePrefix, "rdzv/j/r3/");
  EXPECT_EQ(c.rank, 1);
  const LaunchConfig v6 = readEnvConfig(envOf({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}, {"RANK", "0"},
                                               {"WORLD_SIZE", "1"}, {"HORA_AGENT_STORE", "[fd00::1]:7"}}));
  EXPECT_EQ(v6.masterAddr, "fd00::1");
  EXPECT_EQ(v6.masterPort, 7);
  const LaunchConfig plain = readEnvConfig(envOf({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}, {"RANK", "0"},
                                                  {"WORLD_SIZE", "1"}}));
  EXPECT_FALSE(plain.agentStore);
  EXPECT_EQ(plain.storePrefix, "");
}

TEST(AgentStore, BadValuesNameTheVariable) {
  for (const char *bad : {"nohost", ":29400", "h:x", "h:70000"}) {
    try {
      readEnvConfig(envOf({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}, {"RANK", "0"}, {"WORLD_SIZE", "1"},
                           {"HORA_AGENT_STORE", bad}}));
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
      EXPECT_NE(e.message().find("HORA_AGENT_STORE"), std::string::npos) << e.message();
    }
  }
}

TEST(AgentStore, ElasticWorkerNeedsTheAgentsVariables) {
  EXPECT_TRUE(elasticWorker(envOf({{"HORA_ELASTIC", "1"}})));
  EXPECT_FALSE(elasticWorker(envOf({{"HORA_ELASTIC", "0"}})));
  const LaunchConfig c = readElasticConfig(envOf({{"HORA_ELASTIC", "1"}, {"HORA_AGENT_STORE", "h:5"},
                                                  {"HORA_STORE_PREFIX", "rdzv/j/"},
                                                  {"HORA_ELASTIC_ID", "h:9/0"}}));
  EXPECT_TRUE(c.elastic);
  EXPECT_EQ(c.elasticId, "h:9/0");
  EXPECT_EQ(c.masterAddr, "h");
  try {
    readElasticConfig(envOf({{"HORA_ELASTIC", "1"}, {"HORA_AGENT_STORE", "h:5"}}));
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_NE(e.message().find("HORA_STORE_PREFIX is not set"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace hora
