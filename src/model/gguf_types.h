// Internal: the GGUF facts the reader (gguf.cc), the writer (gguf_writer.cc) and the tokenizer's
// vocabulary reader share.
#pragma once

#include <cstdint>

#include "argus/gguf.h"

namespace argus::gguf {

inline constexpr uint64_t kDefaultAlignment = 32;  // when general.alignment is absent

inline bool IsUnsigned(GgufType t) {
  return t == GgufType::kU8 || t == GgufType::kU16 || t == GgufType::kU32 || t == GgufType::kU64;
}
inline bool IsSigned(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}
inline bool IsInteger(GgufType t) { return IsUnsigned(t) || IsSigned(t); }
inline bool IsFloat(GgufType t) { return t == GgufType::kF32 || t == GgufType::kF64; }

}  // namespace argus::gguf
