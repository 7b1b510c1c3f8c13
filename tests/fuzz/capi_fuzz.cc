// libFuzzer target for the C API: the input is a program of C API calls on a small cache, with
// arguments taken from the input, hostile ones included (sequences and layers out of range,
// token counts past the buffers' rows are never passed: buffers are sized for what is asked).
// Every call must succeed or report an error; none may crash, leak or read out of bounds.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "argus/argus.h"

namespace {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint32_t Small(uint32_t limit) { return Byte() % limit; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

const char* const kCodecs[] = {"f16",  "q8_0",     "q4_0", "iq4_nl", "int4:channel",
                               "int2", "fp8_e4m3", "bf16", "jl",     "nonsense"};

// A row value from the input: mostly ordinary, sometimes huge or non-finite.
float Value(Input& in) {
  const uint8_t b = in.Byte();
  if (b == 255) return INFINITY;
  if (b == 254) return NAN;
  if (b == 253) return 3e38f;
  return (static_cast<float>(b) - 128.0f) / 32.0f;
}

void Drop(char*& e) {
  argus_free(e);
  e = nullptr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  char* e = nullptr;
  argus_cache_options_t* options = argus_cache_options_create();
  const uint32_t n_layers = 1 + in.Small(3), n_kv = 1 + in.Small(2), gqa = 1 + in.Small(4);
  const uint32_t head_dim = 32u << in.Small(3);
  argus_cache_options_set_geometry(options, n_layers, n_kv * gqa, n_kv, head_dim);
  argus_cache_options_set_codecs(options, kCodecs[in.Small(10)], kCodecs[in.Small(10)]);
  argus_cache_options_set_page_tokens(options, 1u << in.Small(6));
  argus_cache_options_set_threads(options, 1);
  if (in.Byte() & 1)
    argus_cache_options_set_ram_budget(options, uint64_t{1} << (10 + in.Small(12)));
  if (in.Byte() & 1)
    argus_cache_options_set_attention(options, in.Small(40), in.Small(8), in.Small(4) / 10.0);
  argus_cache_t* cache = argus_cache_open(options, &e);
  argus_cache_options_destroy(options);
  Drop(e);
  if (cache == nullptr) return 0;

  const size_t row = size_t{n_kv} * head_dim, q_row = size_t{n_kv} * gqa * head_dim;
  std::vector<int64_t> seqs;
  while (!in.empty()) {
    const int64_t seq = seqs.empty() || in.Byte() == 0
                            ? static_cast<int64_t>(in.Byte()) - 8
                            : seqs[in.Small(static_cast<uint32_t>(seqs.size()))];
    const uint32_t layer = in.Small(n_layers + 1);
    switch (in.Small(10)) {
      case 0: {
        const int64_t s = argus_seq_create(cache, &e);
        if (s >= 0) seqs.push_back(s);
        break;
      }
      case 1:
      case 2: {
        const uint32_t n = in.Small(70);
        std::vector<float> k(n * row), v(n * row);
        for (size_t i = 0; i < k.size(); i += 1 + in.Small(64)) k[i] = Value(in), v[i] = Value(in);
        argus_seq_append_f32(cache, seq, layer, k.data(), v.data(), n, &e);
        break;
      }
      case 3: {
        std::vector<float> q(q_row, Value(in)), out(q_row);
        argus_attend_decode_f32(cache, seq, layer, q.data(), out.data(), &e);
        break;
      }
      case 4: {
        const uint32_t n = in.Small(20);
        std::vector<float> q(n * q_row + 1, Value(in)), out(n * q_row + 1);
        argus_attend_prefill_f32(cache, seq, layer, q.data(), n, out.data(), &e);
        break;
      }
      case 5: {
        const int64_t s = argus_seq_fork(cache, seq, &e);
        if (s >= 0) seqs.push_back(s);
        break;
      }
      case 6:
        argus_seq_crop(cache, seq, in.Small(200), &e);
        break;
      case 7:
        argus_seq_release(cache, seq, &e);
        break;
      case 8: {
        char* stats = argus_cache_stats_json(cache, &e);
        argus_free(stats);
        argus_attention_stats_t attention;
        argus_cache_last_attention_stats(cache, &attention, &e);
        break;
      }
      case 9:
        argus_seq_length(cache, seq, layer, &e);
        break;
    }
    Drop(e);
  }
  argus_cache_close(cache);
  return 0;
}
