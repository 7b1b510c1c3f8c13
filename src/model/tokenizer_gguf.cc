// Reads a TokenizerVocab from a GGUF file's tokenizer.ggml.* metadata, as llama.cpp does.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "model/gguf_types.h"
#include "model/tokenizer_gguf.h"

namespace argus::model {
namespace {

using TokenType = TokenizerVocab::TokenType;
using namespace tokenizer_keys;
using gguf::IsFloat;
using gguf::IsInteger;

Status Missing(const char* key) {
  return Status::InvalidArgument(std::string(key) + " is missing");
}

Result<const GgufValue*> ArrayOf(const GgufFile& file, const char* key, bool (*accept)(GgufType),
                                 std::string_view expected) {
  ARGUS_ASSIGN_OR_RETURN(const GgufValue* value, file.GetArray(key));
  if (!accept(value->element_type)) {
    return Status::InvalidArgument(std::string(key) + " is an array of " +
                                   std::string(GgufTypeName(value->element_type)) + ", not of " +
                                   std::string(expected));
  }
  return value;
}

bool IsString(GgufType t) { return t == GgufType::kString; }
bool IsNumber(GgufType t) { return IsFloat(t) || IsInteger(t); }

// A token id key when present. Converters write "none" as -1 or as its u32 spelling.
Status ReadTokenId(const GgufFile& file, const char* key, int32_t* id) {
  if (file.Find(key) == nullptr) return Status::Ok();
  ARGUS_ASSIGN_OR_RETURN(int64_t value, file.GetInt(key));
  if (value == -1 || value == int64_t{std::numeric_limits<uint32_t>::max()}) {
    *id = -1;
  } else if (value < 0 || value > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument(std::string(key) + " = " + std::to_string(value) +
                                   " is not a token id");
  } else {
    *id = static_cast<int32_t>(value);
  }
  return Status::Ok();
}

Status ReadBool(const GgufFile& file, const char* key, bool* flag) {
  if (file.Find(key) == nullptr) return Status::Ok();
  ARGUS_ASSIGN_OR_RETURN(*flag, file.GetBool(key));
  return Status::Ok();
}

}  // namespace

Status ReadVocab(const GgufFile& file, TokenizerVocab* v, std::vector<int32_t>* extra_eog) {
  if (file.Find(kKeyModel) == nullptr) return Missing(kKeyModel);
  ARGUS_ASSIGN_OR_RETURN(std::string model, file.GetString(kKeyModel));
  if (model == "llama") {
    v->kind = TokenizerVocab::Kind::kSentencePiece;
  } else if (model == "gpt2") {
    v->kind = TokenizerVocab::Kind::kBytePairs;
  } else {
    return Status::Unsupported(std::string(kKeyModel) + " " + Quoted(model) +
                               " is not a supported tokenizer (llama, gpt2)");
  }

  if (file.Find(kKeyTokens) == nullptr) return Missing(kKeyTokens);
  {
    ARGUS_ASSIGN_OR_RETURN(const GgufValue* tokens, ArrayOf(file, kKeyTokens, IsString, "strings"));
    v->tokens = tokens->strings;
  }
  const size_t n = v->tokens.size();
  if (file.Find(kKeyScores) != nullptr) {
    ARGUS_ASSIGN_OR_RETURN(const GgufValue* scores, ArrayOf(file, kKeyScores, IsNumber, "numbers"));
    if (IsFloat(scores->element_type)) {
      v->scores.assign(scores->floats.begin(), scores->floats.end());
    } else {
      v->scores.assign(scores->ints.begin(), scores->ints.end());
    }
  }
  if (file.Find(kKeyTypes) != nullptr) {
    ARGUS_ASSIGN_OR_RETURN(const GgufValue* types, ArrayOf(file, kKeyTypes, IsInteger, "integers"));
    for (size_t i = 0; i < types->ints.size(); ++i) {
      const int64_t type = types->ints[i];
      if (type < 0 || type > static_cast<int64_t>(TokenType::kByte)) {
        return Status::InvalidArgument(std::string(kKeyTypes) + "[" + std::to_string(i) +
                                       "] = " + std::to_string(type) + " is not a token type");
      }
      v->types.push_back(static_cast<TokenType>(type));
    }
  }
  if (file.Find(kKeyMerges) != nullptr) {
    ARGUS_ASSIGN_OR_RETURN(const GgufValue* merges, ArrayOf(file, kKeyMerges, IsString, "strings"));
    v->merges = merges->strings;
  }
  if (file.Find(kKeyPre) != nullptr) {
    ARGUS_ASSIGN_OR_RETURN(v->pre, file.GetString(kKeyPre));
  }

  // llama.cpp's defaults: SentencePiece files name <unk> <s> </s> by position and add BOS;
  // BPE files add BOS only for the Llama 3 pre-tokenizer and never prepend a space.
  if (v->kind == TokenizerVocab::Kind::kSentencePiece) {
    const auto if_present = [&](int32_t id) { return id < static_cast<int64_t>(n) ? id : -1; };
    v->unk = if_present(0);
    v->bos = if_present(1);
    v->eos = if_present(2);
    v->add_bos = true;
    v->add_space_prefix = true;
  } else {
    v->unk = v->bos = v->eos = -1;
    v->add_bos = PreTokenizerAddsBos(v->pre);
    v->add_space_prefix = false;
  }
  v->pad = -1;
  v->add_eos = false;
  ARGUS_RETURN_IF_ERROR(ReadTokenId(file, kKeyBos, &v->bos));
  ARGUS_RETURN_IF_ERROR(ReadTokenId(file, kKeyEos, &v->eos));
  ARGUS_RETURN_IF_ERROR(ReadTokenId(file, kKeyUnk, &v->unk));
  ARGUS_RETURN_IF_ERROR(ReadTokenId(file, kKeyPad, &v->pad));
  ARGUS_RETURN_IF_ERROR(ReadBool(file, kKeyAddBos, &v->add_bos));
  ARGUS_RETURN_IF_ERROR(ReadBool(file, kKeyAddEos, &v->add_eos));
  ARGUS_RETURN_IF_ERROR(ReadBool(file, kKeyAddSpacePrefix, &v->add_space_prefix));
  for (const char* key : {kKeyEot, kKeyEom}) {
    int32_t id = -1;
    ARGUS_RETURN_IF_ERROR(ReadTokenId(file, key, &id));
    if (id >= static_cast<int64_t>(n)) {
      return Status::InvalidArgument(std::string(key) + " = " + std::to_string(id) +
                                     " is outside the vocabulary of " + std::to_string(n) +
                                     " tokens");
    }
    if (id >= 0) extra_eog->push_back(id);
  }
  return Status::Ok();
}

}  // namespace argus::model
