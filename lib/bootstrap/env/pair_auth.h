// SPDX-License-Identifier: Apache-2.0
// The job token over a Gloo mesh: every pair proves it, both ways, before the group is used.
#pragma once

#include <memory>
#include <string>

namespace gloo {
class Context;
}

namespace hora {

// With a token, each rank sends each peer a fresh nonce over their pair and answers the peer's
// nonce with HMAC-SHA256(token, "hora-pair/1", sender, receiver, receiver's nonce, sender's
// nonce). A pair whose peer cannot answer, or answers wrong (a process that took the pair's
// place without the token), fails: Error(HORA_ERR_INVALID_ARGUMENT) naming the ranks, or
// HORA_ERR_TIMEOUT naming those that did not answer within timeoutS. No token: returns at once.
// Collective: every rank of the context calls it, with or without a token alike.
void authenticateGlooPairs(const std::shared_ptr<gloo::Context> &context, const std::string &token,
                           double timeoutS);

}  // namespace hora
