// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the control messages' wire encoding (lib/core/message.cpp), which every
// rank decodes from its peers. The first byte picks requests or responses; the rest is the
// message. Whatever the bytes, decoding either succeeds, and then encoding the result and
// decoding that again gives the same bytes, or it throws hora::Error(HORA_ERR_INTERNAL). A crash,
// a sanitizer report, any other exception, or a large allocation is a failure.
//
// Built and run by run_fuzz.sh (clang's -fsanitize=fuzzer,address,undefined). With
// -DHORA_FUZZ_WRITE_SEEDS it is instead a program that writes the seed corpus.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/message.h"

namespace {

template <typename Decode, typename Encode>
void roundTrip(const std::string &bytes, Decode decode, Encode encode) {
  try {
    const std::string again = encode(decode(bytes));
    if (encode(decode(again)) != again) {
      std::fprintf(stderr, "fuzz_message: re-encoding a decoded message changed it\n");
      std::abort();
    }
  } catch (const hora::Error &e) {
    if (e.status() != HORA_ERR_INTERNAL) {
      std::fprintf(stderr, "fuzz_message: unexpected status %d: %s\n", e.status(), e.what());
      std::abort();
    }
  }
}

}  // namespace

#ifndef HORA_FUZZ_WRITE_SEEDS
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char *>(data) + 1, size - 1);
  if (data[0] & 1) {
    roundTrip(bytes, hora::decodeResponses, hora::encodeResponses);
  } else {
    roundTrip(bytes, hora::decodeRequests, hora::encodeRequests);
  }
  return 0;
}
#else
// Seeds: typical messages of every op, a grouped request, a tombstone (a refused call) and a
// request in Horovod's join mode, an error response, a join.
int main(int argc, char **argv) {
  if (argc != 2) return 2;
  using namespace hora;
  std::vector<RequestMsg> requests;
  for (int op = 0; op < kNumOpTypes; ++op) {
    RequestMsg m;
    m.name = "layer" + std::to_string(op) + ".weight";
    m.op = static_cast<OpType>(op);
    m.reduceOp = ReduceOp::kAverage;
    m.dtype = op % 2 ? DType::kBFloat16 : DType::kFloat32;
    m.shapes = {{64, 3, 3}};
    if (m.op == OpType::kAlltoall) m.splits = {2, 1, 1};
    requests.push_back(m);
  }
  RequestMsg grouped;
  grouped.name = "grouped";
  grouped.shapes = {{10}, {20, 2}, {}};
  grouped.joinMode = 1;
  requests.push_back(grouped);
  RequestMsg tombstone;
  tombstone.name = "allreduce.noname.3";
  tombstone.rejected = "input: dtype (code 5, bits 64, lanes 1) is not supported";
  requests.push_back(tombstone);
  std::vector<Response> responses;
  for (const RequestMsg &m : requests) {
    Response r;
    r.agreed = m;
    if (m.op == OpType::kAllgather) r.firstDims = {3, 5, 0};
    responses.push_back(r);
  }
  Response failed;
  failed.agreed = requests[0];
  failed.status = HORA_ERR_MISMATCH;
  failed.error = "allreduce 'x': ranks disagree on shape";
  failed.joined = {2};
  responses.push_back(failed);
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"requests_all_ops", std::string(1, '\0') + encodeRequests(requests)},
      {"requests_one", std::string(1, '\0') + encodeRequests({requests[0]})},
      {"requests_none", std::string(1, '\0') + encodeRequests({})},
      {"responses_all_ops", std::string(1, '\1') + encodeResponses(responses)},
      {"responses_failed", std::string(1, '\1') + encodeResponses({failed})},
  };
  for (const auto &[name, bytes] : seeds) {
    FILE *f = std::fopen((std::string(argv[1]) + "/" + name).c_str(), "wb");
    if (f == nullptr) return 1;
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  return 0;
}
#endif
