// SPDX-License-Identifier: Apache-2.0
// JSON string escaping (base/json.h): UTF-8 kept, control characters and non-UTF-8 bytes escaped.
#include <string>

#include <gtest/gtest.h>

#include "base/json.h"

namespace hora {
namespace {

std::string body(const std::string &s) {
  std::string out;
  appendJsonEscaped(out, s);
  return out;
}

TEST(Json, AsciiQuotesAndControlCharacters) {
  EXPECT_EQ(body("grad.fc.weight"), "grad.fc.weight");
  EXPECT_EQ(body("a\"b\\c"), "a\\\"b\\\\c");
  EXPECT_EQ(body(std::string("t\n\t\x01\x7f", 5)), "t\\u000a\\u0009\\u0001\\u007f");
  EXPECT_EQ(jsonQuoted("x"), "\"x\"");
}

TEST(Json, WellFormedUtf8PassesThrough) {
  for (const char *s : {"\xc3\xa9", "\xe5\x90\x8d\xe5\x89\x8d", "\xf0\x9f\x99\x82", "\xef\xbf\xbd",
                        "\xf4\x8f\xbf\xbf" /* U+10FFFF */, "\xed\x9f\xbf" /* U+D7FF */}) {
    EXPECT_EQ(body(s), s);
  }
}

TEST(Json, BytesThatAreNotUtf8BecomeTheReplacementCharacter) {
  EXPECT_EQ(body("\xff"), "\\ufffd");
  EXPECT_EQ(body("a\xc3"), "a\\ufffd");                    // cut short at the end
  EXPECT_EQ(body("\xc3(x"), "\\ufffd(x");                  // a lead byte without its tail
  EXPECT_EQ(body("\xc0\x80"), "\\ufffd\\ufffd");           // overlong NUL
  EXPECT_EQ(body("\xe0\x80\xaf"), "\\ufffd\\ufffd\\ufffd");  // overlong '/'
  EXPECT_EQ(body("\xed\xa0\x80"), "\\ufffd\\ufffd\\ufffd");  // a UTF-16 surrogate
  EXPECT_EQ(body("\xf4\x90\x80\x80"), "\\ufffd\\ufffd\\ufffd\\ufffd");  // above U+10FFFF
  EXPECT_EQ(body("\x80\xc3\xa9"), "\\ufffd\xc3\xa9");      // a stray tail, then a good one
}

}  // namespace
}  // namespace hora
