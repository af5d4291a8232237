// SPDX-License-Identifier: Apache-2.0
// The TCP store: semantics, blocking, timeouts, concurrency, hostile input and lost servers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "bootstrap/env/auth.h"
#include "bootstrap/env/tcp_store.h"
#include "hora_config.h"
#include "time_scale.h"
#if HORA_HAVE_GLOO
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include <gloo/transport/tcp/address.h>

#include "bootstrap/env/gloo_group.h"
#include "bootstrap/env/pair_auth.h"
#endif

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

int rawConnectTo(const char *ip, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, ip, &addr.sin_addr);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A raw connection that has not shaken hands.
int rawConnectBare(int port) {
  const int fd = rawConnectTo("127.0.0.1", port);
  EXPECT_GE(fd, 0);
  return fd;
}

std::string frame(const std::string &b);
std::string body(uint8_t command, uint32_t waitMs, const std::vector<std::string> &args);
std::string readReply(int fd);

// A raw connection past the handshake of a store without a token.
int rawConnect(int port) {
  const int fd = rawConnectBare(port);
  const std::string hello = frame(body(6, 0, {"hora-store/1", "", std::string(32, 'n')}));
  EXPECT_EQ(send(fd, hello.data(), hello.size(), 0), static_cast<ssize_t>(hello.size()));
  const std::string challenge = readReply(fd);
  EXPECT_EQ(challenge.size(), 4u + 1 + 1 + 4 + 32 + 4) << "no-token challenge";
  const std::string proof = frame(body(7, 0, {""}));
  EXPECT_EQ(send(fd, proof.data(), proof.size(), 0), static_cast<ssize_t>(proof.size()));
  EXPECT_EQ(readReply(fd), std::string("\x01\0\0\0\0", 5));
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

// One whole reply frame (header included), or what arrived before EOF or 3 s.
std::string readReply(int fd) {
  std::string got;
  const Clock::time_point end = Clock::now() + std::chrono::seconds(3);
  while (Clock::now() < end) {
    if (got.size() >= 4) {
      uint32_t n = 0;
      for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<unsigned char>(got[i])) << (8 * i);
      if (got.size() >= 4 + size_t{n}) break;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
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
    if (what == "length 0xffffffff") {
      // Too large: a client of ours is told why before the store closes the connection.
      EXPECT_NE(reply.find("exceeds the store's limit"), std::string::npos) << reply;
    } else {
      EXPECT_TRUE(reply.empty()) << what;
    }
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

// ------------------------------------------------------------------------------------------------
// Strangers: the job token, limits, idle connections, the address it listens on.

// The message of the Error `body` throws ("" if it returns), with its status in *status.
template <typename F>
std::string errorOf(F &&body, hora_status_t *status) {
  try {
    body();
  } catch (const Error &e) {
    *status = e.status();
    return e.message();
  }
  *status = HORA_SUCCESS;
  return "";
}

TEST(TcpStoreToken, SameTokenIsServedOthersAreRefusedAtOnce) {
  StoreServerOptions options;
  options.token = "s3cret";
  TcpStoreServer server("127.0.0.1", 0, options);
  TcpStoreClient good("127.0.0.1", server.port(), 5, {"s3cret", ""});
  good.set("k", "v");
  EXPECT_EQ(good.get("k"), "v");
  EXPECT_EQ(good.token(), "s3cret");

  hora_status_t status;
  Clock::time_point start = Clock::now();
  std::string message = errorOf([&] { TcpStoreClient("127.0.0.1", server.port(), 5, {"wrong", ""}); }, &status);
  EXPECT_EQ(status, HORA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("refused this process: wrong job token"), std::string::npos) << message;
  EXPECT_LT(since(start), 2.0);  // not after the 5 s timeout

  start = Clock::now();
  message = errorOf([&] { TcpStoreClient("127.0.0.1", server.port(), 5); }, &status);
  EXPECT_EQ(status, HORA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("requires the job's token"), std::string::npos) << message;
  EXPECT_LT(since(start), 2.0);

  // A client with a token does not trust a store without one.
  TcpStoreServer open("127.0.0.1", 0);
  message = errorOf([&] { TcpStoreClient("127.0.0.1", open.port(), 5, {"s3cret", ""}); }, &status);
  EXPECT_EQ(status, HORA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("does not ask for a job token"), std::string::npos) << message;
  EXPECT_EQ(good.get("k"), "v");  // the good client never noticed
}

// The raw handshake with a token, to look at its parts: returns the server's challenge payload
// (u8 required, nonce, proof) for our nonce.
std::string rawHello(int fd, const std::string &nonce) {
  const std::string hello = frame(body(6, 0, {"hora-store/1", "", nonce}));
  EXPECT_EQ(send(fd, hello.data(), hello.size(), 0), static_cast<ssize_t>(hello.size()));
  const std::string reply = readReply(fd);
  return reply.size() > 5 ? reply.substr(5) : "";
}

TEST(TcpStoreToken, ProofsAreFreshAndBoundToTheNonces) {
  StoreServerOptions options;
  options.token = "t";
  TcpStoreServer server("127.0.0.1", 0, options);
  const std::string nonce(32, 'c');
  const int a = rawConnectBare(server.port());
  const std::string challengeA = rawHello(a, nonce);
  ASSERT_EQ(challengeA.size(), 1u + 4 + 32 + 4 + 32);
  EXPECT_EQ(challengeA[0], '\1');  // token required
  const std::string serverNonceA = challengeA.substr(5, 32);
  // The server proved the token against our nonce and its own.
  EXPECT_TRUE(proofsEqual(challengeA.substr(41), proveToken("t", "hora-store/1 server", {&nonce, &serverNonceA})));
  // A proof made for connection A...
  const std::string proofA = proveToken("t", "hora-store/1 client", {&nonce, &serverNonceA});
  // ...is refused on connection B, which got another server nonce for the same client nonce.
  const int b = rawConnectBare(server.port());
  const std::string challengeB = rawHello(b, nonce);
  ASSERT_EQ(challengeB.size(), challengeA.size());
  EXPECT_NE(challengeB.substr(5, 32), serverNonceA);
  const std::string replay = frame(body(7, 0, {proofA}));
  ASSERT_EQ(send(b, replay.data(), replay.size(), 0), static_cast<ssize_t>(replay.size()));
  bool closed = false;
  const std::string refusal = readUntilClosed(b, 3000, &closed);
  EXPECT_TRUE(closed);
  EXPECT_NE(refusal.find("wrong job token"), std::string::npos) << refusal;
  // On A it is good, and A is then served.
  const std::string good = frame(body(7, 0, {proofA}));
  ASSERT_EQ(send(a, good.data(), good.size(), 0), static_cast<ssize_t>(good.size()));
  EXPECT_EQ(readReply(a), std::string("\x01\0\0\0\0", 5));
  const std::string set = frame(body(1, 0, {"k", "v"}));
  ASSERT_EQ(send(a, set.data(), set.size(), 0), static_cast<ssize_t>(set.size()));
  EXPECT_EQ(readReply(a), std::string("\x01\0\0\0\0", 5));
  close(a);
  close(b);
}

TEST(TcpStoreLimits, RequestsBeforeTheHandshakeAndOversizedOnesAreClosed) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient good("127.0.0.1", server.port(), 5);
  const std::vector<std::pair<std::string, std::string>> strangers = {
      {"a request without a handshake", frame(body(1, 0, {"k", "v"}))},
      {"garbage", std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
      {"a huge length", std::string("\xff\xff\xff\x7f", 4) + "xxxx"},
      {"a hello of another protocol", frame(body(6, 0, {"redis", "", std::string(32, 'n')}))},
  };
  for (const auto &[what, bytes] : strangers) {
    const int fd = rawConnectBare(server.port());
    ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    bool closed = false;
    const Clock::time_point start = Clock::now();
    const std::string reply = readUntilClosed(fd, 3000, &closed);
    EXPECT_TRUE(closed) << what;
    EXPECT_LT(since(start), 1.0) << what;
    EXPECT_TRUE(reply.empty()) << what;
    close(fd);
  }
  EXPECT_FALSE(good.check({"k"}));
  // Past the handshake: a key over the limit is refused by the client itself...
  hora_status_t status;
  std::string message = errorOf([&] { good.set(std::string(kStoreMaxKey + 1, 'k'), "v"); }, &status);
  EXPECT_EQ(status, HORA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("exceeds the store's limit of 4096 bytes"), std::string::npos) << message;
  message = errorOf([&] { good.set("k", std::string(kStoreMaxValue + 4096, 'v')); }, &status);
  EXPECT_EQ(status, HORA_ERR_INVALID_ARGUMENT);
  good.set("k", std::string(kStoreMaxKey, 'v'));  // at the limit: fine
  // ...and by the server, which says why and closes.
  const int fd = rawConnect(server.port());
  const std::string big = frame(body(2, 0, {std::string(kStoreMaxKey + 1, 'k')}));
  ASSERT_EQ(send(fd, big.data(), big.size(), MSG_NOSIGNAL), static_cast<ssize_t>(big.size()));
  bool closed = false;
  const std::string reply = readUntilClosed(fd, 3000, &closed);
  EXPECT_TRUE(closed);
  EXPECT_NE(reply.find("a key of 4097 bytes exceeds the store's limit of 4096 bytes"), std::string::npos) << reply;
  close(fd);
  EXPECT_EQ(good.get("k"), std::string(kStoreMaxKey, 'v'));
}

TEST(TcpStoreLimits, IdleAndStalledConnectionsAreClosed) {
  StoreServerOptions options;
  options.idleTimeoutS = 0.3;
  TcpStoreServer server("127.0.0.1", 0, options);
  TcpStoreClient good("127.0.0.1", server.port(), 5);
  const int silent = rawConnectBare(server.port());
  const int halfHello = rawConnectBare(server.port());
  ASSERT_EQ(send(halfHello, "\x30\0\0\0\x06", 5, 0), 5);
  const int halfRequest = rawConnect(server.port());
  ASSERT_EQ(send(halfRequest, "\x40\0\0\0\x01", 5, 0), 5);
  const int idleClient = rawConnect(server.port());  // shook hands, sends nothing: a real client
  const Clock::time_point start = Clock::now();
  for (int fd : {silent, halfHello, halfRequest}) {
    bool closed = false;
    readUntilClosed(fd, 3000, &closed);
    EXPECT_TRUE(closed);
    close(fd);
  }
  EXPECT_GE(since(start), 0.2);
  EXPECT_LT(since(start), 2.0);
  bool closed = false;
  readUntilClosed(idleClient, 500, &closed);
  EXPECT_FALSE(closed);  // an idle client that shook hands stays
  const std::string set = frame(body(1, 0, {"idle", "ok"}));
  ASSERT_EQ(send(idleClient, set.data(), set.size(), 0), static_cast<ssize_t>(set.size()));
  EXPECT_EQ(readReply(idleClient), std::string("\x01\0\0\0\0", 5));
  close(idleClient);
  EXPECT_EQ(good.get("idle"), "ok");
}

// Whether the server has closed `fd`, without waiting (reads and drops what it sent).
bool closedNow(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

TEST(TcpStoreLimits, StrangersDoNotTakeMembersSlots) {
  StoreServerOptions options;
  options.maxConnections = 3;
  options.idleTimeoutS = 5;
  TcpStoreServer server("127.0.0.1", 0, options);
  // Connections that never shake hands count against no limit but their own (64): more than
  // the member limit are all still open, and a client gets in beside them at once.
  std::vector<int> fds;
  for (int i = 0; i < 6; ++i) fds.push_back(rawConnectBare(server.port()));
  const auto began = Clock::now();
  TcpStoreClient member("127.0.0.1", server.port(), 5);
  member.set("k", "v");
  EXPECT_LT(Clock::now() - began, std::chrono::seconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int fd : fds) EXPECT_FALSE(closedNow(fd));
  // Past 64 of them, each new one closes the oldest.
  for (int i = 0; i < 64; ++i) fds.push_back(rawConnectBare(server.port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int closed = 0;
  for (size_t i = 0; i < fds.size(); ++i) {
    const bool c = closedNow(fds[i]);
    closed += c;
    if (i < 6) {
      EXPECT_TRUE(c) << "the oldest connection " << i << " is still open";
    }
  }
  EXPECT_EQ(closed, 6);
  for (int fd : fds) close(fd);
}

TEST(TcpStoreLimits, AFullStoreSaysSo) {
  StoreServerOptions options;
  options.maxConnections = 2;
  TcpStoreServer server("127.0.0.1", 0, options);
  TcpStoreClient a("127.0.0.1", server.port(), 5);
  TcpStoreClient b("127.0.0.1", server.port(), 5);
  try {
    TcpStoreClient c("127.0.0.1", server.port(), 0.5);
    FAIL() << "a third client got into a store that takes two";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_TIMEOUT);
    EXPECT_NE(e.message().find("did not let this process in"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("the store is full: 2 clients are connected (limit 2)"),
              std::string::npos)
        << e.message();
    EXPECT_EQ(e.message().find("unreachable"), std::string::npos) << e.message();
  }
  a.set("still", "served");
  EXPECT_EQ(b.get("still"), "served");
}

TEST(TcpStore, AnAbandonKeyEndsAWaitAtOnce) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient agents("127.0.0.1", server.port(), 5);
  TcpStoreClient waiter("127.0.0.1", server.port(), 30);
  waiter.setAbandonKey("w0/update");
  TcpStoreClient::takeAbandoned();
  std::thread later([&agents] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    agents.set("w0/update", "worker a:1/2 is gone");
  });
  const auto began = Clock::now();
  try {
    waiter.wait({"never"});
    FAIL() << "the wait ended without the key";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_PEER_LOST);
    EXPECT_NE(e.message().find("(worker a:1/2 is gone)"), std::string::npos) << e.message();
  }
  later.join();
  EXPECT_LT(Clock::now() - began, std::chrono::seconds(5));
  EXPECT_TRUE(TcpStoreClient::takeAbandoned());
  EXPECT_FALSE(TcpStoreClient::takeAbandoned());  // reset by the first call
  // Without one, waits are not sliced and time out as asked.
  TcpStoreClient plain("127.0.0.1", server.port(), 0.3);
  EXPECT_THROW(plain.wait({"never"}), Error);
  EXPECT_FALSE(TcpStoreClient::takeAbandoned());
}

TEST(TcpStoreSession, AnotherSessionWaitsAndTimesOutNamingIt) {
  StoreServerOptions options;
  options.session = "hora/1/";
  TcpStoreServer server("127.0.0.1", 0, options);
  TcpStoreClient same("127.0.0.1", server.port(), 5, {"", "hora/1/"});
  TcpStoreClient any("127.0.0.1", server.port(), 5);
  hora_status_t status;
  const std::string message =
      errorOf([&] { TcpStoreClient("127.0.0.1", server.port(), 0.3, {"", "hora/2/"}); }, &status);
  EXPECT_EQ(status, HORA_ERR_TIMEOUT);
  EXPECT_NE(message.find("serves the runtime 'hora/1/', not 'hora/2/'"), std::string::npos) << message;
}

TEST(TcpStoreBind, ListensOnlyWhereAsked) {
  {
    TcpStoreServer server("127.0.0.1", 0);
    ASSERT_EQ(server.listening().size(), 1u);
    EXPECT_EQ(server.listening()[0], "127.0.0.1:" + std::to_string(server.port()));
    const int other = rawConnectTo("127.0.0.2", server.port());
    EXPECT_LT(other, 0) << "reached a store bound to 127.0.0.1 through 127.0.0.2";
    if (other >= 0) close(other);
  }
  {
    TcpStoreServer server("", 0);
    const int other = rawConnectTo("127.0.0.2", server.port());
    EXPECT_GE(other, 0);
    if (other >= 0) close(other);
  }
  {
    // Not an address of this host: every interface, when allowed to fall back.
    StoreServerOptions options;
    options.anyIfNotLocal = true;
    TcpStoreServer server("192.0.2.1", 0, options);  // TEST-NET-1
    const int other = rawConnectTo("127.0.0.2", server.port());
    EXPECT_GE(other, 0);
    if (other >= 0) close(other);
  }
  // IPv6 where the host has it.
  try {
    TcpStoreServer server("::1", 0);
    TcpStoreClient c("::1", server.port(), 2);
    c.set("six", "yes");
    EXPECT_EQ(c.get("six"), "yes");
  } catch (const Error &e) {
    std::cout << "no IPv6 loopback here: " << e.message() << "\n";
  }
}

#if HORA_HAVE_GLOO
// Two ranks on threads over Gloo's in-memory store: the pair check passes with one token and
// names the peer when the tokens differ.
std::vector<std::string> pairCheck(const std::string &token0, const std::string &token1) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::string> out(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto context = std::make_shared<gloo::rendezvous::Context>(r, 2);
        context->setTimeout(std::chrono::seconds(5));
        context->connectFullMesh(*store, device);
        authenticateGlooPairs(context, r == 0 ? token0 : token1, 2.0);
        out[static_cast<size_t>(r)] = "ok";
      } catch (const Error &e) {
        out[static_cast<size_t>(r)] = std::to_string(e.status()) + " " + e.message();
      } catch (const std::exception &e) {
        out[static_cast<size_t>(r)] = std::string("other ") + e.what();
      }
    });
  }
  for (std::thread &t : threads) t.join();
  return out;
}

TEST(GlooPairToken, SameTokenPassesDifferentTokensNameTheRank) {
  auto ok = pairCheck("k", "k");
  EXPECT_EQ(ok[0], "ok");
  EXPECT_EQ(ok[1], "ok");
  auto bad = pairCheck("k", "other");
  EXPECT_EQ(bad[0].rfind("1 ", 0), 0u) << bad[0];  // HORA_ERR_INVALID_ARGUMENT
  EXPECT_NE(bad[0].find("from rank 0 to rank 1 of 2 did not prove the job token"), std::string::npos) << bad[0];
  EXPECT_NE(bad[1].find("from rank 1 to rank 0 of 2 did not prove the job token"), std::string::npos) << bad[1];
}
// Where a rank connects to two peers, the kernel may give both connections one local port (their
// remote ends differ). The mesh must tell them apart by both ends: found by the local end alone,
// one peer's messages went to the other.
TEST(GlooMeshSockets, ConnectionsSharingALocalPortAreToldApart) {
  auto listener = [] {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd, 4), 0);
    return fd;
  };
  auto endOf = [](int fd, bool remote) {
    sockaddr_storage a{};
    socklen_t length = sizeof a;
    if (remote) {
      getpeername(fd, reinterpret_cast<sockaddr *>(&a), &length);
    } else {
      getsockname(fd, reinterpret_cast<sockaddr *>(&a), &length);
    }
    return gloo::transport::tcp::Address(a).str();
  };
  auto portOf = [](int fd) {
    sockaddr_in a{};
    socklen_t length = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr *>(&a), &length);
    return a.sin_port;
  };
  const int l1 = listener(), l2 = listener();
  // Two clients on one local port (as the kernel may pick for connect), to different listeners.
  int clients[2];
  in_port_t shared = 0;
  for (int i = 0; i < 2; ++i) {
    clients[i] = socket(AF_INET, SOCK_STREAM, 0);
    const int on = 1;
    setsockopt(clients[i], SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    local.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    local.sin_port = shared;
    ASSERT_EQ(bind(clients[i], reinterpret_cast<sockaddr *>(&local), sizeof local), 0) << strerror(errno);
    if (i == 0) shared = portOf(clients[0]);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = portOf(i == 0 ? l1 : l2);
    ASSERT_EQ(connect(clients[i], reinterpret_cast<sockaddr *>(&to), sizeof to), 0) << strerror(errno);
  }
  const int a1 = accept(l1, nullptr, nullptr), a2 = accept(l2, nullptr, nullptr);
  ASSERT_EQ(endOf(clients[0], false), endOf(clients[1], false));  // one local end
  const std::vector<int> found = socketsByEnds({{endOf(clients[0], false), endOf(clients[1], true)},
                                                {endOf(clients[0], false), endOf(clients[0], true)},
                                                {"", ""}});
  EXPECT_EQ(found, (std::vector<int>{clients[1], clients[0], -1}));
  for (int fd : {l1, l2, clients[0], clients[1], a1, a2}) close(fd);
}

#endif

TEST(TcpStore, FormatHostPort) {
  EXPECT_EQ(formatHostPort("10.0.0.1", 29500), "10.0.0.1:29500");
  EXPECT_EQ(formatHostPort("::1", 80), "[::1]:80");
}

}  // namespace
}  // namespace hora
