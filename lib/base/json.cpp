// SPDX-License-Identifier: Apache-2.0
#include "base/json.h"

namespace hora {

void appendJsonEscaped(std::string &out, const std::string &s) {
  static const char kHex[] = "0123456789abcdef";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
}

std::string jsonQuoted(const std::string &s) {
  std::string out = "\"";
  appendJsonEscaped(out, s);
  return out + "\"";
}

}  // namespace hora
