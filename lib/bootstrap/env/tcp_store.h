// SPDX-License-Identifier: Apache-2.0
// A small TCP key-value store: rank 0 serves it, every rank (rank 0 too) is a client.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hora {

// The largest key and value the store takes; a larger request is refused with an error to that
// client, and its connection closed.
constexpr uint32_t kStoreMaxKey = 4096;
constexpr uint32_t kStoreMaxValue = 64u << 20;

struct StoreServerOptions {
  // The job token: every connection must prove it knows it (HMAC-SHA256 challenge-response,
  // both ways) before its first request. "" = trust whoever connects, as torch's TCPStore does.
  std::string token;
  // Clients of another session are told to come back later (see TcpStoreClient): a runtime's
  // ranks never talk to the server of an earlier runtime that is about to close. "" = any.
  std::string session;
  // Connections beyond this are accepted and closed at once (0 = no limit).
  size_t maxConnections = 1024;
  // A connection that has not finished its handshake this long after it was accepted, or that
  // sent part of a request and then nothing for this long, is closed.
  double idleTimeoutS = 10;
  // When none of host's addresses is on this host (a NAT'ed MASTER_ADDR), listen on every
  // interface instead of failing (logged).
  bool anyIfNotLocal = false;
};

// Serves the store from a background thread named "hora-store". A waiting client is answered as
// soon as its last key arrives. Every message is validated; a malformed one closes that
// connection only. Refused connections are logged, at most one line per few seconds.
class TcpStoreServer {
 public:
  // Binds host:port, every address the host name resolves to ("" = every interface, IPv6 and
  // IPv4 where the host has both; port 0 = any free port). Port in use ->
  // Error(HORA_ERR_INVALID_ARGUMENT) naming the process holding it when /proc tells.
  TcpStoreServer(const std::string &host, int port, StoreServerOptions options = {});
  // Stops the thread and closes every connection: clients see HORA_ERR_PEER_LOST.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer &) = delete;
  TcpStoreServer &operator=(const TcpStoreServer &) = delete;

  int port() const;
  // The addresses it listens on, "host:port" each (for messages and tests).
  std::vector<std::string> listening() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct StoreClientOptions {
  std::string token;    // see StoreServerOptions::token
  std::string session;  // see StoreServerOptions::session
};

// One connection to the store. Thread-safe: each request/response pair holds mutex_.
class TcpStoreClient {
 public:
  // Connects and shakes hands, retrying with backoff (10 ms doubling to 1 s) until timeoutS has
  // passed; then Error(HORA_ERR_TIMEOUT) "master host:port unreachable after N s (why); ...".
  // A store that refuses this client's job token, or that cannot prove it knows it ->
  // Error(HORA_ERR_INVALID_ARGUMENT) at once. timeoutS is also the default deadline of get()
  // and wait().
  TcpStoreClient(const std::string &host, int port, double timeoutS,
                 StoreClientOptions options = {});
  ~TcpStoreClient();
  TcpStoreClient(const TcpStoreClient &) = delete;
  TcpStoreClient &operator=(const TcpStoreClient &) = delete;

  // A second connection to the same store, as this one was made (token, session, timeout): a
  // thread that waits on keys holds its connection for the wait, so threads whose waits depend on
  // each other's progress (process sets forming groups at once) need one each.
  std::shared_ptr<TcpStoreClient> reconnect() const;
  // The same with another timeout (connecting, and waiting for each answer).
  std::shared_ptr<TcpStoreClient> reconnect(double timeoutS) const;

  void set(const std::string &key, const std::string &value);
  // Blocks until the key exists; Error(HORA_ERR_TIMEOUT) naming the key after timeoutS.
  std::string get(const std::string &key);
  // Atomic; a missing key counts as 0. Returns the new value.
  int64_t add(const std::string &key, int64_t delta);
  // Whether every key exists, without waiting.
  bool check(const std::vector<std::string> &keys);
  // Blocks until every key exists; Error(HORA_ERR_TIMEOUT) naming the missing keys.
  void wait(const std::vector<std::string> &keys);
  void wait(const std::vector<std::string> &keys, double timeoutS);

  double timeoutS() const { return timeoutS_; }
  // While `key` is set in the store (an elastic world's "update": horarun's agents form another
  // one), every get and wait of this connection ends within kAbandonSliceS with
  // Error(HORA_ERR_PEER_LOST) quoting the key's value, instead of waiting out its timeout for
  // ranks that will never come. "" (the default): waits are not sliced.
  void setAbandonKey(std::string key) { abandonKey_ = std::move(key); }
  // Process-wide: whether a wait ended that way since the last call (resets it).
  static bool takeAbandoned();
  static constexpr double kAbandonSliceS = 0.25;
  // The job token this client proved (""= none); groups formed over the store prove it too.
  const std::string &token() const { return options_.token; }
  // "host:port" as given (IPv6 literals in brackets), for messages.
  const std::string &address() const { return address_; }

 private:
  struct Reply;
  // Sends one request and reads its reply under mutex_. waitS > 0 is the server-side wait of
  // get/wait; the reply is then awaited a little longer than that.
  Reply request(uint8_t command, const std::vector<const std::string *> &args, double waitS);
  // request() of a get or wait, in slices that look for abandonKey_ between them.
  Reply waitingRequest(uint8_t command, const std::vector<const std::string *> &args, double waitS);
  [[noreturn]] void fail(int status, const std::string &why);
  // The handshake on a fresh connection (fd_): 0 = done, 1 = try again later (*why set);
  // throws when the store and this client disagree on the token.
  int handshake(std::string *why, double timeoutS);

  std::string host_;
  int port_;
  double timeoutS_;
  StoreClientOptions options_;
  std::string address_;

  // This mutex protects: fd_, lost_ and the byte stream on fd_ (one request in flight).
  std::mutex mutex_;
  int fd_ = -1;
  // Why the connection was given up (set once; every later request fails with it): after a
  // lost connection or an unanswered request the stream can no longer be trusted.
  std::string lost_;
  // While connecting: the store said it was full, or closed a connection of ours mid-handshake
  // (for the message if it never lets us in).
  bool full_ = false;
  bool closedInHandshake_ = false;
  std::string abandonKey_;  // see setAbandonKey
};

// "host:port", with an IPv6 literal in brackets.
std::string formatHostPort(const std::string &host, int port);

// A barrier through the store among `size` ranks: sets `prefix`<rank>, then waits until every
// rank has (timeoutS). Past it, Error(HORA_ERR_TIMEOUT) "ranks 1,3 of 4 have not <done> within
// N s". Keys stay: a late rank passes at once.
void storeBarrier(TcpStoreClient &store, const std::string &prefix, int rank, int size,
                  double timeoutS, const char *done);

}  // namespace hora
