// argus serve: the model behind Anthropic Messages and OpenAI-compatible HTTP APIs, every
// conversation's tokens batched into one forward pass per step over one KV memory.
#include <fmt/core.h>
#include <signal.h>

#include <chrono>
#include <filesystem>

#include "argus/model.h"
#include "cli/commands.h"
#include "cli/model_options.h"
#include "serve/server.h"

namespace argus::cli {
namespace {

struct ServeOptions {
  ModelOptions model;
  serve::ServerOptions server;
  std::string alias, chat_template;
  unsigned timeout_s = 600, grace_s = 30;
  std::string prompt_cache_dir;
  size_t prompt_cache_bytes = size_t{4} << 30;
};

std::string ModelName(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

serve::ChatTemplate ChooseChatTemplate(const std::string& forced, const Model& model) {
  if (!forced.empty()) {
    std::optional<serve::ChatTemplate> t = serve::ChatTemplateByName(forced);
    if (!t)
      throw Invalid("--chat-template: unknown template '" + forced +
                    "' (chatml, llama3, llama2, none)");
    return *t;
  }
  const GgufValue* source = model.file().Find("tokenizer.chat_template");
  const bool has_source = source != nullptr && source->type == GgufType::kString;
  return serve::DetectChatTemplate(has_source ? source->s : "");
}

// The context every conversation shares: the model options' cache, a budget for `parallel`
// conversations of the full context unless --ram-budget says otherwise, and the placement engine
// over all of them when the options ask for one (a profile other than exact, or --disk-dir).
BatchContextOptions BatchOptionsOf(const ServeOptions& o, const Model& model, DiskTier* disk) {
  const ContextOptions c = ContextOptionsOf(o.model, model, disk, /*background=*/true);
  BatchContextOptions b;
  b.n_ctx = c.n_ctx;
  b.n_threads = c.n_threads;
  b.n_batch = o.server.scheduler.parallel + 2 * c.n_batch;
  b.k_codec = c.k_codec;
  b.v_codec = c.v_codec;
  b.page_tokens = c.page_tokens;
  b.attention = c.attention;
  b.ram_budget_bytes = c.ram_budget_bytes;
  b.n_full_sequences = o.server.scheduler.parallel;
  b.disk = c.disk;
  b.placement = c.placement;
  return b;
}

void Serve(ServeOptions& o) {
  // Signals reach the thread that waits for them, not the server's threads (which inherit this
  // mask); a client that goes away must not kill the process through SIGPIPE.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<Model> model = LoadModel(o.model);
  if (!o.prompt_cache_dir.empty() && !o.model.disk_dir.empty()) {
    throw Invalid(
        "give one of --prompt-cache and --disk-dir: the server has one disk store, and the prompt "
        "cache's also serves the placement engine");
  }
  std::unique_ptr<DiskTier> disk =
      o.prompt_cache_dir.empty()
          ? OpenDiskTier(o.model.disk_dir, o.model.DiskBudget())
          : OpenPromptCache(o.prompt_cache_dir, o.prompt_cache_bytes, "serve");
  o.server.scheduler.prompt_cache = !o.prompt_cache_dir.empty() && disk != nullptr;
  const BatchContextOptions batch = BatchOptionsOf(o, *model, disk.get());
  std::unique_ptr<BatchContext> context = ValueOrThrow(BatchContext::Create(*model, batch));
  o.server.model_name = o.alias.empty() ? ModelName(o.model.model_path) : o.alias;
  o.server.chat_template = ChooseChatTemplate(o.chat_template, *model);
  o.server.scheduler.prefill_chunk = o.model.n_batch;
  o.server.scheduler.request_timeout = std::chrono::seconds(o.timeout_s);
  std::unique_ptr<serve::Server> server =
      ValueOrThrow(serve::Server::Start(*model, *context, o.server));
  fmt::print(stderr,
             "serve: listening on http://{}:{} as model '{}' (chat template {}), {} requests "
             "at once, KV budget {:.1f} MiB of RAM for contexts of {} tokens\n",
             o.server.host, server->port(), o.server.model_name,
             serve::ChatTemplateName(o.server.chat_template), o.server.scheduler.parallel,
             context->cache().options().ram_budget_bytes / 1048576.0, batch.n_ctx);
  if (std::optional<PlacementStats> p = context->placement_stats()) {
    fmt::print(stderr,
               "serve: placement profile '{}' {}, up to {:.1f} MiB of KV placed in RAM and on "
               "disk{}\n",
               batch.placement->profile.name, p->active ? "active" : "inactive (all fits in RAM)",
               context->placeable_bytes() / 1048576.0,
               o.model.disk_dir.empty() ? std::string() : " (" + o.model.disk_dir + ")");
  }
  if (o.server.scheduler.prompt_cache) {
    fmt::print(stderr, "serve: prompt cache {}: {} pages stored\n", o.prompt_cache_dir,
               disk->stats().n_pages);
  }
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  fmt::print(stderr, "serve: signal {}: finishing the requests in flight (up to {} s)\n",
             signal_number, o.grace_s);
  server->Stop(std::chrono::seconds(o.grace_s));
  if (o.server.scheduler.prompt_cache) {
    server.reset();
    context.reset();  // the placement engine's erasures are in the journal now
    CompactPromptCache(*disk, "serve");
  }
  fmt::print(stderr, "serve: stopped\n");
}

}  // namespace

void AddServeCommand(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand(
      "serve", "Serve the model over HTTP: Anthropic Messages and OpenAI-compatible APIs");
  AddModelOptions(*cmd, o->model);
  cmd->add_option("--host", o->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->server.port, "Port to listen on (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->server.api_key,
                  "Ask every request for this key (x-api-key or Authorization: Bearer)");
  cmd->add_option("--parallel", o->server.scheduler.parallel,
                  "Requests generating at once, batched into one forward pass per step")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  cmd->add_option("--queue", o->server.scheduler.queue_limit,
                  "Requests waiting for a slot; more are refused as overloaded")
      ->capture_default_str();
  cmd->add_option("--alias", o->alias, "Model name served (default: the file name without .gguf)");
  cmd->add_option("--chat-template", o->chat_template,
                  "Prompt format: chatml, llama3, llama2 or none (default: from the GGUF "
                  "metadata; none concatenates the messages' text)");
  cmd->add_option("--prompt-cache", o->prompt_cache_dir,
                  "Keep every prompt's whole KV pages in this folder and load them for prompts "
                  "that begin the same way, across restarts (the disk store of the placement "
                  "engine too)");
  AsByteSize(cmd->add_option("--prompt-cache-budget", o->prompt_cache_bytes,
                             "Disk bytes the prompt cache may use, e.g. 4G"))
      ->capture_default_str();
  cmd->add_option("--timeout", o->timeout_s, "Seconds a request may take in all")
      ->capture_default_str();
  cmd->add_option("--grace", o->grace_s,
                  "Seconds SIGTERM lets the requests in flight finish before cancelling them")
      ->capture_default_str();
  cmd->callback([o] { Serve(*o); });
}

}  // namespace argus::cli
