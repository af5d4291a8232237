// SPDX-License-Identifier: Apache-2.0
// Refusals told to the other ranks under the call's name (tombstones).
#include "core/refusals.h"

#include <cstring>
#include <utility>

#include "base/logging.h"

namespace hora {

std::string OpCall::where() const {
  return autoNamed ? detail::concat(opTypeName(op), " (unnamed)")
                   : detail::concat(opTypeName(op), " '", name, "'");
}

OpCall makeCall(Engine &engine, OpType op, const char *name, int32_t processSet) {
  OpCall call{op, std::string(), processSet};
  call.autoNamed = name == nullptr;
  if (name != nullptr) {
    const size_t len = strnlen(name, kMaxNameBytes + 1);
    if (len > kMaxNameBytes) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, opTypeName(op), ": tensor name is longer than ",
                 kMaxNameBytes, " bytes");
    }
    call.autoNamed = len == 0;
    call.name.assign(name, len);
  }
  if (engine.processSetSize(processSet) < 0) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": unknown process set ", processSet);
  }
  if (engine.processSetRank(processSet) < 0) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": rank ", engine.topology().rank,
               " is not a member of process set ", processSet);
  }
  if (name != nullptr && call.autoNamed) {
    tellingRefusals(engine, call, [op] {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, opTypeName(op),
                 ": tensor name is empty (pass NULL to have hora name it)");
    });
  }
  return call;
}

void enqueueTombstone(Engine &engine, OpCall &call, std::string reason) {
  if (call.autoNamed && !call.nameTaken) {
    call.name = engine.autoNames().next(call.processSet, call.op);
    call.nameTaken = true;
  }
  // "allreduce 'x': input: ..." -> "input: ...": the coordinator's message names the op and name.
  const std::string where = call.where() + ": ";
  if (reason.compare(0, where.size(), where) == 0) reason.erase(0, where.size());
  if (reason.empty()) reason = "(no reason given)";
  if (reason.size() > kMaxReasonBytes) {
    reason.resize(kMaxReasonBytes);
    reason += "...";
  }
  RequestMsg msg;
  msg.name = call.name;
  msg.op = call.op;
  msg.joinMode = engine.joinMode();
  msg.rejected = std::move(reason);
  engine.submit(
      std::make_shared<Request>(std::move(msg), call.processSet, std::vector<TensorArg>{}));
}

void tellRefusal(Engine &engine, OpCall &call, std::string reason) noexcept {
  try {
    try {
      enqueueTombstone(engine, call, std::move(reason));
    } catch (const Error &e) {
      HORA_LOG(kDebug) << call.where() << ": the other ranks were not told of this refusal: "
                       << e.message();
    }
  } catch (...) {  // out of memory, even for the log line
  }
}

RequestPtr makeRequest(Engine &engine, OpCall &call, RequestMsg msg,
                       std::vector<TensorArg> tensors) {
  msg.name = call.autoNamed ? engine.autoNames().next(call.processSet, call.op)
                            : std::move(call.name);
  msg.op = call.op;
  msg.joinMode = engine.joinMode();
  return std::make_shared<Request>(std::move(msg), call.processSet, std::move(tensors));
}

void submitCall(Engine &engine, OpCall &call, const RequestPtr &request) {
  try {
    engine.submit(request);
  } catch (...) {
    call.name = request->name();
    call.nameTaken = call.autoNamed;
    throw;
  }
}

}  // namespace hora
