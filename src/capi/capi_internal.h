// What the C API's files share: the handle structs, the registry that tells live handles from
// closed ones, and the conversion of Status and exceptions into `char** errptr` messages.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "argus/argus.h"
#include "argus/cache.h"
#include "argus/policy.h"
#include "argus/status.h"
#include "argus/store.h"

namespace argus::capi {

// Handles are registered from open to close, so a call with a pointer that is not (or no longer)
// a live handle of its kind gets an error instead of touching freed memory.
enum class HandleKind : int { kCacheOptions, kCache, kModel, kContextOptions, kContext, kSampler };
void Register(const void* handle, HandleKind kind);
void Unregister(const void* handle);
bool IsLive(const void* handle, HandleKind kind);
std::string_view HandleKindName(HandleKind kind);

// Sets *errptr (when errptr is not NULL) to a malloc'ed copy of the status's text, freeing what
// it held.
void SetError(char** errptr, const Status& status);
// A malloc'ed, NUL-terminated copy; NULL when it cannot be allocated.
char* CopyString(std::string_view text);
// The same, or ResourceExhausted.
Result<char*> OwnedString(std::string_view text);

// The handle `h` of `kind`, or an error naming what was passed.
Status CheckHandle(const void* h, HandleKind kind, std::string_view function);

// Runs `body` (returning Status or Result<T>) and converts its failure, or any exception, into
// *errptr and `fail`. No exception leaves a C API function.
template <typename T, typename Body>
T Guard(char** errptr, T fail, Body&& body) {
  try {
    auto result = body();
    if constexpr (std::is_same_v<decltype(result), Status>) {
      if (!result.ok()) SetError(errptr, result);
      return result.ok() ? T{} : fail;
    } else {
      if (!result.ok()) {
        SetError(errptr, result.status());
        return fail;
      }
      return static_cast<T>(std::move(result).value());
    }
  } catch (const std::bad_alloc&) {
    SetError(errptr, Status::ResourceExhausted("out of memory"));
  } catch (const std::exception& e) {
    SetError(errptr, Status::Internal(e.what()));
  } catch (...) {
    SetError(errptr, Status::Internal("unknown exception"));
  }
  return fail;
}

// Handle structs name their kind as `static constexpr HandleKind kKind`.
template <typename Handle>
Handle* Adopt(std::unique_ptr<Handle> handle) {
  Register(handle.get(), Handle::kKind);
  return handle.release();
}
template <typename Handle>
Handle* CreateHandle() {
  try {
    return Adopt(std::make_unique<Handle>());
  } catch (...) {
    return nullptr;
  }
}
// Closing NULL, or a handle closed already, does nothing.
template <typename Handle>
void DestroyHandle(Handle* handle) {
  if (!IsLive(handle, Handle::kKind)) return;
  Unregister(handle);
  delete handle;
}
// Option setters have no errptr: on a NULL or closed options object they do nothing, and their
// values are checked when the handle opens.
template <typename Options, typename Set>
void SetOption(Options* options, Set&& set) {
  if (!IsLive(options, Options::kKind)) return;
  try {
    set(*options);
  } catch (...) {  // out of memory copying a string: the option keeps its value
  }
}

// For void functions: a Status body.
template <typename Body>
void GuardVoid(char** errptr, Body&& body) {
  Guard<int>(errptr, 0, [&]() -> Status { return body(); });
}

// Placement options from a profile name or JSON file (empty: none), the cache codecs taken from
// its first ladder state unless given explicitly (then they must match it).
struct PlacementChoice {
  std::optional<PlacementOptions> placement;
  std::string k_codec, v_codec;
};
Result<PlacementChoice> ChoosePlacement(const std::string& profile, const std::string& k_codec,
                                        const std::string& v_codec, bool has_disk);

// A disk tier in `dir` with `budget_bytes` (a default when 0); nullptr for an empty dir.
Result<std::unique_ptr<DiskTier>> OpenDisk(const std::string& dir, uint64_t budget_bytes);

// The statistics JSON of argus_cache_stats_json and argus_context_stats_json.
std::string StatsJson(const CacheStats& cache, const std::optional<PlacementStats>& placement);

}  // namespace argus::capi
