// SPDX-License-Identifier: Apache-2.0
#include "core/link.h"

namespace hora {

const std::vector<std::vector<int>> &Link::hosts() const {
  // Built on first use, for this link's size; a link that knows its hosts overrides this.
  if (alone_.size() != static_cast<size_t>(size())) {
    alone_.clear();
    for (int r = 0; r < size(); ++r) alone_.push_back({r});
  }
  return alone_;
}

int Link::hostIndex() const { return rank(); }

void Link::sendBlob(const std::vector<int> &peers, const std::string &blob) {
  const uint64_t length = blob.size();
  Transfers t(*this);
  for (int peer : peers) {
    t.send(peer, &length, sizeof length);
    t.send(peer, blob.data(), blob.size());
  }
  t.waitAll();
}

std::string Link::recvBlob(int peer) {
  uint64_t length = 0;
  Transfers head(*this);
  head.recv(peer, &length, sizeof length);
  head.waitAll();
  std::string blob(length, '\0');
  Transfers body(*this);
  body.recv(peer, blob.data(), blob.size());
  body.waitAll();
  return blob;
}

void Link::guard(const char *, const std::function<void()> &body) { body(); }

Transfers::~Transfers() {
  for (size_t i = 0; i < tickets_.size(); ++i) {
    if (!done_[i]) link_.drop(tickets_[i]);
  }
}

// Both ends of a message know its length, so an empty one is skipped on both.
size_t Transfers::send(int peer, const void *data, size_t bytes) {
  tickets_.push_back(bytes == 0 ? 0 : link_.postSend(peer, data, bytes));
  done_.push_back(bytes == 0);
  return tickets_.size() - 1;
}

size_t Transfers::recv(int peer, void *data, size_t bytes) {
  tickets_.push_back(bytes == 0 ? 0 : link_.postRecv(peer, data, bytes));
  done_.push_back(bytes == 0);
  return tickets_.size() - 1;
}

void Transfers::waitOne(size_t index) {
  if (done_[index]) return;
  link_.wait(tickets_[index]);
  done_[index] = true;
}

void Transfers::waitAll() {
  for (size_t i = 0; i < tickets_.size(); ++i) waitOne(i);
  tickets_.clear();
  done_.clear();
}

}  // namespace hora
