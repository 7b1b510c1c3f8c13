// Bytes and characters of token spellings. GPT-2's byte-level BPE alphabet spells every byte as
// one printable Unicode character (bytes_to_unicode in GPT-2's encoder.py), so merges and
// vocabulary entries are text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace argus::model {

// The code point GPT-2 assigns to a byte: printable Latin-1 bytes keep their value, the other 68
// take 256, 257, ... in byte order.
inline uint32_t BpeCodePoint(uint8_t byte) {
  const auto printable = [](uint32_t b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  };
  if (printable(byte)) return byte;
  uint32_t n = 0;
  for (uint32_t b = 0; b < byte; ++b) n += printable(b) ? 0 : 1;
  return 256 + n;
}

// UTF-8 of BpeCodePoint(byte): one or two bytes.
inline std::string BpeSymbol(uint8_t byte) {
  const uint32_t cp = BpeCodePoint(byte);
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  return {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
}

// The code point starting at s[i] and its length; length 0 when the bytes there are not valid
// (minimal, non-surrogate) UTF-8.
std::pair<uint32_t, size_t> DecodeUtf8(std::string_view s, size_t i);
// The length of the character at text[at], as llama.cpp's unicode_len_utf8 but with its
// continuation bytes checked (bpe_bytes.cc says why).
size_t CharLength(std::string_view text, size_t at);
// BpeSymbol(byte), computed once.
const std::string& BpeSpelling(uint8_t byte);
// The bytes a BPE token's stand-in characters spell; characters outside the alphabet (and
// invalid UTF-8) are kept as they are.
std::string UnspellBytes(std::string_view token);
// The byte of a token spelled "<0xXX>", or -1.
int ParseByteToken(std::string_view text);

}  // namespace argus::model
