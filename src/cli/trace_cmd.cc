// argus trace generate / record / info: decode traces (docs/traces.md), synthetic or recorded
// from a model over a text.
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "argus/eval.h"
#include "argus/model.h"
#include "cli/commands.h"
#include "core/measure.h"
#include "eval/long_context.h"

namespace argus::cli {
namespace {

struct GenerateOptions {
  TraceOptions trace;
  std::string kind = "recall";
  std::string geometry = "llama-3-8b";
  uint32_t layers = 2;
  std::string out_path;
};

TraceKind ParseKind(const std::string& name) {
  for (TraceKind kind : {TraceKind::kRecency, TraceKind::kRecall, TraceKind::kNeedle}) {
    if (name == TraceKindName(kind)) return kind;
  }
  throw Invalid("--kind " + name + ": expected recency, recall or needle");
}

// A preset name, or "L,Q,KV,D". `layers` replaces a preset's layer count, and an explicit
// form's when `layers_given`.
CacheGeometry ParseGeometry(const std::string& spec, uint32_t layers, bool layers_given) {
  if (auto preset = FindModel(spec); preset.ok()) {
    CacheGeometry g = preset->geometry;
    g.n_layers = layers;
    return g;
  }
  std::array<uint32_t, 4> fields{};
  const char* p = spec.data();
  const char* end = spec.data() + spec.size();
  for (size_t i = 0; i < fields.size(); ++i) {
    auto [next, error] = std::from_chars(p, end, fields[i]);
    // Each field ends at a comma, the last one at the end of the spec.
    const char* want = i + 1 == fields.size() ? end : std::find(next, end, ',');
    if (error != std::errc() || next != want || (want == end && i + 1 < fields.size())) {
      throw Invalid("--geometry " + spec +
                    ": expected llama-3-8b, qwen2.5-0.5b or LAYERS,Q_HEADS,KV_HEADS,HEAD_DIM");
    }
    p = next + (want == end ? 0 : 1);
  }
  return {layers_given ? layers : fields[0], fields[1], fields[2], fields[3]};
}

void RunGenerate(GenerateOptions o, bool layers_given) {
  o.trace.kind = ParseKind(o.kind);
  o.trace.geometry = ParseGeometry(o.geometry, o.layers, layers_given);
  fmt::print(stderr, "generating a {} trace: {}, {} prefix tokens, {} steps, seed {}\n",
             TraceKindName(o.trace.kind), o.trace.geometry.ToString(), o.trace.n_prefix_tokens,
             o.trace.n_steps, o.trace.seed);
  const auto start = Clock::now();
  const Trace trace = ValueOrThrow(GenerateTrace(o.trace));
  fmt::print(stderr, "generated in {:.1f} s; writing {}\n", Seconds(start), o.out_path);
  ThrowIfError(WriteTrace(trace, o.out_path));
}

struct RecordOptions {
  std::string model_path, text_path, out_path;
  uint32_t n_prefix_tokens = 448, n_steps = 64, n_batch = 64;
  unsigned threads = 0;
};

void RunRecord(const RecordOptions& o) {
  const std::unique_ptr<Model> model = ValueOrThrow(Model::Load(o.model_path));
  const std::vector<int32_t> tokens = model->tokenizer().Encode(ReadTextFile(o.text_path), true);
  fmt::print(stderr, "recording a trace of {}: {} prefix tokens, {} steps of {} ({} tokens)\n",
             o.model_path, o.n_prefix_tokens, o.n_steps, o.text_path, tokens.size());
  const auto start = Clock::now();
  const Trace trace =
      ValueOrThrow(RecordTrace(*model, tokens, o.n_prefix_tokens, o.n_steps, o.n_batch, o.threads));
  fmt::print(stderr, "recorded in {:.1f} s; writing {}\n", Seconds(start), o.out_path);
  ThrowIfError(WriteTrace(trace, o.out_path));
}

void RunInfo(const std::string& path, bool json) {
  const auto start = Clock::now();
  const Trace trace = ValueOrThrow(ReadTrace(path));
  fmt::print(stderr, "read and verified in {:.1f} s\n", Seconds(start));
  const TraceOptions& o = trace.options;
  std::vector<int64_t> targets;  // distinct, in order of first use
  size_t n_target_steps = 0;
  for (int64_t t : trace.target) {
    if (t < 0) continue;
    ++n_target_steps;
    if (std::find(targets.begin(), targets.end(), t) == targets.end()) targets.push_back(t);
  }
  const size_t k_bytes = trace.k.size() * sizeof(uint16_t);
  const size_t q_bytes = trace.q.size() * sizeof(float);
  if (json) {
    nlohmann::json j = {
        {"path", path},
        {"kind", TraceKindName(o.kind)},
        {"geometry",
         {{"layers", o.geometry.n_layers},
          {"q_heads", o.geometry.n_q_heads},
          {"kv_heads", o.geometry.n_kv_heads},
          {"head_dim", o.geometry.head_dim}}},
        {"prefix_tokens", o.n_prefix_tokens},
        {"steps", o.n_steps},
        {"seed", o.seed},
        {"sinks", o.n_sinks},
        {"recent_tokens", o.recent_tokens},
        {"recall_targets", o.n_recall_targets},
        {"recall_period", o.recall_period},
        {"needle_depth", o.needle_depth},
        {"needle_period", o.needle_period},
        {"focus", o.focus},
        {"target_steps", n_target_steps},
        {"target_positions", targets},
        {"k_bytes", k_bytes},
        {"v_bytes", k_bytes},
        {"q_bytes", q_bytes},
    };
    fmt::print("{}\n", j.dump(2));
    return;
  }
  std::string positions;
  for (int64_t t : targets) positions += (positions.empty() ? "" : ", ") + std::to_string(t);
  fmt::print("trace          {}\n", path);
  fmt::print("kind           {}\n", TraceKindName(o.kind));
  fmt::print("geometry       {}\n", o.geometry.ToString());
  // A recorded trace has only its geometry and lengths: the rest shapes synthetic ones.
  if (o.kind == TraceKind::kRecorded) {
    fmt::print("tokens         {} prefix + {} steps\n", o.n_prefix_tokens, o.n_steps);
  } else {
    fmt::print("tokens         {} prefix + {} steps, seed {}\n", o.n_prefix_tokens, o.n_steps,
               o.seed);
    fmt::print("sinks          {}, recent window {} tokens, focus {}\n", o.n_sinks, o.recent_tokens,
               o.focus);
    fmt::print("recall         {} targets every {} steps\n", o.n_recall_targets, o.recall_period);
    fmt::print("needle         depth {}, every {} steps\n", o.needle_depth, o.needle_period);
    fmt::print("targets        {} steps seek [{}]\n", n_target_steps, positions);
  }
  fmt::print("bytes          K {}, V {}, Q {}\n", k_bytes, k_bytes, q_bytes);
}

}  // namespace

void AddTraceCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("trace", "Generate, record or describe decode traces");
  cmd->require_subcommand(1);

  auto g = std::make_shared<GenerateOptions>();
  auto* gen = cmd->add_subcommand("generate", "Write a synthetic trace (docs/traces.md)");
  gen->add_option("--kind", g->kind, "recency, recall or needle")->capture_default_str();
  gen->add_option("--geometry", g->geometry,
                  "llama-3-8b, qwen2.5-0.5b or LAYERS,Q_HEADS,KV_HEADS,HEAD_DIM")
      ->capture_default_str();
  auto* layers = gen->add_option("--layers", g->layers,
                                 "Layers (replaces the geometry's layer count; presets: 2)");
  gen->add_option("--prefix-tokens", g->trace.n_prefix_tokens, "Tokens appended before decoding")
      ->capture_default_str();
  gen->add_option("--steps", g->trace.n_steps, "Decode steps")->capture_default_str();
  gen->add_option("--seed", g->trace.seed, "Seed")->capture_default_str();
  gen->add_option("--sinks", g->trace.n_sinks, "Sink tokens")->capture_default_str();
  gen->add_option("--recent-tokens", g->trace.recent_tokens, "Recent window")
      ->capture_default_str();
  gen->add_option("--recall-targets", g->trace.n_recall_targets, "recall: distant targets")
      ->capture_default_str();
  gen->add_option("--recall-period", g->trace.recall_period, "recall: steps between recalls")
      ->capture_default_str();
  gen->add_option("--needle-depth", g->trace.needle_depth, "needle: position in the prefix, 0-1")
      ->capture_default_str();
  gen->add_option("--needle-period", g->trace.needle_period, "needle: steps between seeks")
      ->capture_default_str();
  gen->add_option("--focus", g->trace.focus, "Score of a targeted key (after 1/sqrt(d))")
      ->capture_default_str();
  gen->add_option("-o,--out", g->out_path, "Output trace file")->required();
  gen->callback([g, layers] { RunGenerate(*g, layers->count() > 0); });

  auto r = std::make_shared<RecordOptions>();
  auto* rec = cmd->add_subcommand(
      "record", "Write the trace a model gives over a text: its K/V and queries, layer by layer");
  rec->add_option("-m,--model", r->model_path, "GGUF model")->required()->check(CLI::ExistingFile);
  rec->add_option("-f,--file", r->text_path, "Text file (BOS first, as argus eval reads it)")
      ->required()
      ->check(CLI::ExistingFile);
  rec->add_option("--prefix-tokens", r->n_prefix_tokens, "Tokens evaluated before decoding")
      ->capture_default_str();
  rec->add_option("--steps", r->n_steps, "Tokens then decoded one at a time")
      ->capture_default_str();
  rec->add_option("-b,--batch-size", r->n_batch, "Prefix tokens per chunk")->capture_default_str();
  rec->add_option("-t,--threads", r->threads, "Threads (0: one per hardware thread)");
  rec->add_option("-o,--out", r->out_path, "Output trace file")->required();
  rec->callback([r] { RunRecord(*r); });

  auto info_path = std::make_shared<std::string>();
  auto info_json = std::make_shared<bool>(false);
  auto* info = cmd->add_subcommand("info", "Verify a trace file and print its options and sizes");
  info->add_option("file", *info_path, "Trace file")->required();
  info->add_flag("--json", *info_json, "Print JSON instead of text");
  info->callback([info_path, info_json] { RunInfo(*info_path, *info_json); });
}

}  // namespace argus::cli
