/* ARGUS C API: the KV-cache memory manager and its model runner, for hosts written in any
 * language. C11; opaque handles; no C++ type or exception crosses it.
 *
 * Errors. Every call that can fail takes `char** errptr` last. On success *errptr is left as it
 * was (callers set it to NULL first). On failure *errptr receives a malloc'ed message naming the
 * cause, "InvalidArgument: layer 7 out of range (the cache has 2)", which the caller frees with
 * argus_free(); a non-NULL *errptr on entry is freed and replaced. A NULL errptr drops the
 * message (the call still fails safely). Calls returning a pointer return NULL on failure; calls
 * returning an id or count return -1 (or 0 where noted).
 *
 * Hostile arguments (NULL handles or buffers, a layer or sequence out of range, sizes whose
 * byte counts overflow, a handle used after it was closed) are reported as errors, never a crash.
 * A closed handle is detected while its address has not been reused by a new handle.
 *
 * Thread safety. Functions without a handle argument may run concurrently. A handle is used by
 * one call at a time: calls on one argus_cache_t, argus_context_t or argus_sampler_t must be
 * serialised by the caller; calls on different handles may run concurrently. An argus_model_t is
 * immutable after argus_model_load: any number of contexts and threads may share it (close it
 * after its contexts). Option objects are plain values: not shared while being set.
 *
 * Ownership. Inputs are borrowed for the duration of the call and copied where kept (K/V rows
 * are encoded into the cache's pages; strings are copied). Returned strings and arrays are
 * malloc'ed and owned by the caller (argus_free), except where a comment says the pointer is
 * borrowed and until when.
 *
 * Not supported: custom codecs or I/O environments from C; several placement requests at once in
 * one cache (one sequence at a time is under the placement engine); callbacks from the library;
 * GPU memory; attention with a scale other than 1/sqrt(head_dim) or a mask other than causal,
 * sliding window and sinks.
 */
#ifndef ARGUS_ARGUS_H_
#define ARGUS_ARGUS_H_

#include <stddef.h>
#include <stdint.h>

/* The library is built with hidden visibility: only what this header declares is exported. */
#if defined(__GNUC__)
#define ARGUS_EXPORT __attribute__((visibility("default")))
#else
#define ARGUS_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Library ---------------------------------------------------------------------------------*/

ARGUS_EXPORT const char* argus_version(void); /* "0.2.0"; static storage */
ARGUS_EXPORT void argus_free(void* p);        /* frees what the library returned; NULL is fine */

/* ---- Codecs ----------------------------------------------------------------------------------
 * The built-in codecs, by index 0 .. argus_codec_count()-1 in name order. A codec spec, as the
 * cache options take it, is NAME[:token|:channel][+rot][+center], e.g. "q4_0", "int4:channel". */
ARGUS_EXPORT size_t argus_codec_count(void);
/* The codec's name; static storage. NULL for an index out of range. */
ARGUS_EXPORT const char* argus_codec_name(size_t index);
/* Bits per stored value including scales (for a 256 x 128 tile); -1 for an index out of range. */
ARGUS_EXPORT double argus_codec_bits_per_value(size_t index);
/* 1 when the codec reproduces its input exactly, 0 when lossy, -1 for an index out of range. */
ARGUS_EXPORT int argus_codec_is_lossless(size_t index);
/* Bits per value of any spec at a head_dim; -1 and an error for a spec that does not parse. */
ARGUS_EXPORT double argus_codec_spec_bits_per_value(const char* spec, uint32_t head_dim,
                                                    char** errptr);

/* ---- Cache options ----------------------------------------------------------------------------
 * Defaults: no geometry (required), codecs "f16"/"f16", pages of 256 tokens, active page "f16",
 * RAM budget 0 (unlimited), attention threads 0 (one per hardware thread), no window, no sinks,
 * epsilon 0 (exact), no disk tier, profile "" (no placement engine). */
typedef struct argus_cache_options_t argus_cache_options_t;
ARGUS_EXPORT argus_cache_options_t* argus_cache_options_create(void);
ARGUS_EXPORT void argus_cache_options_destroy(argus_cache_options_t* options);
ARGUS_EXPORT void argus_cache_options_set_geometry(argus_cache_options_t* options,
                                                   uint32_t n_layers, uint32_t n_q_heads,
                                                   uint32_t n_kv_heads, uint32_t head_dim);
/* NULL keeps the current codec (with a profile: its first ladder state's codecs). */
ARGUS_EXPORT void argus_cache_options_set_codecs(argus_cache_options_t* options,
                                                 const char* k_codec, const char* v_codec);
ARGUS_EXPORT void argus_cache_options_set_page_tokens(argus_cache_options_t* options,
                                                      uint32_t page_tokens);
ARGUS_EXPORT void argus_cache_options_set_ram_budget(argus_cache_options_t* options,
                                                     uint64_t bytes);
/* "f16" or "f32": how the partly filled page of each layer is held. */
ARGUS_EXPORT void argus_cache_options_set_active_codec(argus_cache_options_t* options,
                                                       const char* codec);
ARGUS_EXPORT void argus_cache_options_set_threads(argus_cache_options_t* options,
                                                  uint32_t n_threads);
/* Masks and certified skipping of every attention call: window 0 = none; positions below
 * `sinks` always attended; epsilon > 0 skips tiles proven to carry at most that fraction of the
 * attention mass (0: exact). With a profile, the profile's epsilon applies instead. */
ARGUS_EXPORT void argus_cache_options_set_attention(argus_cache_options_t* options,
                                                    uint32_t window, uint32_t sinks,
                                                    double epsilon);
/* A disk tier in `dir` (created when missing) holding at most `budget_bytes` of pages: spilled
 * pages, saved sequences, prefix pages and the placement engine's exact masters. */
ARGUS_EXPORT void argus_cache_options_set_disk(argus_cache_options_t* options, const char* dir,
                                               uint64_t budget_bytes);
/* The placement engine under a profile: "exact", "balanced", "research", "capacity", "cascade"
 * or a JSON profile file (docs/profiles.md). "" removes it. Needs a RAM budget; most profiles
 * need a disk tier. */
ARGUS_EXPORT void argus_cache_options_set_profile(argus_cache_options_t* options,
                                                  const char* profile);
/* 1: the placement engine decides nothing from measured time and migrates pages inside
 * argus_placement_end_step instead of on a background thread, so outputs are reproducible run to
 * run (tests). 0 (default): background migrations, and pages a plan would leave in a sketch state
 * are read exact from disk while that takes at most a third of a step's measured time. */
ARGUS_EXPORT void argus_cache_options_set_placement_sync(argus_cache_options_t* options,
                                                         int synchronous);

/* ---- The cache --------------------------------------------------------------------------------
 * Sequences are ids >= 0. Every sequence has n_layers layers, each a list of pages; a layer's K/V
 * rows are appended in token order, and a layer must be appended before it is attended. */
typedef struct argus_cache_t argus_cache_t;
/* InvalidArgument naming the option (geometry, codec spec, page size, profile); the disk tier's
 * errors when its directory cannot be used. */
ARGUS_EXPORT argus_cache_t* argus_cache_open(const argus_cache_options_t* options, char** errptr);
ARGUS_EXPORT void argus_cache_close(argus_cache_t* cache); /* NULL is fine */

ARGUS_EXPORT int64_t argus_seq_create(argus_cache_t* cache, char** errptr);
/* Frees the sequence's pages (shared pages when their last holder goes). */
ARGUS_EXPORT void argus_seq_release(argus_cache_t* cache, int64_t seq, char** errptr);
/* A new sequence sharing seq's full pages copy-on-write (its partly filled pages are copied): a
 * beam or a speculative branch. */
ARGUS_EXPORT int64_t argus_seq_fork(argus_cache_t* cache, int64_t seq, char** errptr);
/* Keeps the first n_tokens of every layer (at most each layer's length): rejected draft tokens. */
ARGUS_EXPORT void argus_seq_crop(argus_cache_t* cache, int64_t seq, uint32_t n_tokens,
                                 char** errptr);
/* Tokens in one layer; -1 on error. */
ARGUS_EXPORT int64_t argus_seq_length(argus_cache_t* cache, int64_t seq, uint32_t layer,
                                      char** errptr);

/* Appends n_tokens rows to one layer. k, v: [n_tokens, n_kv_heads, head_dim], row-major, after
 * RoPE; values must be finite. All or nothing: on error (ResourceExhausted naming the budget,
 * InvalidArgument) the cache is as it was. */
ARGUS_EXPORT void argus_seq_append_f32(argus_cache_t* cache, int64_t seq, uint32_t layer,
                                       const float* k, const float* v, uint32_t n_tokens,
                                       char** errptr);
/* The same from IEEE binary16 bit patterns. */
ARGUS_EXPORT void argus_seq_append_f16(argus_cache_t* cache, int64_t seq, uint32_t layer,
                                       const uint16_t* k, const uint16_t* v, uint32_t n_tokens,
                                       char** errptr);

/* Decode attention of one query at the layer's last position (its own K/V already appended).
 * q, out: [n_q_heads, head_dim]; causal over the sequence's tokens, scale 1/sqrt(head_dim);
 * query head h reads KV head h / (n_q_heads / n_kv_heads). */
ARGUS_EXPORT void argus_attend_decode_f32(argus_cache_t* cache, int64_t seq, uint32_t layer,
                                          const float* q, float* out, char** errptr);
/* Prefill attention of the layer's last n_queries positions, each causal (a block against all
 * earlier tokens plus a causal block over itself). q, out: [n_queries, n_q_heads, head_dim]. */
ARGUS_EXPORT void argus_attend_prefill_f32(argus_cache_t* cache, int64_t seq, uint32_t layer,
                                           const float* q, uint32_t n_queries, float* out,
                                           char** errptr);

/* Reads back, decoded to float32, the K/V rows [first, first + n_tokens) of one layer as the
 * cache holds them (after its codecs' rounding): k, v: [n_tokens, n_kv_heads, head_dim]. For
 * inspection and tests; attention never needs it. Unsupported for pages on disk (move them to
 * RAM first) and for sketch codecs that cannot be decoded (jl). */
ARGUS_EXPORT void argus_seq_read_f32(argus_cache_t* cache, int64_t seq, uint32_t layer,
                                     uint32_t first, uint32_t n_tokens, float* k, float* v,
                                     char** errptr);

/* What the last attention call of this cache did. */
typedef struct argus_attention_stats_t {
  uint32_t n_pages;           /* pages of the layer in the sequence */
  uint32_t n_pages_masked;    /* pages no query attends to (window) */
  uint64_t n_tiles;           /* (page, KV head) tiles inside the mask */
  uint64_t n_tiles_skipped;   /* tiles skipped by certified skipping */
  uint64_t bytes_read;        /* K and V tile bytes read */
  uint64_t bytes_skipped;     /* K and V tile bytes skipped */
  uint32_t n_disk_pages_read; /* pages read from the disk tier */
  uint64_t disk_bytes_read;
  double skipped_mass_bound;  /* proven bound on the skipped attention mass (<= epsilon) */
} argus_attention_stats_t;
ARGUS_EXPORT void argus_cache_last_attention_stats(const argus_cache_t* cache,
                                                   argus_attention_stats_t* stats, char** errptr);

/* ---- The placement engine (a cache opened with a profile) ---------------------------------------
 * The engine manages one sequence at a time, a request: begin it on a sequence expected to grow
 * to expected_tokens per layer (the ladder is active when that needs more than the profile's
 * share of the RAM budget). Appends, attention and crops of that sequence then go through the
 * engine: it keeps the budget by demoting cold pages (lossy codecs, disk) and promotes hot ones
 * from their exact masters. End every decode step (all layers appended and attended) with
 * argus_placement_end_step. Without a profile both calls are InvalidArgument. */
ARGUS_EXPORT void argus_placement_begin(argus_cache_t* cache, int64_t seq,
                                        uint32_t expected_tokens, char** errptr);
ARGUS_EXPORT void argus_placement_end_step(argus_cache_t* cache, char** errptr);

/* ---- The disk tier ----------------------------------------------------------------------------
 * Moves the full pages of a sequence lying wholly inside tokens [first, first + n_tokens), every
 * layer, to disk (durably, freeing their RAM) or back to RAM (verified). Returns the pages moved,
 * -1 on error (pages moved before the error stay moved). Pages shared with forks move for all. */
ARGUS_EXPORT int64_t argus_seq_move_to_disk(argus_cache_t* cache, int64_t seq, uint32_t first,
                                            uint32_t n_tokens, char** errptr);
ARGUS_EXPORT int64_t argus_seq_move_to_ram(argus_cache_t* cache, int64_t seq, uint32_t first,
                                           uint32_t n_tokens, char** errptr);
/* Saves a sequence durably under `name` (replacing an earlier save of that name only once the new
 * one is durable); restores it as a new sequence (NotFound when absent, Corruption when it fails
 * verification); erases a save. */
ARGUS_EXPORT void argus_seq_save(argus_cache_t* cache, int64_t seq, const char* name,
                                 char** errptr);
ARGUS_EXPORT int64_t argus_seq_restore(argus_cache_t* cache, const char* name, char** errptr);
ARGUS_EXPORT void argus_save_erase(argus_cache_t* cache, const char* name, char** errptr);
/* Prefix pages: full pages stored under a hash chain of `fingerprint` (names the model: K/V of
 * another model must never be served), the cache's geometry and codecs, and the token ids up to
 * each page. Store returns the pages written: none when the cache attends approximately (an
 * epsilon, window or sinks, or the sequence under an active placement ladder), whose pages are
 * not what a fresh exact computation gives. Load, into an empty sequence, loads the longest run
 * of stored leading pages wholly inside `tokens` and returns the tokens it covers. */
ARGUS_EXPORT int64_t argus_prefix_store(argus_cache_t* cache, int64_t seq, const char* fingerprint,
                                        const int32_t* tokens, size_t n_tokens, char** errptr);
ARGUS_EXPORT int64_t argus_prefix_load(argus_cache_t* cache, int64_t seq, const char* fingerprint,
                                       const int32_t* tokens, size_t n_tokens, char** errptr);

/* Statistics as a JSON object (caller frees): sequences, pages, bytes per codec and tier, the
 * RAM and disk budgets, and with a placement engine its pages per ladder state, migrations and
 * disk reads. Field names are documented in docs/integration.md. */
ARGUS_EXPORT char* argus_cache_stats_json(const argus_cache_t* cache, char** errptr);
/* The RAM bytes one sequence needs to grow to n_tokens in every layer under these options. */
ARGUS_EXPORT uint64_t argus_cache_required_ram(const argus_cache_options_t* options,
                                               uint32_t n_tokens, char** errptr);

/* ---- The model runner -------------------------------------------------------------------------
 * Llama and Qwen2 GGUF files (weights F32, F16, BF16, Q8_0, Q4_0) with their KV cache in ARGUS. */
typedef struct argus_model_t argus_model_t;
ARGUS_EXPORT argus_model_t* argus_model_load(const char* path, char** errptr);
ARGUS_EXPORT void argus_model_close(argus_model_t* model);
/* The configuration (arch, name, n_layers, n_embd, n_heads, n_kv_heads, head_dim, n_ff, n_vocab,
 * n_ctx_train, rms_eps, rope_theta, rope_neox, rope_freq_factors, tied_output, bos, eos,
 * fingerprint) as a JSON object; caller frees. */
ARGUS_EXPORT char* argus_model_info_json(const argus_model_t* model, char** errptr);
/* Token ids of `text` (text_bytes bytes) as llama.cpp's tokenizer gives them; add_special
 * prepends BOS where the vocabulary asks for it. Returns a malloc'ed array of *n_tokens ids
 * (NULL with *n_tokens 0 for no tokens or on error). */
ARGUS_EXPORT int32_t* argus_tokenize(const argus_model_t* model, const char* text,
                                     size_t text_bytes, int add_special, size_t* n_tokens,
                                     char** errptr);
/* The bytes the tokens stand for (malloc'ed, NUL-terminated, *text_bytes long). */
ARGUS_EXPORT char* argus_detokenize(const argus_model_t* model, const int32_t* tokens,
                                    size_t n_tokens, size_t* text_bytes, char** errptr);

/* The GGUF file's tensors, for hosts that run the forward pass themselves: by index
 * 0 .. argus_model_tensor_count()-1 in file order. Names are borrowed until the model closes. */
ARGUS_EXPORT size_t argus_model_tensor_count(const argus_model_t* model);
ARGUS_EXPORT const char* argus_model_tensor_name(const argus_model_t* model, size_t index);
/* The tensor's dims in GGUF order (dims[0] is the contiguous row length; at most 4), their
 * number as the result; -1 and NotFound for an unknown name. */
ARGUS_EXPORT int argus_model_tensor_dims(const argus_model_t* model, const char* name,
                                         uint64_t dims[4], char** errptr);
/* The tensor's values dequantised to float32 (F32, F16, BF16, Q8_0, Q4_0), row-major with
 * dims[0] fastest: `out` holds n_values floats, which must equal the tensor's value count. */
ARGUS_EXPORT void argus_model_tensor_f32(const argus_model_t* model, const char* name, float* out,
                                         uint64_t n_values, char** errptr);

/* A context: one sequence of a model, its KV cache, its thread pool. Defaults: the model's
 * training context, one thread per hardware thread, batches of 64, f16/f16 pages of 256, RAM
 * budget 0 (what n_ctx needs), no profile. */
typedef struct argus_context_options_t argus_context_options_t;
ARGUS_EXPORT argus_context_options_t* argus_context_options_create(void);
ARGUS_EXPORT void argus_context_options_destroy(argus_context_options_t* options);
ARGUS_EXPORT void argus_context_options_set_n_ctx(argus_context_options_t* options,
                                                  uint32_t n_ctx);
ARGUS_EXPORT void argus_context_options_set_threads(argus_context_options_t* options,
                                                    uint32_t n_threads);
ARGUS_EXPORT void argus_context_options_set_batch(argus_context_options_t* options,
                                                  uint32_t n_batch);
ARGUS_EXPORT void argus_context_options_set_codecs(argus_context_options_t* options,
                                                   const char* k_codec, const char* v_codec);
ARGUS_EXPORT void argus_context_options_set_page_tokens(argus_context_options_t* options,
                                                        uint32_t page_tokens);
ARGUS_EXPORT void argus_context_options_set_ram_budget(argus_context_options_t* options,
                                                       uint64_t bytes);
ARGUS_EXPORT void argus_context_options_set_attention(argus_context_options_t* options,
                                                      uint32_t window, uint32_t sinks,
                                                      double epsilon);
ARGUS_EXPORT void argus_context_options_set_disk(argus_context_options_t* options,
                                                 const char* dir, uint64_t budget_bytes);
ARGUS_EXPORT void argus_context_options_set_profile(argus_context_options_t* options,
                                                    const char* profile);
/* A remote tier of prefix pages shared through Redis below the disk tier (which it needs:
 * argus_context_options_set_disk): "redis://HOST:PORT[/DB]", the password from the URL
 * ("redis://:PASSWORD@HOST:PORT") or the ARGUS_REDIS_PASSWORD environment variable. NULL or ""
 * for none. A malformed URL, or rediss:// (no TLS in this build), fails argus_context_create;
 * an unreachable or failing server never fails a call: its pages are misses. */
ARGUS_EXPORT void argus_context_options_set_remote(argus_context_options_t* options,
                                                   const char* url);

typedef struct argus_context_t argus_context_t;
ARGUS_EXPORT argus_context_t* argus_context_create(const argus_model_t* model,
                                                   const argus_context_options_t* options,
                                                   char** errptr);
ARGUS_EXPORT void argus_context_close(argus_context_t* context);
/* Evaluates tokens at the next positions. Returns the logits of the last token [n_vocab], or of
 * every token [n_tokens, n_vocab] with all_logits; borrowed, valid until the next call on the
 * context. NULL on error (the context is unchanged). */
ARGUS_EXPORT const float* argus_context_eval(argus_context_t* context, const int32_t* tokens,
                                             size_t n_tokens, int all_logits, char** errptr);
ARGUS_EXPORT uint32_t argus_context_n_past(const argus_context_t* context);
/* Forgets everything after the first n_tokens. */
ARGUS_EXPORT void argus_context_truncate(argus_context_t* context, uint32_t n_tokens,
                                         char** errptr);
/* Prefix pages (the context's disk tier, and its remote tier when set): load_prefix, on an empty
 * context, loads the K/V of the longest run of whole pages of `tokens` stored earlier by any
 * process (fetching pages the disk lacks from the remote tier) and returns the tokens loaded,
 * which need no evaluation; store_prefix stores the full pages of the context's first tokens
 * (`tokens` are the ids evaluated so far), also in the remote tier, and returns the pages
 * written to the disk tier. -1 on error (no disk tier, a non-empty context). */
ARGUS_EXPORT int64_t argus_context_load_prefix(argus_context_t* context, const int32_t* tokens,
                                               size_t n_tokens, char** errptr);
ARGUS_EXPORT int64_t argus_context_store_prefix(argus_context_t* context, const int32_t* tokens,
                                                size_t n_tokens, char** errptr);
/* The context's KV cache statistics, as argus_cache_stats_json gives them, and with a remote
 * tier its counters under "remote". */
ARGUS_EXPORT char* argus_context_stats_json(const argus_context_t* context, char** errptr);

/* Sampling: temperature 0 is greedy (lowest id on ties); top_k 0 and top_p 1 disable the cuts.
 * The same logits and seed give the same tokens on every machine. */
typedef struct argus_sampler_t argus_sampler_t;
ARGUS_EXPORT argus_sampler_t* argus_sampler_create(float temperature, uint32_t top_k, float top_p,
                                                   uint64_t seed, char** errptr);
ARGUS_EXPORT void argus_sampler_destroy(argus_sampler_t* sampler);
ARGUS_EXPORT int32_t argus_sampler_sample(argus_sampler_t* sampler, const float* logits,
                                          size_t n_vocab, char** errptr);

/* Generates up to n_predict tokens after `prompt` (tokenized with BOS, evaluated from the
 * context's current position) and returns their text (malloc'ed, NUL-terminated), exactly what
 * `argus run` prints for the same model, options and sampler. Stops early at end of generation
 * or a full context. */
ARGUS_EXPORT char* argus_generate(argus_context_t* context, const char* prompt, uint32_t n_predict,
                                  argus_sampler_t* sampler, char** errptr);

#ifdef __cplusplus
}
#endif

#endif /* ARGUS_ARGUS_H_ */
