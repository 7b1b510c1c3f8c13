// The C API's shared machinery: live-handle registry, error messages, and the choices that
// cache and context handles make alike (placement profile, disk tier, statistics).
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "capi/capi_internal.h"

namespace argus::capi {
namespace {

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
std::unordered_map<const void*, HandleKind>& Registry() {
  static auto* handles = new std::unordered_map<const void*, HandleKind>();
  return *handles;
}

}  // namespace

void Register(const void* handle, HandleKind kind) {
  std::lock_guard lock(RegistryMutex());
  Registry()[handle] = kind;
}

void Unregister(const void* handle) {
  std::lock_guard lock(RegistryMutex());
  Registry().erase(handle);
}

bool IsLive(const void* handle, HandleKind kind) {
  std::lock_guard lock(RegistryMutex());
  auto it = Registry().find(handle);
  return it != Registry().end() && it->second == kind;
}

std::string_view HandleKindName(HandleKind kind) {
  switch (kind) {
    case HandleKind::kCacheOptions:
      return "argus_cache_options_t";
    case HandleKind::kCache:
      return "argus_cache_t";
    case HandleKind::kModel:
      return "argus_model_t";
    case HandleKind::kContextOptions:
      return "argus_context_options_t";
    case HandleKind::kContext:
      return "argus_context_t";
    case HandleKind::kSampler:
      return "argus_sampler_t";
  }
  return "handle";
}

char* CopyString(std::string_view text) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy == nullptr) return nullptr;
  std::memcpy(copy, text.data(), text.size());
  copy[text.size()] = '\0';
  return copy;
}

Result<char*> OwnedString(std::string_view text) {
  char* copy = CopyString(text);
  if (copy == nullptr) return Status::ResourceExhausted("out of memory copying a string");
  return copy;
}

void SetError(char** errptr, const Status& status) {
  if (errptr == nullptr) return;
  std::free(*errptr);
  *errptr = CopyString(status.ToString());
}

Status CheckHandle(const void* h, HandleKind kind, std::string_view function) {
  const std::string what = std::string(function) + ": the " + std::string(HandleKindName(kind));
  if (h == nullptr) return Status::InvalidArgument(what + " is NULL");
  if (!IsLive(h, kind)) {
    return Status::InvalidArgument(what +
                                   " is not open (closed already, or not a handle of "
                                   "this kind)");
  }
  return Status::Ok();
}

Result<PlacementChoice> ChoosePlacement(const std::string& profile, const std::string& k_codec,
                                        const std::string& v_codec, bool has_disk) {
  PlacementChoice choice;
  choice.k_codec = k_codec.empty() ? "f16" : k_codec;
  choice.v_codec = v_codec.empty() ? "f16" : v_codec;
  if (profile.empty()) return choice;
  PlacementOptions placement;
  ARGUS_ASSIGN_OR_RETURN(placement.profile, Profile::Load(profile));
  const Profile& p = placement.profile;
  if (p.NeedsDisk() && !has_disk) {
    return Status::InvalidArgument("profile '" + p.name +
                                   "' keeps pages or exact masters on disk: set a disk directory");
  }
  const auto differs = [](const std::string& given, const std::string& ladder) {
    return !given.empty() && given != ladder;
  };
  if (differs(k_codec, p.ladder[0].k_codec) || differs(v_codec, p.ladder[0].v_codec)) {
    return Status::InvalidArgument("profile '" + p.name + "' holds full pages as " +
                                   p.ladder[0].k_codec + "/" + p.ladder[0].v_codec +
                                   " (its first ladder state); the codecs set were " + k_codec +
                                   "/" + v_codec);
  }
  choice.k_codec = p.ladder[0].k_codec;
  choice.v_codec = p.ladder[0].v_codec;
  choice.placement = std::move(placement);
  return choice;
}

Result<std::unique_ptr<DiskTier>> OpenDisk(const std::string& dir, uint64_t budget_bytes) {
  if (dir.empty()) return std::unique_ptr<DiskTier>();
  DiskTierOptions options;
  options.dir = dir;
  options.disk_budget_bytes = budget_bytes ? budget_bytes : uint64_t{8} << 30;
  return DiskTier::Open(options);
}

std::string StatsJson(const CacheStats& s, const std::optional<PlacementStats>& placement) {
  nlohmann::ordered_json j;
  j["n_sequences"] = s.n_sequences;
  j["n_pages"] = s.n_pages;
  j["n_full_pages"] = s.n_full_pages;
  j["n_active_pages"] = s.n_active_pages;
  j["page_bytes"] = s.page_bytes;
  j["ram_page_bytes"] = s.ram_page_bytes;
  j["disk_page_bytes"] = s.disk_page_bytes;
  j["n_ram_pages"] = s.n_ram_pages;
  j["n_disk_pages"] = s.n_disk_pages;
  j["metadata_bytes"] = s.metadata_bytes;
  j["ram_budget_bytes"] = s.ram.budget_bytes;
  j["ram_used_bytes"] = s.ram.used_bytes;
  nlohmann::ordered_json codecs = nlohmann::ordered_json::array();
  for (const CodecBytes& c : s.by_codec) {
    codecs.push_back({{"codec", c.codec},
                      {"k_bytes", c.k_bytes},
                      {"v_bytes", c.v_bytes},
                      {"n_k_pages", c.n_k_pages},
                      {"n_v_pages", c.n_v_pages}});
  }
  j["by_codec"] = std::move(codecs);
  if (s.has_disk) {
    j["disk"] = {{"dir", s.disk.dir},
                 {"budget_bytes", s.disk.budget_bytes},
                 {"used_bytes", s.disk.used_bytes},
                 {"n_pages", s.disk.n_pages},
                 {"n_reads", s.disk.n_reads},
                 {"read_bytes", s.disk.read_bytes},
                 {"n_writes", s.disk.n_writes},
                 {"write_bytes", s.disk.write_bytes},
                 {"n_corrupt_reads", s.disk.n_corrupt_reads}};
  }
  if (placement) {
    const PlacementStats& p = *placement;
    j["placement"] = {{"active", p.active},
                      {"pages_per_state", p.pages_per_state},
                      {"n_promotions", p.n_promotions},
                      {"n_demotions", p.n_demotions},
                      {"n_migrations_dropped", p.n_migrations_dropped},
                      {"promoted_bytes_read", p.promoted_bytes_read},
                      {"master_bytes_written", p.master_bytes_written},
                      {"attention_disk_bytes_read", p.attention_disk_bytes_read},
                      {"n_tiles_skipped", p.n_tiles_skipped},
                      {"max_skipped_mass_bound", p.max_skipped_mass_bound},
                      {"effective_bits_per_value", p.effective_bits_per_value},
                      {"last_error", p.last_error}};
  }
  return j.dump();
}

}  // namespace argus::capi
