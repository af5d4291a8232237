// SPDX-License-Identifier: Apache-2.0
// The TCP store: semantics, blocking, timeouts, concurrency, hostile input and lost servers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "bootstrap/env/tcp_store.h"
#include "time_scale.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;

// A hang anywhere fails the whole binary instead of blocking the test run.
const unsigned kWatchdog = alarm(120);

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A loopback socket listening on a kernel-chosen port (the caller closes it).
int listeningSocket(int *port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
  EXPECT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

int rawConnect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
  return fd;
}

// The wire format, written out independently of the implementation (see tcp_store.cpp).
void u32(std::string &out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
std::string body(uint8_t command, uint32_t waitMs, const std::vector<std::string> &args) {
  std::string b(1, static_cast<char>(command));
  u32(b, waitMs);
  u32(b, static_cast<uint32_t>(args.size()));
  for (const std::string &a : args) {
    u32(b, static_cast<uint32_t>(a.size()));
    b += a;
  }
  return b;
}
std::string frame(const std::string &b) {
  std::string f;
  u32(f, static_cast<uint32_t>(b.size()));
  return f + b;
}

// Reads until EOF or `timeoutMs`; returns what arrived and whether the peer closed.
std::string readUntilClosed(int fd, int timeoutMs, bool *closed) {
  std::string got;
  *closed = false;
  const Clock::time_point end = Clock::now() + std::chrono::milliseconds(timeoutMs);
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      *closed = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

TEST(TcpStore, SetGetAddCheckWait) {
  TcpStoreServer server("127.0.0.1", 0);
  ASSERT_GT(server.port(), 0);
  TcpStoreClient a("127.0.0.1", server.port(), 5);
  TcpStoreClient b("127.0.0.1", server.port(), 5);
  a.set("alpha", "one");
  EXPECT_EQ(b.get("alpha"), "one");
  b.set("alpha", "two");  // overwrite
  EXPECT_EQ(a.get("alpha"), "two");
  EXPECT_EQ(a.add("n", 5), 5);
  EXPECT_EQ(b.add("n", -7), -2);
  EXPECT_EQ(a.add("n", 0), -2);
  EXPECT_EQ(b.get("n"), "-2");  // counters read back as decimal text
  EXPECT_TRUE(a.check({"alpha", "n"}));
  EXPECT_FALSE(a.check({"alpha", "absent"}));
  EXPECT_TRUE(a.check({}));
  a.wait({"alpha", "n"});
  a.wait({});
  a.set("empty", "");
  EXPECT_EQ(b.get("empty"), "");
  EXPECT_TRUE(b.check({"empty"}));
  EXPECT_DOUBLE_EQ(a.timeoutS(), 5);
}

TEST(TcpStore, AddOnTextFailsButConnectionSurvives) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient c("127.0.0.1", server.port(), 5);
  c.set("s", "abc");
  try {
    c.add("s", 1);
    FAIL() << "add on a non-integer value succeeded";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(e.message().find("'s'"), std::string::npos) << e.message();
  }
  c.set("big", "9223372036854775807");
  EXPECT_THROW(c.add("big", 1), Error);
  EXPECT_EQ(c.get("s"), "abc");
}

TEST(TcpStore, GetBlocksUntilAnotherClientSets) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient waiter("127.0.0.1", server.port(), 10);
  TcpStoreClient setter("127.0.0.1", server.port(), 10);
  std::string got;
  double waited = 0;
  const Clock::time_point start = Clock::now();
  std::thread t([&] {
    got = waiter.get("late");
    waited = since(start);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // The blocked get must not block other clients of the same server.
  setter.set("other", "x");
  EXPECT_EQ(setter.get("other"), "x");
  setter.set("late", "value");
  t.join();
  EXPECT_EQ(got, "value");
  EXPECT_GE(waited, 0.25);
  EXPECT_LT(waited, 5 * hora_test::timeScale());
}

TEST(TcpStore, WaitReturnsOnlyWhenEveryKeyExists) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient waiter("127.0.0.1", server.port(), 10);
  TcpStoreClient setter("127.0.0.1", server.port(), 10);
  std::atomic<bool> done{false};
  std::thread t([&] {
    waiter.wait({"x", "y", "z"});
    done = true;
  });
  setter.set("y", "1");
  setter.set("x", "1");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done.load());
  setter.add("z", 1);
  t.join();
  EXPECT_TRUE(done.load());
}

TEST(TcpStore, GetTimeoutNamesTheKeyAndKeepsTheConnection) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient c("127.0.0.1", server.port(), 0.3);
  const Clock::time_point start = Clock::now();
  try {
    c.get("missing/key");
    FAIL() << "get of a missing key returned";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_TIMEOUT);
    EXPECT_NE(e.message().find("'missing/key'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("0.3 s"), std::string::npos) << e.message();
  }
  EXPECT_GE(since(start), 0.25);
  EXPECT_LT(since(start), 2.5);
  // The server answered the timeout itself, so the stream is still in step.
  c.set("after", "ok");
  EXPECT_EQ(c.get("after"), "ok");
}

TEST(TcpStore, WaitTimeoutNamesOnlyMissingKeys) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient c("127.0.0.1", server.port(), 5);
  c.set("k1", "v");
  try {
    c.wait({"k1", "k2", "k3"}, 0.2);
    FAIL() << "wait returned";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_TIMEOUT);
    EXPECT_NE(e.message().find("'k2'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("'k3'"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("'k1'"), std::string::npos) << e.message();
  }
  EXPECT_THROW(c.wait({"never"}, 0), Error);  // zero timeout: an immediate answer
  c.wait({"k1"}, 0);
}

TEST(TcpStore, ManyConcurrentClients) {
  TcpStoreServer server("127.0.0.1", 0);
  constexpr int kThreads = 16, kOps = 200;
  TcpStoreClient shared("127.0.0.1", server.port(), 20);  // one client used by every thread too
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        TcpStoreClient own("127.0.0.1", server.port(), 20);
        for (int i = 0; i < kOps; ++i) {
          const std::string key = "t" + std::to_string(t) + "/" + std::to_string(i);
          own.set(key, std::to_string(t * 100000 + i));
          own.add("counter", 1);
          shared.add("shared", 2);
          if (own.get(key) != std::to_string(t * 100000 + i)) ++failures;
          // Read a neighbour's key, waiting for it if that thread is behind (on the own client:
          // a get parked on the shared one would stall every thread's shared.add behind it).
          const int peer = (t + 1) % kThreads;
          if (i % 20 == 0 &&
              own.get("t" + std::to_string(peer) + "/" + std::to_string(i)) !=
                  std::to_string(peer * 100000 + i)) {
            ++failures;
          }
        }
      } catch (const std::exception &e) {
        ADD_FAILURE() << e.what();
        ++failures;
      }
    });
  }
  for (std::thread &t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  TcpStoreClient check("127.0.0.1", server.port(), 5);
  EXPECT_EQ(check.add("counter", 0), kThreads * kOps);
  EXPECT_EQ(check.add("shared", 0), 2 * kThreads * kOps);
  std::vector<std::string> all;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kOps; ++i) all.push_back("t" + std::to_string(t) + "/" + std::to_string(i));
  }
  EXPECT_TRUE(check.check(all));
}

TEST(TcpStore, BinaryKeysAndValues) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient c("127.0.0.1", server.port(), 5);
  std::string value;
  for (int i = 0; i < 512; ++i) value.push_back(static_cast<char>(i & 0xff));
  const std::string key("k\0ey\xff", 5);
  c.set(key, value);
  EXPECT_EQ(c.get(key), value);
  EXPECT_FALSE(c.check({std::string("k", 1)}));  // the NUL is part of the key
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); i += 4093) big[i] = static_cast<char>(i);
  c.set("big", big);
  EXPECT_EQ(c.get("big"), big);
}

TEST(TcpStore, RequestsQueuedBehindAWaitAreAnsweredInOrder) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient setter("127.0.0.1", server.port(), 5);
  const int fd = rawConnect(server.port());
  // A get that has to wait, then a set, pipelined in one write.
  const std::string both = frame(body(2, 5000, {"gate"})) + frame(body(1, 0, {"after", "v"}));
  ASSERT_EQ(send(fd, both.data(), both.size(), 0), static_cast<ssize_t>(both.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(setter.check({"after"}));  // still queued behind the wait
  setter.set("gate", "open");
  bool closed = false;
  std::string got;
  const Clock::time_point start = Clock::now();
  while (got.size() < 9 + 4 + 1 && since(start) < 3) {
    got += readUntilClosed(fd, 100, &closed);
  }
  // Reply 1: length 5, status ok, "open"; reply 2: length 1, status ok.
  ASSERT_EQ(got.size(), 14u);
  EXPECT_EQ(got.substr(0, 9), std::string("\x05\0\0\0\0open", 9));
  EXPECT_EQ(got.substr(9), std::string("\x01\0\0\0\0", 5));
  EXPECT_EQ(setter.get("after"), "v");
  close(fd);
}

TEST(TcpStore, MalformedMessagesCloseOnlyThatConnection) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient good("127.0.0.1", server.port(), 5);
  // A well-behaved client blocked in a wait must survive all of this.
  TcpStoreClient waiter("127.0.0.1", server.port(), 20);
  std::string waited;
  std::thread t([&] { waited = waiter.get("finally"); });
  // A peer that sends half a frame and stalls must not hold anyone up either.
  const int stalled = rawConnect(server.port());
  ASSERT_EQ(send(stalled, "\x40\0\0\0\x01", 5, 0), 5);

  std::string truncatedArg = body(1, 0, {"key", "value"});
  truncatedArg.resize(truncatedArg.size() - 2);
  std::string argcHuge = body(4, 0, {});
  argcHuge[5] = argcHuge[6] = argcHuge[7] = argcHuge[8] = '\x7f';
  std::string argLenHuge = body(1, 0, {"k", "v"});
  argLenHuge[9] = argLenHuge[10] = argLenHuge[11] = argLenHuge[12] = '\xff';
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"length 0xffffffff", std::string("\xff\xff\xff\xff", 4)},
      {"length 0", std::string(4, '\0')},
      {"length 3", frame("abc")},
      {"unknown command", frame(body(77, 0, {"k"}))},
      {"command 0", frame(body(0, 0, {}))},
      {"argument count past the end", frame(argcHuge)},
      {"argument length past the end", frame(argLenHuge)},
      {"truncated argument", frame(truncatedArg)},
      {"stray bytes", frame(body(1, 0, {"k", "v"}) + "junk")},
      {"set with one argument", frame(body(1, 0, {"k"}))},
      {"get with two arguments", frame(body(2, 0, {"a", "b"}))},
      {"add with a 4-byte delta", frame(body(3, 0, {"n", "1234"}))},
  };
  for (const auto &[what, bytes] : bad) {
    const int fd = rawConnect(server.port());
    ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    bool closed = false;
    const std::string reply = readUntilClosed(fd, 3000, &closed);
    EXPECT_TRUE(closed) << what;
    EXPECT_TRUE(reply.empty()) << what;
    close(fd);
    good.set("alive", what);
    EXPECT_EQ(good.get("alive"), what);
  }
  // A valid frame on a raw socket is served (so the rejections above were about content).
  const int fd = rawConnect(server.port());
  const std::string ok = frame(body(1, 0, {"raw", "yes"}));
  ASSERT_EQ(send(fd, ok.data(), ok.size(), 0), static_cast<ssize_t>(ok.size()));
  bool closed = false;
  EXPECT_EQ(readUntilClosed(fd, 300, &closed), std::string("\x01\0\0\0\0", 5));
  EXPECT_FALSE(closed);
  close(fd);
  EXPECT_EQ(good.get("raw"), "yes");

  good.set("finally", "done");
  t.join();
  EXPECT_EQ(waited, "done");
  close(stalled);
}

TEST(TcpStore, PortInUseNamesThisProcess) {
  int port = 0;
  const int holder = listeningSocket(&port);
  const std::string pid = "pid " + std::to_string(getpid());
  for (const std::string host : {"127.0.0.1", ""}) {
    try {
      TcpStoreServer server(host, port);
      FAIL() << "bound a port that is in use (host '" << host << "')";
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
      EXPECT_NE(e.message().find("MASTER_PORT " + std::to_string(port) + " on "), std::string::npos)
          << e.message();
      EXPECT_NE(e.message().find("is in use by " + pid + " ("), std::string::npos) << e.message();
    }
  }
  close(holder);
  TcpStoreServer server("127.0.0.1", port);  // free again
  EXPECT_EQ(server.port(), port);
}

TEST(TcpStore, UnreachableMasterTimesOut) {
  int port = 0;
  close(listeningSocket(&port));  // a port nobody serves
  const Clock::time_point start = Clock::now();
  try {
    TcpStoreClient c("127.0.0.1", port, 0.5);
    FAIL() << "connected to a port nobody serves";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_TIMEOUT);
    EXPECT_EQ(e.message(), "master 127.0.0.1:" + std::to_string(port) +
                               " unreachable after 0.5 s (connection refused); is rank 0 running "
                               "and MASTER_ADDR/MASTER_PORT right?");
  }
  EXPECT_GE(since(start), 0.45);
  EXPECT_LT(since(start), 3);
}

TEST(TcpStore, ClientRetriesUntilTheServerComesUp) {
  int port = 0;
  close(listeningSocket(&port));
  std::unique_ptr<TcpStoreServer> server;
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    server = std::make_unique<TcpStoreServer>("127.0.0.1", port);
  });
  TcpStoreClient c("127.0.0.1", port, 10);
  late.join();
  c.set("k", "v");
  EXPECT_EQ(c.get("k"), "v");
}

TEST(TcpStore, ServerDestroyedWhileClientWaits) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  const int port = server->port();
  TcpStoreClient c("127.0.0.1", port, 30);
  TcpStoreClient idle("127.0.0.1", port, 30);
  hora_status_t status = HORA_SUCCESS;
  std::string message;
  const Clock::time_point start = Clock::now();
  std::thread t([&] {
    try {
      c.get("never");
    } catch (const Error &e) {
      status = e.status();
      message = e.message();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  server.reset();
  t.join();
  EXPECT_LT(since(start), 5 * hora_test::timeScale());
  EXPECT_EQ(status, HORA_ERR_PEER_LOST);
  EXPECT_NE(message.find("lost the connection to the store at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << message;
  // Every later request fails the same way, on both clients.
  try {
    c.set("k", "v");
    FAIL();
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_PEER_LOST);
  }
  try {
    idle.add("k", 1);
    FAIL();
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_PEER_LOST);
  }
}

TEST(TcpStore, FormatHostPort) {
  EXPECT_EQ(formatHostPort("10.0.0.1", 29500), "10.0.0.1:29500");
  EXPECT_EQ(formatHostPort("::1", 80), "[::1]:80");
}

}  // namespace
}  // namespace hora
