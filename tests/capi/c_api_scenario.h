/* A scenario driven through the C API by c_api_scenario.c (compiled as C11), which the C++ test
 * replays through the C++ API to compare outputs bit for bit. */
#ifndef ARGUS_TESTS_C_API_SCENARIO_H_
#define ARGUS_TESTS_C_API_SCENARIO_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct capi_scenario {
  uint32_t n_layers, n_q_heads, n_kv_heads, head_dim, page_tokens;
  const char* k_codec;
  const char* v_codec;
  const char* profile;  /* NULL: no placement engine */
  const char* disk_dir; /* NULL: no disk tier */
  uint64_t ram_budget;  /* 0: unlimited */
  uint32_t n_prefix;    /* tokens appended per layer in chunks of `chunk`, then a prefill */
  uint32_t chunk;
  uint32_t n_prefill; /* prefill queries at the prefix's last positions */
  uint32_t n_steps;   /* decode steps after the prefix, one token per layer each */
  uint32_t crop_to;   /* the fork, parent released, is cropped to this, then regrows */
  /* [n_layers][n_prefix + n_steps][n_kv_heads][head_dim] */
  const float* k;
  const float* v;
  const float* q_prefill; /* [n_layers][n_prefill][n_q_heads][head_dim] */
  const float* q_decode;  /* [n_steps][n_layers][n_q_heads][head_dim] */
} capi_scenario;

/* The outputs: prefill [n_layers][n_prefill][n_q][d], decode [n_steps][n_layers][n_q][d], and
 * the fork's decode at its last position after the crop and regrowth [n_layers][n_q][d]. */
typedef struct capi_outputs {
  float* prefill;
  float* decode;
  float* fork;
} capi_outputs;

/* 0 on success; on failure -1 and *errptr as the C API sets it. */
int capi_run_scenario(const capi_scenario* s, capi_outputs* out, char** errptr);

/* Hostile calls across the C API; returns the number of calls that did not report an error as
 * they should (0 when all did), printing each to stderr. */
int capi_hostile_calls(const char* model_path);

#ifdef __cplusplus
}
#endif

#endif /* ARGUS_TESTS_C_API_SCENARIO_H_ */
