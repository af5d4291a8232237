// SPDX-License-Identifier: Apache-2.0
// GlooGroup: Gloo rendezvous through hora's store, and the control plane on Gloo collectives.
#include "backends/gloo/gloo_group.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstring>

#include "base/logging.h"

namespace hora {
namespace {

std::chrono::milliseconds toMs(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// Gloo's rendezvous store interface over hora's TCP store, every key under one prefix.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<TcpStoreClient> store, std::string prefix)
      : store_(std::move(store)), prefix_(std::move(prefix)) {}
  void set(const std::string &key, const std::vector<char> &data) override {
    store_->set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string &key) override {
    const std::string v = store_->get(prefix_ + key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string> &keys) override { store_->wait(prefixed(keys)); }
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override {
    store_->wait(prefixed(keys), static_cast<double>(timeout.count()) / 1000.0);
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string> &keys) const {
    std::vector<std::string> out;
    for (const std::string &k : keys) out.push_back(prefix_ + k);
    return out;
  }
  std::shared_ptr<TcpStoreClient> store_;
  std::string prefix_;
};

class GlooControlPlane final : public ControlPlane {
 public:
  GlooControlPlane(std::shared_ptr<gloo::Context> context, double timeoutS)
      : context_(std::move(context)), timeout_(toMs(timeoutS)) {}
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  void allreduceAnd(std::vector<uint64_t> &words) override {
    if (words.empty() || context_->size == 1) return;
    glooCall("negotiation (waiting for every rank to start the same cycle)", rank(), [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(words.data(), words.size());
      opts.setReduceFunction([](void *c, const void *a, const void *b, size_t n) {
        auto *out = static_cast<uint64_t *>(c);
        const auto *x = static_cast<const uint64_t *>(a);
        const auto *y = static_cast<const uint64_t *>(b);
        for (size_t i = 0; i < n; ++i) out[i] = x[i] & y[i];
      });
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  std::vector<std::string> gatherToRoot(const std::string &blob) override {
    if (context_->size == 1) return {blob};
    // Control messages are small: gather them everywhere (allgatherv) and keep them at rank 0.
    const size_t n = static_cast<size_t>(context_->size);
    std::vector<int64_t> lengths(n);
    int64_t mine = static_cast<int64_t>(blob.size());
    glooCall("negotiation (gathering requests at the coordinator)", rank(), [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(&mine, 1);
      opts.setOutput(lengths.data(), n);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
    std::vector<size_t> counts(n);
    size_t total = 0;
    for (size_t r = 0; r < n; ++r) {
      counts[r] = static_cast<size_t>(lengths[r]);
      total += counts[r];
    }
    std::string all(total + 1, '\0');  // +1: never a zero-sized buffer
    std::string in = blob;
    in.push_back('\0');
    glooCall("negotiation (gathering requests at the coordinator)", rank(), [&] {
      gloo::AllgathervOptions opts(context_);
      opts.setInput(&in[0], blob.size());
      opts.setOutput(&all[0], counts);
      opts.setTimeout(timeout_);
      gloo::allgatherv(opts);
    });
    if (rank() != 0) return {};
    std::vector<std::string> out;
    size_t at = 0;
    for (size_t r = 0; r < n; ++r) {
      out.push_back(all.substr(at, counts[r]));
      at += counts[r];
    }
    return out;
  }

  void broadcastFromRoot(std::string &blob) override {
    if (context_->size == 1) return;
    int64_t length = static_cast<int64_t>(blob.size());
    glooCall("negotiation (waiting for the coordinator's responses)", rank(), [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setRoot(0);
      opts.setOutput(&length, 1);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
    if (length == 0) {
      blob.clear();
      return;
    }
    blob.resize(static_cast<size_t>(length));
    glooCall("negotiation (waiting for the coordinator's responses)", rank(), [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setRoot(0);
      opts.setOutput(&blob[0], blob.size());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

 private:
  std::shared_ptr<gloo::Context> context_;
  std::chrono::milliseconds timeout_;
};

bool contains(const std::string &text, const char *needle) {
  return text.find(needle) != std::string::npos;
}

}  // namespace

void throwGlooError(const char *what, int rank, const std::exception &e, const char *file,
                    int line) {
  const std::string text = e.what();
  hora_status_t status = HORA_ERR_BACKEND;
  if (contains(text, "Timed out") || contains(text, "timed out") || contains(text, "Timeout")) {
    status = HORA_ERR_TIMEOUT;
  } else if (contains(text, "closed") || contains(text, "reset") || contains(text, "Broken pipe") ||
             contains(text, "Connection refused") || contains(text, "EOF")) {
    status = HORA_ERR_PEER_LOST;
  }
  throw Error(status, detail::concat(what, " failed on rank ", rank, " (gloo): ", text), file, line);
}

GlooGroup::GlooGroup(std::shared_ptr<TcpStoreClient> store, const std::string &prefix, int rank,
                     int size, const std::string &localAddress, double timeoutS)
    : timeoutS_(timeoutS) {
  glooCall("connecting the gloo mesh", rank, [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = localAddress;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(toMs(timeoutS));
    StoreAdapter adapter(store, prefix);
    context->connectFullMesh(adapter, device);
    context_ = context;
  });
  plane_ = std::make_unique<GlooControlPlane>(context_, timeoutS);
}

GlooGroup::~GlooGroup() = default;

}  // namespace hora
