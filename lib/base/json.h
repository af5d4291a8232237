// SPDX-License-Identifier: Apache-2.0
// JSON text for the machine-readable outputs (timeline, stall reports).
#pragma once

#include <string>

namespace hora {

// Appends `s` as the body of a JSON string (no quotes). Well-formed UTF-8 passes through as it is
// (a tensor name in any script reads back as itself); control characters become \u00XX and
// bytes that are not UTF-8 U+FFFD, so any name gives text every JSON parser takes.
void appendJsonEscaped(std::string &out, const std::string &s);

// `s` as a JSON string literal, quotes included.
std::string jsonQuoted(const std::string &s);

}  // namespace hora
