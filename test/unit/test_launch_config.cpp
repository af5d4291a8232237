// SPDX-License-Identifier: Apache-2.0
// torchrun-style and Slurm launch variables: every parse, every error, node lists and ports.
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "bootstrap/env/launch_config.h"

namespace hora {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup lookupIn(const Vars &vars) {
  return [&vars](const char *name) -> const char * {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

Vars torchrun() {
  return {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}, {"RANK", "5"}, {"WORLD_SIZE", "8"}};
}

Vars slurm() {
  return {{"SLURM_PROCID", "5"},          {"SLURM_NTASKS", "8"},
          {"SLURM_LOCALID", "1"},         {"SLURM_NODEID", "1"},
          {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_STEP_NODELIST", "gpu[07-08]"},
          {"SLURM_JOB_NODELIST", "gpu[01-09]"}, {"SLURM_JOB_ID", "123456"}};
}

// The message of the Error that `f` throws with `status` (fails the test otherwise).
template <typename F>
std::string errorOf(F f, hora_status_t status = HORA_ERR_INVALID_ARGUMENT) {
  try {
    f();
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), status) << e.message();
    return e.message();
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::string envError(const Vars &vars) {
  return errorOf([&] { readEnvConfig(lookupIn(vars)); });
}
std::string slurmError(const Vars &vars) {
  return errorOf([&] { readSlurmConfig(lookupIn(vars)); });
}

TEST(EnvConfig, RequiredOnly) {
  const Vars v = torchrun();
  const LaunchConfig c = readEnvConfig(lookupIn(v));
  EXPECT_EQ(c.launcher, "env");
  EXPECT_EQ(c.masterAddr, "10.0.0.1");
  EXPECT_EQ(c.masterPort, 29500);
  EXPECT_EQ(c.rank, 5);
  EXPECT_EQ(c.worldSize, 8);
  EXPECT_EQ(c.localRank, -1);
  EXPECT_EQ(c.localWorldSize, -1);
  EXPECT_EQ(c.nodeRank, -1);
}

TEST(EnvConfig, OptionalVariables) {
  Vars v = torchrun();
  v["LOCAL_RANK"] = "1";
  v["LOCAL_WORLD_SIZE"] = "4";
  v["NODE_RANK"] = "1";
  LaunchConfig c = readEnvConfig(lookupIn(v));
  EXPECT_EQ(c.localRank, 1);
  EXPECT_EQ(c.localWorldSize, 4);
  EXPECT_EQ(c.nodeRank, 1);
  // torchrun's name for the node rank.
  v.erase("NODE_RANK");
  v["GROUP_RANK"] = "0";
  c = readEnvConfig(lookupIn(v));
  EXPECT_EQ(c.nodeRank, 0);
  v["NODE_RANK"] = "0";  // both, agreeing
  EXPECT_EQ(readEnvConfig(lookupIn(v)).nodeRank, 0);
  v["NODE_RANK"] = "1";
  EXPECT_EQ(envError(v), "NODE_RANK=1 and GROUP_RANK=0 disagree; unset one");
  // Set but empty counts as unset.
  Vars e = torchrun();
  e["LOCAL_RANK"] = "";
  EXPECT_EQ(readEnvConfig(lookupIn(e)).localRank, -1);
  // Host names are taken as given.
  e["MASTER_ADDR"] = "node01.cluster";
  EXPECT_EQ(readEnvConfig(lookupIn(e)).masterAddr, "node01.cluster");
}

TEST(EnvConfig, MissingRequiredVariables) {
  for (const char *name : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"}) {
    Vars v = torchrun();
    v.erase(name);
    EXPECT_EQ(envError(v), std::string(name) +
                               " is not set; env:// needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE");
    v[name] = "";
    EXPECT_EQ(envError(v), std::string(name) +
                               " is not set; env:// needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE");
  }
}

TEST(EnvConfig, MalformedValues) {
  const std::vector<std::pair<Vars, std::string>> cases = {
      {{{"RANK", "3x"}}, "RANK='3x' is not an integer"},
      {{{"RANK", " 3"}}, "RANK=' 3' is not an integer"},
      {{{"RANK", "0x3"}}, "RANK='0x3' is not an integer"},
      {{{"RANK", "-1"}}, "RANK=-1 is negative"},
      {{{"RANK", "8"}}, "RANK=8 is not below WORLD_SIZE=8"},
      {{{"RANK", "99999999999999999999"}}, "RANK='99999999999999999999' is not an integer"},
      {{{"RANK", "3000000000"}}, "RANK=3000000000 is too large"},
      {{{"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 is not a positive integer"},
      {{{"WORLD_SIZE", "four"}}, "WORLD_SIZE='four' is not an integer"},
      {{{"MASTER_PORT", "70000"}}, "MASTER_PORT=70000 is outside 1..65535"},
      {{{"MASTER_PORT", "0"}}, "MASTER_PORT=0 is outside 1..65535"},
      {{{"MASTER_PORT", "-5"}}, "MASTER_PORT=-5 is outside 1..65535"},
      {{{"MASTER_PORT", "29500 "}}, "MASTER_PORT='29500 ' is not an integer"},
      {{{"LOCAL_RANK", "x"}}, "LOCAL_RANK='x' is not an integer"},
      {{{"LOCAL_RANK", "-2"}}, "LOCAL_RANK=-2 is negative"},
      {{{"LOCAL_RANK", "4"}, {"LOCAL_WORLD_SIZE", "4"}}, "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"},
      {{{"LOCAL_RANK", "8"}}, "LOCAL_RANK=8 is not below WORLD_SIZE=8"},
      {{{"LOCAL_WORLD_SIZE", "0"}}, "LOCAL_WORLD_SIZE=0 is not a positive integer"},
      {{{"LOCAL_WORLD_SIZE", "9"}}, "LOCAL_WORLD_SIZE=9 is above WORLD_SIZE=8"},
      {{{"NODE_RANK", "1.5"}}, "NODE_RANK='1.5' is not an integer"},
      {{{"NODE_RANK", "8"}}, "NODE_RANK=8 is not below WORLD_SIZE=8"},
      {{{"GROUP_RANK", "-1"}}, "GROUP_RANK=-1 is negative"},
      {{{"GROUP_RANK", "9"}}, "GROUP_RANK=9 is not below WORLD_SIZE=8"},
  };
  for (const auto &[changes, expected] : cases) {
    Vars v = torchrun();
    for (const auto &[k, value] : changes) v[k] = value;
    EXPECT_EQ(envError(v), expected);
  }
}

TEST(SlurmConfig, FullStep) {
  const Vars v = slurm();
  const LaunchConfig c = readSlurmConfig(lookupIn(v));
  EXPECT_EQ(c.launcher, "slurm");
  EXPECT_EQ(c.rank, 5);
  EXPECT_EQ(c.worldSize, 8);
  EXPECT_EQ(c.localRank, 1);
  EXPECT_EQ(c.nodeRank, 1);
  EXPECT_EQ(c.localWorldSize, 4);
  EXPECT_EQ(c.masterAddr, "gpu07");  // the step's list wins over the job's
  EXPECT_EQ(c.masterPort, 13456);   // 10000 + 123456 % 20000
}

TEST(SlurmConfig, MasterAndPortPrecedence) {
  Vars v = slurm();
  v.erase("SLURM_STEP_NODELIST");
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).masterAddr, "gpu01");
  v.erase("SLURM_JOB_NODELIST");
  v["SLURM_NODELIST"] = "old-name";
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).masterAddr, "old-name");
  v = slurm();
  v["MASTER_ADDR"] = "10.1.2.3";
  v["SLURM_STEP_NODELIST"] = "[[broken";  // not even read when MASTER_ADDR is set
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).masterAddr, "10.1.2.3");
  v = slurm();
  v["MASTER_PORT"] = "4242";
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).masterPort, 4242);
  v["SLURM_JOB_ID"] = "junk";  // not read when MASTER_PORT is set
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).masterPort, 4242);
  v["MASTER_PORT"] = "99999";
  EXPECT_EQ(slurmError(v), "MASTER_PORT=99999 is outside 1..65535");
}

TEST(SlurmConfig, PortFromJobId) {
  EXPECT_EQ(slurmPortForJob(0), 10000);
  EXPECT_EQ(slurmPortForJob(19999), 29999);
  EXPECT_EQ(slurmPortForJob(20000), 10000);
  EXPECT_EQ(slurmPortForJob(123456), 13456);
  EXPECT_EQ(slurmPortForJob(18446744073709551615ull), 10000 + 11615);
  Vars v = slurm();
  v["SLURM_JOB_ID"] = "7";
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).masterPort, 10007);
}

TEST(SlurmConfig, LocalWorldSize) {
  Vars v = slurm();
  v["SLURM_TASKS_PER_NODE"] = "3,2(x2)";  // uneven: this node's entry (SLURM_NODEID=1)
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).localWorldSize, 2);
  v["SLURM_NODEID"] = "0";
  v["SLURM_LOCALID"] = "2";
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).localWorldSize, 3);
  v.erase("SLURM_NODEID");  // unknown node and uneven layout: derive later
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).localWorldSize, -1);
  v["SLURM_TASKS_PER_NODE"] = "2(x4)";
  v["SLURM_LOCALID"] = "1";
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).localWorldSize, 2);
  // The step's layout wins over the job's.
  v["SLURM_STEP_TASKS_PER_NODE"] = "1(x8)";
  v["SLURM_LOCALID"] = "0";
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).localWorldSize, 1);
  // Only the requested --ntasks-per-node.
  v = slurm();
  v.erase("SLURM_TASKS_PER_NODE");
  v["SLURM_NTASKS_PER_NODE"] = "4";
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).localWorldSize, 4);
  v.erase("SLURM_NTASKS_PER_NODE");
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).localWorldSize, -1);
  v.erase("SLURM_LOCALID");
  v.erase("SLURM_NODEID");
  const LaunchConfig c = readSlurmConfig(lookupIn(v));
  EXPECT_EQ(c.localRank, -1);
  EXPECT_EQ(c.nodeRank, -1);
}

TEST(SlurmConfig, Errors) {
  const std::vector<std::pair<Vars, std::string>> cases = {
      {{{"SLURM_PROCID", "x"}}, "SLURM_PROCID='x' is not an integer"},
      {{{"SLURM_PROCID", "8"}}, "SLURM_PROCID=8 is not below SLURM_NTASKS=8"},
      {{{"SLURM_NTASKS", "0"}}, "SLURM_NTASKS=0 is not a positive integer"},
      {{{"SLURM_LOCALID", "-1"}}, "SLURM_LOCALID=-1 is negative"},
      {{{"SLURM_LOCALID", "4"}}, "SLURM_LOCALID=4 is not below SLURM_TASKS_PER_NODE=4"},
      {{{"SLURM_NODEID", "n1"}}, "SLURM_NODEID='n1' is not an integer"},
      {{{"SLURM_TASKS_PER_NODE", "4(x"}},
       "SLURM_TASKS_PER_NODE='4(x' is not a Slurm task count list like '4(x2),3'"},
      {{{"SLURM_TASKS_PER_NODE", "0(x2)"}},
       "SLURM_TASKS_PER_NODE='0(x2)' is not a Slurm task count list like '4(x2),3'"},
      {{{"SLURM_TASKS_PER_NODE", "4(2)"}},
       "SLURM_TASKS_PER_NODE='4(2)' is not a Slurm task count list like '4(x2),3'"},
      {{{"SLURM_TASKS_PER_NODE", "16(x2)"}}, "SLURM_TASKS_PER_NODE=16 is above SLURM_NTASKS=8"},
      {{{"SLURM_JOB_ID", "12a"}},
       "SLURM_JOB_ID='12a' is not a non-negative integer (it sets the store port; or set MASTER_PORT)"},
      {{{"SLURM_STEP_NODELIST", "gpu[07-"}},
       "SLURM_STEP_NODELIST='gpu[07-' is not a Slurm node list like 'node[01-04],gpu7': '[' without ']'"},
  };
  for (const auto &[changes, expected] : cases) {
    Vars v = slurm();
    for (const auto &[k, value] : changes) v[k] = value;
    EXPECT_EQ(slurmError(v), expected);
  }
  Vars v = slurm();
  v.erase("SLURM_PROCID");
  EXPECT_EQ(slurmError(v), "SLURM_PROCID is not set; the Slurm bootstrap needs tasks started by srun");
  v = slurm();
  v.erase("SLURM_NTASKS");
  EXPECT_EQ(slurmError(v), "SLURM_NTASKS is not set; the Slurm bootstrap needs tasks started by srun");
  v["SLURM_NPROCS"] = "8";  // the older name
  EXPECT_EQ(readSlurmConfig(lookupIn(v)).worldSize, 8);
  v = slurm();
  v.erase("SLURM_STEP_NODELIST");
  v.erase("SLURM_JOB_NODELIST");
  EXPECT_EQ(slurmError(v),
            "none of MASTER_ADDR, SLURM_STEP_NODELIST, SLURM_JOB_NODELIST is set; cannot tell which "
            "host runs rank 0");
  v = slurm();
  v.erase("SLURM_JOB_ID");
  EXPECT_EQ(slurmError(v), "neither MASTER_PORT nor SLURM_JOB_ID is set; cannot choose the store port");
}

TEST(SlurmNodelist, Expansion) {
  using List = std::vector<std::string>;
  EXPECT_EQ(expandSlurmNodelist("node[01-03,7],gpu-a,rack2-[8-9]"),
            (List{"node01", "node02", "node03", "node7", "gpu-a", "rack2-8", "rack2-9"}));
  EXPECT_EQ(expandSlurmNodelist("single"), (List{"single"}));
  EXPECT_EQ(expandSlurmNodelist("a,b,c"), (List{"a", "b", "c"}));
  EXPECT_EQ(expandSlurmNodelist("n[098-101]"), (List{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expandSlurmNodelist("n[8-10]"), (List{"n8", "n9", "n10"}));
  EXPECT_EQ(expandSlurmNodelist("n[5]"), (List{"n5"}));
  EXPECT_EQ(expandSlurmNodelist("n[007]"), (List{"n007"}));
  EXPECT_EQ(expandSlurmNodelist("r[1-2]-n[01-02]"), (List{"r1-n01", "r1-n02", "r2-n01", "r2-n02"}));
  EXPECT_EQ(expandSlurmNodelist("[1-2]x,y[3,5]z"), (List{"1x", "2x", "y3z", "y5z"}));
  EXPECT_EQ(expandSlurmNodelist("a[1-2],b[1-2]"), (List{"a1", "a2", "b1", "b2"}));
  EXPECT_EQ(expandSlurmNodelist("10.0.0.[1-2]"), (List{"10.0.0.1", "10.0.0.2"}));
}

TEST(SlurmNodelist, Malformed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "the list is empty"},
      {"node[1-", "'[' without ']'"},
      {"node1]", "unbalanced brackets"},
      {"node[3-1]", "range '3-1' runs backwards"},
      {"node[a-b]", "'a-b' in brackets is not a number or a range like 01-04"},
      {"node[]", "'' in brackets is not a number or a range like 01-04"},
      {"node[1,]", "'' in brackets is not a number or a range like 01-04"},
      {"node[1-2-3]", "'1-2-3' in brackets is not a number or a range like 01-04"},
      {"node[-3]", "'-3' in brackets is not a number or a range like 01-04"},
      {"a,,b", "an empty host name"},
      {"a,", "an empty host name"},
      {"n[[1]]", "unbalanced brackets"},
      {"n[0-99999999]", "it expands to more than 1048576 hosts"},
  };
  for (const auto &[list, why] : cases) {
    EXPECT_EQ(errorOf([&] { expandSlurmNodelist(list); }),
              "Slurm node list '" + list + "' is malformed: " + why);
  }
}

}  // namespace
}  // namespace hora
