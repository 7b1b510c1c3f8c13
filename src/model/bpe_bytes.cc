// Bytes and characters of token spellings: UTF-8, GPT-2's byte alphabet, <0xXX> byte tokens.
#include <algorithm>
#include <array>

#include "model/bpe_bytes.h"

namespace argus::model {
namespace {

struct ByteAlphabet {
  std::array<std::string, 256> spelling;  // byte -> UTF-8 of its stand-in
  std::array<int16_t, 324> byte;          // stand-in code point -> byte, -1 for none
};

const ByteAlphabet& Gpt2Bytes() {
  static const ByteAlphabet alphabet = [] {
    ByteAlphabet a;
    a.byte.fill(-1);
    for (uint32_t b = 0; b < 256; ++b) {
      a.spelling[b] = BpeSymbol(static_cast<uint8_t>(b));
      a.byte[BpeCodePoint(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

}  // namespace

const std::string& BpeSpelling(uint8_t byte) { return Gpt2Bytes().spelling[byte]; }

// The code point starting at s[i] and its length; length 0 when the bytes there are not valid
// (minimal, non-surrogate) UTF-8.
std::pair<uint32_t, size_t> DecodeUtf8(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t lead = byte(i);
  if (lead < 0x80) return {lead, 1};
  const size_t n = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
  if (n == 0 || lead > 0xF4 || i + n > s.size()) return {0, 0};
  uint32_t cp = lead & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return {0, 0};
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 0};
  return {cp, n};
}

// The length of the character at text[at]. llama.cpp (unicode_len_utf8) judges it from the first
// byte alone; here the bytes it claims must also be continuation bytes, else the byte stands
// alone. Only invalid UTF-8 differs: it keeps its own bytes instead of swallowing the start of
// the U+2581 that a following space became.
size_t CharLength(std::string_view text, size_t at) {
  static constexpr uint8_t kLength[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  const size_t n = std::min<size_t>(kLength[static_cast<uint8_t>(text[at]) >> 4], text.size() - at);
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<uint8_t>(text[at + k]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

// GPT-2's byte alphabet both ways.
// The bytes a BPE token's stand-in characters spell; characters outside the alphabet (and
// invalid UTF-8) are kept as they are.
std::string UnspellBytes(std::string_view token) {
  const ByteAlphabet& alphabet = Gpt2Bytes();
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    auto [cp, n] = DecodeUtf8(token, i);
    if (n > 0 && cp < alphabet.byte.size() && alphabet.byte[cp] >= 0) {
      bytes.push_back(static_cast<char>(alphabet.byte[cp]));
    } else {
      n = std::max<size_t>(n, 1);
      bytes.append(token.substr(i, n));
    }
    i += n;
  }
  return bytes;
}

// The byte of a token spelled "<0xXX>", or -1.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace argus::model
