// The tokenizer.ggml.* metadata of GGUF files: its keys, and the vocabulary read from them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "argus/gguf.h"
#include "argus/model.h"

namespace argus::model {

namespace tokenizer_keys {
inline constexpr char kKeyModel[] = "tokenizer.ggml.model";
inline constexpr char kKeyTokens[] = "tokenizer.ggml.tokens";
inline constexpr char kKeyScores[] = "tokenizer.ggml.scores";
inline constexpr char kKeyTypes[] = "tokenizer.ggml.token_type";
inline constexpr char kKeyMerges[] = "tokenizer.ggml.merges";
inline constexpr char kKeyPre[] = "tokenizer.ggml.pre";
inline constexpr char kKeyBos[] = "tokenizer.ggml.bos_token_id";
inline constexpr char kKeyEos[] = "tokenizer.ggml.eos_token_id";
inline constexpr char kKeyUnk[] = "tokenizer.ggml.unknown_token_id";
inline constexpr char kKeyPad[] = "tokenizer.ggml.padding_token_id";
inline constexpr char kKeyEot[] = "tokenizer.ggml.eot_token_id";
inline constexpr char kKeyEom[] = "tokenizer.ggml.eom_token_id";
inline constexpr char kKeyAddBos[] = "tokenizer.ggml.add_bos_token";
inline constexpr char kKeyAddEos[] = "tokenizer.ggml.add_eos_token";
inline constexpr char kKeyAddSpacePrefix[] = "tokenizer.ggml.add_space_prefix";
}  // namespace tokenizer_keys

inline std::string Quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

// The vocabulary, with llama.cpp's defaults for absent keys, and the extra end-of-generation
// tokens (EOT, EOM) that TokenizerVocab does not carry. Errors name the key.
Status ReadVocab(const GgufFile& file, TokenizerVocab* v, std::vector<int32_t>* extra_eog);

// Whether llama.cpp adds BOS to a byte-pair vocabulary of this pre-tokenizer (tokenizer.ggml.pre)
// when the file does not say (tokenizer.cc's pre-tokenizer table).
bool PreTokenizerAddsBos(std::string_view pre);

}  // namespace argus::model
