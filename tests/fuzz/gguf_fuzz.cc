// libFuzzer target for the GGUF reader: any input must parse or fail with a Status, never crash
// or read outside the input (ASan/UBSan watch every byte of every tensor span and metadata value
// touched here). An input that parses is written back with GgufWriter and parsed again; the
// second parse must succeed and agree, which also fuzzes the writer.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "argus/gguf.h"

namespace {

bool SameValue(const argus::GgufValue& a, const argus::GgufValue& b) {
  auto same = [](double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); };
  if (a.type != b.type || a.u != b.u || a.i != b.i || !same(a.f, b.f) || a.s != b.s ||
      a.ints != b.ints || a.strings != b.strings || a.floats.size() != b.floats.size()) {
    return false;
  }
  for (size_t k = 0; k < a.floats.size(); ++k) {
    if (!same(a.floats[k], b.floats[k])) return false;
  }
  return a.type != argus::GgufType::kArray || a.element_type == b.element_type;
}

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "gguf_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

uint64_t Touch(const argus::GgufFile& file) {
  uint64_t sum = file.version() + file.alignment() + file.size_bytes();
  for (const argus::GgufTensor& t : file.tensors()) {
    for (std::byte b : t.data) sum += std::to_integer<uint8_t>(b);
    sum += t.n_rows() + t.n_values + t.offset;
    if (file.FindTensor(t.name) != &t) Fail("FindTensor", t.name);
  }
  for (const argus::GgufKeyValue& kv : file.metadata()) {
    const argus::GgufValue& v = kv.value;
    sum += v.u + static_cast<uint64_t>(v.i) + v.s.size() + v.array_size();
    for (int64_t x : v.ints) sum += static_cast<uint64_t>(x);
    for (double x : v.floats) sum += std::isnan(x) ? 1 : 0;
    for (const std::string& s : v.strings) sum += s.size();
    if (file.Find(kv.key) != &v) Fail("Find", kv.key);
    // The getters either convert or say why; either way they must not crash.
    sum += file.GetUint(kv.key).ok() + file.GetInt(kv.key).ok() + file.GetFloat(kv.key).ok() +
           file.GetBool(kv.key).ok() + file.GetString(kv.key).ok() + file.GetArray(kv.key).ok();
  }
  return sum;
}

void RoundTrip(const argus::GgufFile& file) {
  argus::GgufWriter writer(file.alignment());
  for (const argus::GgufKeyValue& kv : file.metadata()) writer.Set(kv.key, kv.value);
  for (const argus::GgufTensor& t : file.tensors()) {
    argus::Status s = writer.AddTensor(t.name, t.type, t.dims, t.data);
    if (!s.ok()) Fail("AddTensor of a parsed tensor", s.ToString());
  }
  auto bytes = writer.Serialize();
  if (!bytes.ok()) Fail("Serialize of a parsed file", bytes.status().ToString());
  auto again = argus::GgufFile::Parse(*bytes, "rewritten");
  if (!again.ok()) Fail("parse of the rewritten file", again.status().ToString());
  const argus::GgufFile& g = **again;
  if (g.tensors().size() != file.tensors().size()) Fail("rewritten tensor count", "");
  for (size_t i = 0; i < file.tensors().size(); ++i) {
    const argus::GgufTensor& a = file.tensors()[i];
    const argus::GgufTensor& b = g.tensors()[i];
    if (a.name != b.name || a.type != b.type || a.dims != b.dims ||
        a.data.size() != b.data.size() ||
        std::memcmp(a.data.data(), b.data.data(), a.data.size()) != 0) {
      Fail("rewritten tensor differs", a.name);
    }
  }
  for (const argus::GgufKeyValue& kv : file.metadata()) {
    const argus::GgufValue* v = g.Find(kv.key);
    if (v == nullptr || !SameValue(*v, kv.value)) Fail("rewritten metadata differs", kv.key);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = argus::GgufFile::Parse({reinterpret_cast<const std::byte*>(data), size}, "fuzz");
  if (!file.ok()) {
    if (file.status().message().empty()) Fail("error without a message", "");
    return 0;
  }
  volatile uint64_t sink = Touch(**file);
  (void)sink;
  RoundTrip(**file);
  return 0;
}
