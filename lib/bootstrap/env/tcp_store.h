// SPDX-License-Identifier: Apache-2.0
// A small TCP key-value store: rank 0 serves it, every rank (rank 0 too) is a client.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hora {

// Serves the store from a background thread named "hora-store". Keys are never deleted, so a
// waiting client is answered as soon as its last key arrives. Every message is validated; a
// malformed one closes that connection only.
class TcpStoreServer {
 public:
  // Binds host:port (host "" = every interface, IPv6 and IPv4 where the host has both; port 0 =
  // any free port). Port in use -> Error(HORA_ERR_INVALID_ARGUMENT) naming the process holding it
  // when /proc tells.
  TcpStoreServer(const std::string &host, int port);
  // Stops the thread and closes every connection: clients see HORA_ERR_PEER_LOST.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer &) = delete;
  TcpStoreServer &operator=(const TcpStoreServer &) = delete;

  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One connection to the store. Thread-safe: each request/response pair holds mutex_.
class TcpStoreClient {
 public:
  // Connects, retrying with backoff (10 ms doubling to 1 s) until timeoutS has passed; then
  // Error(HORA_ERR_TIMEOUT) "master host:port unreachable after N s (why); ...". timeoutS is
  // also the default deadline of get() and wait().
  TcpStoreClient(const std::string &host, int port, double timeoutS);
  ~TcpStoreClient();
  TcpStoreClient(const TcpStoreClient &) = delete;
  TcpStoreClient &operator=(const TcpStoreClient &) = delete;

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
  // "host:port" as given (IPv6 literals in brackets), for messages.
  const std::string &address() const { return address_; }

 private:
  struct Reply;
  // Sends one request and reads its reply under mutex_. waitS > 0 is the server-side wait of
  // get/wait; the reply is then awaited a little longer than that.
  Reply request(uint8_t command, const std::vector<const std::string *> &args, double waitS);
  [[noreturn]] void fail(int status, const std::string &why);

  std::string host_;
  int port_;
  double timeoutS_;
  std::string address_;

  // This mutex protects: fd_, lost_ and the byte stream on fd_ (one request in flight).
  std::mutex mutex_;
  int fd_ = -1;
  // Why the connection was given up (set once; every later request fails with it): after a
  // lost connection or an unanswered request the stream can no longer be trusted.
  std::string lost_;
};

// "host:port", with an IPv6 literal in brackets.
std::string formatHostPort(const std::string &host, int port);

}  // namespace hora
