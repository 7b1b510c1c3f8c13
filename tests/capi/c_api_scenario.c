/* Drives the C API from C11, as a host engine would (see c_api_scenario.h). */
#include "c_api_scenario.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "argus/argus.h"

/* Every call below leaves its error in `e`; the first failure ends the scenario. */
#define TRY(call)             \
  do {                        \
    call;                     \
    if (e != NULL) goto fail; \
  } while (0)

int capi_run_scenario(const capi_scenario* s, capi_outputs* out, char** errptr) {
  char* e = NULL;
  argus_cache_t* cache = NULL;
  int64_t seq = -1, child = -1;
  const size_t row = (size_t)s->n_kv_heads * s->head_dim;
  const size_t q_row = (size_t)s->n_q_heads * s->head_dim;
  const uint32_t n_total = s->n_prefix + s->n_steps;
  uint32_t layer, step, t;

  argus_cache_options_t* options = argus_cache_options_create();
  argus_cache_options_set_geometry(options, s->n_layers, s->n_q_heads, s->n_kv_heads, s->head_dim);
  argus_cache_options_set_codecs(options, s->k_codec, s->v_codec);
  argus_cache_options_set_page_tokens(options, s->page_tokens);
  argus_cache_options_set_ram_budget(options, s->ram_budget);
  argus_cache_options_set_threads(options, 2);
  if (s->disk_dir != NULL) argus_cache_options_set_disk(options, s->disk_dir, (uint64_t)1 << 30);
  if (s->profile != NULL) argus_cache_options_set_profile(options, s->profile);
  argus_cache_options_set_placement_sync(options, 1);
  cache = argus_cache_open(options, &e);
  argus_cache_options_destroy(options);
  if (e != NULL) goto fail;

  TRY(seq = argus_seq_create(cache, &e));
  if (s->profile != NULL) TRY(argus_placement_begin(cache, seq, n_total, &e));
  for (layer = 0; layer < s->n_layers; ++layer) {
    const float* k = s->k + (size_t)layer * n_total * row;
    const float* v = s->v + (size_t)layer * n_total * row;
    for (t = 0; t < s->n_prefix; t += s->chunk) {
      const uint32_t n = s->n_prefix - t < s->chunk ? s->n_prefix - t : s->chunk;
      TRY(argus_seq_append_f32(cache, seq, layer, k + t * row, v + t * row, n, &e));
    }
    if (s->n_prefill > 0) {
      const size_t offset = (size_t)layer * s->n_prefill * q_row;
      TRY(argus_attend_prefill_f32(cache, seq, layer, s->q_prefill + offset, s->n_prefill,
                                   out->prefill + offset, &e));
    }
  }
  for (step = 0; step < s->n_steps; ++step) {
    for (layer = 0; layer < s->n_layers; ++layer) {
      const size_t at = ((size_t)layer * n_total + s->n_prefix + step) * row;
      const size_t offset = ((size_t)step * s->n_layers + layer) * q_row;
      TRY(argus_seq_append_f32(cache, seq, layer, s->k + at, s->v + at, 1, &e));
      TRY(argus_attend_decode_f32(cache, seq, layer, s->q_decode + offset, out->decode + offset,
                                  &e));
    }
    if (s->profile != NULL) TRY(argus_placement_end_step(cache, &e));
  }

  /* A branch: fork, drop the parent, crop to crop_to, regrow to n_total, decode at the last
   * position again. */
  TRY(child = argus_seq_fork(cache, seq, &e));
  TRY(argus_seq_release(cache, seq, &e));
  TRY(argus_seq_crop(cache, child, s->crop_to, &e));
  for (layer = 0; layer < s->n_layers; ++layer) {
    const size_t at = ((size_t)layer * n_total + s->crop_to) * row;
    const size_t offset = ((size_t)(s->n_steps - 1) * s->n_layers + layer) * q_row;
    TRY(argus_seq_append_f32(cache, child, layer, s->k + at, s->v + at, n_total - s->crop_to, &e));
    TRY(argus_attend_decode_f32(cache, child, layer, s->q_decode + offset,
                                out->fork + (size_t)layer * q_row, &e));
  }
  TRY(argus_seq_release(cache, child, &e));
  argus_cache_close(cache);
  return 0;

fail:
  argus_cache_close(cache);
  if (errptr != NULL) {
    argus_free(*errptr);
    *errptr = e;
  } else {
    argus_free(e);
  }
  return -1;
}

/* ---- Hostile calls ------------------------------------------------------------------------ */

static int n_silent = 0;

/* Counts a call that should have failed but left no error, and frees the message. */
static void expect_error(char* e, const char* what) {
  if (e == NULL) {
    fprintf(stderr, "hostile call reported no error: %s\n", what);
    ++n_silent;
    return;
  }
  if (strlen(e) == 0) {
    fprintf(stderr, "hostile call reported an empty message: %s\n", what);
    ++n_silent;
  }
  argus_free(e);
}

#define EXPECT_ERROR(call)  \
  do {                      \
    char* e = NULL;         \
    call;                   \
    expect_error(e, #call); \
  } while (0)

int capi_hostile_calls(const char* model_path) {
  float k[4 * 64], v[4 * 64], q[8 * 64], o[8 * 64];
  uint16_t k16[4 * 64];
  int32_t tokens[4] = {1, 2, 3, 4};
  size_t n = 0;
  char* e = NULL;
  argus_cache_options_t* options;
  argus_cache_t* cache;
  argus_cache_t* closed;
  argus_model_t* model;
  argus_context_options_t* context_options;
  argus_sampler_t* sampler;
  int64_t seq;

  memset(k, 0, sizeof k);
  memset(v, 0, sizeof v);
  memset(q, 0, sizeof q);
  memset(k16, 0, sizeof k16);
  n_silent = 0;

  /* NULL handles, everywhere. */
  EXPECT_ERROR(argus_cache_open(NULL, &e));
  EXPECT_ERROR(argus_seq_create(NULL, &e));
  EXPECT_ERROR(argus_seq_append_f32(NULL, 0, 0, k, v, 1, &e));
  EXPECT_ERROR(argus_attend_decode_f32(NULL, 0, 0, q, o, &e));
  EXPECT_ERROR(argus_cache_stats_json(NULL, &e));
  EXPECT_ERROR(argus_model_load(NULL, &e));
  EXPECT_ERROR(argus_tokenize(NULL, "a", 1, 1, &n, &e));
  EXPECT_ERROR(argus_context_create(NULL, NULL, &e));
  EXPECT_ERROR(argus_context_eval(NULL, tokens, 1, 0, &e));
  EXPECT_ERROR(argus_sampler_sample(NULL, q, 4, &e));
  EXPECT_ERROR(argus_generate(NULL, "a", 1, NULL, &e));
  argus_cache_close(NULL);
  argus_model_close(NULL);
  argus_context_close(NULL);
  argus_sampler_destroy(NULL);
  argus_cache_options_destroy(NULL);
  argus_cache_options_set_geometry(NULL, 1, 1, 1, 1); /* does nothing */

  /* Bad options. */
  options = argus_cache_options_create();
  EXPECT_ERROR(argus_cache_open(options, &e));            /* no geometry */
  argus_cache_options_set_geometry(options, 2, 8, 3, 64); /* 3 does not divide 8 */
  EXPECT_ERROR(argus_cache_open(options, &e));
  argus_cache_options_set_geometry(options, 2, 8, 4, 64);
  argus_cache_options_set_codecs(options, "q5_7", NULL);
  EXPECT_ERROR(argus_cache_open(options, &e));
  argus_cache_options_set_codecs(options, "q4_0", "q4_0");
  argus_cache_options_set_page_tokens(options, 100); /* not a power of two */
  EXPECT_ERROR(argus_cache_open(options, &e));
  argus_cache_options_set_page_tokens(options, 16);
  argus_cache_options_set_threads(options, 1000000);
  EXPECT_ERROR(argus_cache_open(options, &e));
  argus_cache_options_set_threads(options, 1);
  argus_cache_options_set_profile(options, "no-such-profile");
  EXPECT_ERROR(argus_cache_open(options, &e));
  argus_cache_options_set_profile(options, "balanced"); /* no RAM budget, no disk */
  EXPECT_ERROR(argus_cache_open(options, &e));
  argus_cache_options_set_profile(options, "");
  argus_cache_options_set_attention(options, 0, 0, 2.0); /* epsilon out of range */
  EXPECT_ERROR(argus_cache_open(options, &e));
  argus_cache_options_set_attention(options, 0, 0, 0.0);
  EXPECT_ERROR(argus_codec_spec_bits_per_value("nope", 64, &e));
  EXPECT_ERROR(argus_codec_spec_bits_per_value(NULL, 64, &e));
  EXPECT_ERROR(argus_codec_spec_bits_per_value("q4_0", 0, &e));

  cache = argus_cache_open(options, &e);
  argus_cache_options_destroy(options);
  if (cache == NULL) {
    fprintf(stderr, "could not open a cache: %s\n", e);
    argus_free(e);
    return n_silent + 1;
  }
  seq = argus_seq_create(cache, &e);

  /* Sequences, layers and sizes out of range; NULL buffers. */
  EXPECT_ERROR(argus_seq_append_f32(cache, -1, 0, k, v, 1, &e));
  EXPECT_ERROR(argus_seq_append_f32(cache, 12345, 0, k, v, 1, &e));
  EXPECT_ERROR(argus_seq_append_f32(cache, (int64_t)1 << 40, 0, k, v, 1, &e));
  EXPECT_ERROR(argus_seq_append_f32(cache, seq, 2, k, v, 1, &e));
  EXPECT_ERROR(argus_seq_append_f32(cache, seq, UINT32_MAX, k, v, 1, &e));
  EXPECT_ERROR(argus_seq_append_f32(cache, seq, 0, NULL, v, 1, &e));
  EXPECT_ERROR(argus_seq_append_f32(cache, seq, 0, k, NULL, 1, &e));
  EXPECT_ERROR(argus_seq_append_f16(cache, seq, 0, NULL, k16, 1, &e));
  EXPECT_ERROR(argus_attend_decode_f32(cache, seq, 0, q, o, &e)); /* nothing appended */
  EXPECT_ERROR(argus_attend_decode_f32(cache, seq, 0, NULL, o, &e));
  EXPECT_ERROR(argus_attend_decode_f32(cache, seq, 0, q, NULL, &e));
  EXPECT_ERROR(argus_attend_prefill_f32(cache, seq, 0, q, 0, o, &e));
  k[5] = INFINITY; /* non-finite K */
  EXPECT_ERROR(argus_seq_append_f32(cache, seq, 0, k, v, 1, &e));
  k[5] = 0;
  EXPECT_ERROR(argus_seq_crop(cache, seq, 5, &e)); /* longer than the sequence */
  EXPECT_ERROR(argus_seq_length(cache, seq, 9, &e));
  EXPECT_ERROR(argus_seq_fork(cache, 77, &e));
  EXPECT_ERROR(argus_seq_release(cache, 77, &e));
  EXPECT_ERROR(argus_seq_save(cache, seq, "x", &e)); /* no disk tier */
  EXPECT_ERROR(argus_seq_restore(cache, "x", &e));
  EXPECT_ERROR(argus_seq_move_to_disk(cache, seq, 0, 16, &e));
  EXPECT_ERROR(argus_prefix_store(cache, seq, "fp", tokens, 4, &e));
  EXPECT_ERROR(argus_prefix_load(cache, seq, NULL, tokens, 4, &e));
  EXPECT_ERROR(argus_placement_begin(cache, seq, 16, &e)); /* no profile */
  EXPECT_ERROR(argus_placement_end_step(cache, &e));
  EXPECT_ERROR(argus_cache_last_attention_stats(cache, NULL, &e));
  EXPECT_ERROR(argus_seq_read_f32(cache, seq, 0, 0, 1, k, v, &e)); /* beyond the length */
  EXPECT_ERROR(argus_seq_read_f32(cache, seq, 0, UINT32_MAX, 2, k, v, &e));
  EXPECT_ERROR(argus_seq_read_f32(cache, seq, 0, 0, 0, NULL, v, &e));

  /* A message on entry is freed and replaced, not leaked (ASan's leak check). */
  e = argus_cache_stats_json(cache, NULL); /* any malloc'ed string */
  argus_seq_append_f32(cache, -1, 0, k, v, 1, &e);
  expect_error(e, "replacing a message on entry");

  /* A NULL errptr drops the message; the call still fails safely. */
  argus_seq_append_f32(cache, -1, 0, k, v, 1, NULL);

  /* Use after close. */
  closed = cache;
  argus_cache_close(cache);
  EXPECT_ERROR(argus_seq_create(closed, &e));
  EXPECT_ERROR(argus_attend_decode_f32(closed, 0, 0, q, o, &e));
  argus_cache_close(closed); /* a second close does nothing */

  /* The model runner. */
  EXPECT_ERROR(argus_model_load("/nonexistent/model.gguf", &e));
  if (model_path != NULL) {
    model = argus_model_load(model_path, &e);
    if (model == NULL) {
      fprintf(stderr, "could not load %s: %s\n", model_path, e);
      argus_free(e);
      return n_silent + 1;
    }
    EXPECT_ERROR(argus_tokenize(model, NULL, 5, 1, &n, &e));
    EXPECT_ERROR(argus_tokenize(model, "a", 1, 1, NULL, &e));
    tokens[1] = -7;
    EXPECT_ERROR(argus_detokenize(model, tokens, 2, &n, &e));
    tokens[1] = 2;
    context_options = argus_context_options_create();
    argus_context_options_set_codecs(context_options, "nope", NULL);
    EXPECT_ERROR(argus_context_create(model, context_options, &e));
    argus_context_options_set_codecs(context_options, "f16", "f16");
    argus_context_options_set_threads(context_options, 4000000);
    EXPECT_ERROR(argus_context_create(model, context_options, &e));
    argus_context_options_destroy(context_options);
    EXPECT_ERROR(argus_sampler_create(NAN, 40, 0.9f, 1, &e));
    EXPECT_ERROR(argus_sampler_create(-1.0f, 40, 0.9f, 1, &e));
    EXPECT_ERROR(argus_sampler_create(1.0f, 40, 1.5f, 1, &e));
    sampler = argus_sampler_create(0.0f, 40, 0.9f, 1, &e);
    EXPECT_ERROR(argus_sampler_sample(sampler, NULL, 4, &e));
    argus_sampler_destroy(sampler);
    EXPECT_ERROR(argus_sampler_sample(sampler, q, 4, &e)); /* destroyed */
    argus_model_close(model);
    EXPECT_ERROR(argus_tokenize(model, "a", 1, 1, &n, &e)); /* closed */
  }
  return n_silent;
}
