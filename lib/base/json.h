// SPDX-License-Identifier: Apache-2.0
// JSON text for the machine-readable outputs (timeline, stall reports).
#pragma once

#include <string>

namespace hora {

// Appends `s` as the body of a JSON string (no quotes). Bytes outside printable ASCII become
// \u00XX, so any tensor name, even one that is not UTF-8, gives text every JSON parser takes.
void appendJsonEscaped(std::string &out, const std::string &s);

// `s` as a JSON string literal, quotes included.
std::string jsonQuoted(const std::string &s);

}  // namespace hora
