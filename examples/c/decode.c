/* The smallest host of ARGUS: a cache of two layers with q4_0 pages, a prompt's K/V appended,
 * then one decode step's attention per layer. Build against an installed ARGUS with
 *   cc -std=c11 decode.c $(pkg-config --cflags --libs argus) -lm -o decode
 * or with CMake (CMakeLists.txt beside this file). */
#include <argus/argus.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { kLayers = 2, kQHeads = 8, kKvHeads = 2, kHeadDim = 64, kTokens = 300 };

static float Value(unsigned i) { return (float)sin(0.37 * i) + 0.1f * (float)(i % 7); }

int main(void) {
  char* err = NULL;
  argus_cache_options_t* options = argus_cache_options_create();
  argus_cache_options_set_geometry(options, kLayers, kQHeads, kKvHeads, kHeadDim);
  argus_cache_options_set_codecs(options, "q4_0", "q4_0");
  argus_cache_options_set_page_tokens(options, 64);
  argus_cache_options_set_ram_budget(options, 64u << 20);
  argus_cache_t* cache = argus_cache_open(options, &err);
  argus_cache_options_destroy(options);
  if (cache == NULL) {
    fprintf(stderr, "argus_cache_open: %s\n", err);
    argus_free(err);
    return 1;
  }

  const size_t row = (size_t)kKvHeads * kHeadDim;
  float* k = malloc(sizeof(float) * kTokens * row);
  float* v = malloc(sizeof(float) * kTokens * row);
  float q[kQHeads * kHeadDim], out[kQHeads * kHeadDim];
  for (size_t i = 0; i < kTokens * row; ++i)
    k[i] = Value((unsigned)i), v[i] = Value((unsigned)(3 * i + 1));
  for (size_t i = 0; i < kQHeads * kHeadDim; ++i) q[i] = Value((unsigned)(5 * i + 2));

  const int64_t seq = argus_seq_create(cache, &err);
  for (uint32_t layer = 0; layer < kLayers && err == NULL; ++layer) {
    argus_seq_append_f32(cache, seq, layer, k, v, kTokens, &err);
    if (err == NULL) argus_attend_decode_f32(cache, seq, layer, q, out, &err);
    if (err == NULL)
      printf("layer %u: out[0..3] = %.6f %.6f %.6f %.6f\n", layer, out[0], out[1], out[2], out[3]);
  }
  if (err == NULL) {
    char* stats = argus_cache_stats_json(cache, &err);
    if (stats != NULL) printf("stats: %s\n", stats);
    argus_free(stats);
  }
  free(k);
  free(v);
  argus_cache_close(cache);
  if (err != NULL) {
    fprintf(stderr, "argus: %s\n", err);
    argus_free(err);
    return 1;
  }
  printf("argus %s: ok\n", argus_version());
  return 0;
}
