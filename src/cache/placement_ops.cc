// The placement mechanism (placement_access.h): the operations the placement engine composes
// into migrations, and the page table's readers.
#include <algorithm>
#include <string>

#include "cache/cache_internal.h"
#include "cache/placement_access.h"
#include "core/checksum.h"

namespace argus {

void KvCache::Impl::SetSummary(PageId page, const float* summary, bool keep_old) {
  const size_t n_bounds = size_t{n_kv_heads} * head_dim;
  float* lo = Bounds(page);
  float* hi = lo + n_bounds;
  float* norms = Norms(page);
  if (!keep_old) {
    std::copy_n(summary, 2 * n_bounds, lo);
    std::copy_n(summary + 2 * n_bounds, n_kv_heads, norms);
    return;
  }
  for (size_t i = 0; i < n_bounds; ++i) {
    lo[i] = std::min(lo[i], summary[i]);
    hi[i] = std::max(hi[i], summary[n_bounds + i]);
  }
  for (uint32_t h = 0; h < n_kv_heads; ++h)
    norms[h] = std::max(norms[h], summary[2 * n_bounds + h]);
}

Result<uint16_t> AddCodec(KvCache& cache, std::string_view spec, CodecRole plane) {
  return KvCacheAccess::Of(cache).FindOrAddCodec(spec, plane);
}

uint16_t FullKCodec(const KvCache& cache) { return KvCacheAccess::Of(cache).k_codec; }
uint16_t FullVCodec(const KvCache& cache) { return KvCacheAccess::Of(cache).v_codec; }

size_t FullPageBytes(const KvCache& cache, uint16_t k, uint16_t v) {
  return KvCacheAccess::Of(cache).PageBytes(k, v);
}

size_t SummaryFloats(const KvCache& cache) { return KvCacheAccess::Of(cache).SummaryFloats(); }

Status TranscodePage(const KvCache& cache, std::span<const std::byte> src, uint16_t src_k,
                     uint16_t src_v, std::span<std::byte> dst, uint16_t dst_k, uint16_t dst_v,
                     float* summary, float* scratch) {
  const CacheImpl& impl = KvCacheAccess::Of(cache);
  if (src.size() != impl.PageBytes(src_k, src_v) || dst.size() != impl.PageBytes(dst_k, dst_v)) {
    return Status::InvalidArgument("transcode: page sizes do not match their codecs");
  }
  ARGUS_RETURN_IF_ERROR(
      impl.Transcode(src, src_k, src_v, dst, dst_k, dst_v, impl.page_tokens, scratch));
  return impl.Summarize(dst, dst_k, summary, summary + 2 * size_t{impl.n_kv_heads} * impl.head_dim,
                        scratch);
}

PageKey NewDiskKey(KvCache& cache) {
  CacheImpl& impl = KvCacheAccess::Of(cache);
  return {impl.key_nonce, impl.next_key_serial++};
}

std::string DiskTag(const KvCache& cache, uint16_t k, uint16_t v) {
  const CacheImpl& impl = KvCacheAccess::Of(cache);
  return impl.codecs[k].spec + "/" + impl.codecs[v].spec;
}

namespace {

Status Overtaken(PageId page, std::string_view what) {
  return Status::Aborted(std::string(what) + ": page " + std::to_string(page) +
                         " changed since the work was staged");
}

}  // namespace

Status AttachMaster(KvCache& cache, PageId page, uint32_t generation, const PageKey& key,
                    uint64_t checksum) {
  CacheImpl& impl = KvCacheAccess::Of(cache);
  PageTable& table = impl.table;
  const char* what = "attaching a master";
  if (page >= table.size() || table.generation[page] != generation ||
      table.state[page] != PageState::kFull) {
    return Overtaken(page, what);
  }
  if (impl.HasMaster(page)) {
    return Status::InvalidArgument(std::string(what) + ": page " + std::to_string(page) +
                                   " has one");
  }
  if (table.tier[page] != TierKind::kRam || table.k_codec[page] != impl.k_codec ||
      table.v_codec[page] != impl.v_codec || table.checksum[page] != checksum) {
    return Overtaken(page, what);
  }
  table.master_key[page] = key;
  table.master_checksum[page] = checksum;
  return Status::Ok();
}

Status InstallPage(KvCache& cache, PageId page, uint32_t generation, uint16_t k, uint16_t v,
                   std::span<const std::byte> bytes, const float* summary) {
  CacheImpl& impl = KvCacheAccess::Of(cache);
  PageTable& table = impl.table;
  const std::string what = "installing page " + std::to_string(page) + " as k " +
                           (k < impl.codecs.size() ? impl.codecs[k].spec : "?") + ", v " +
                           (v < impl.codecs.size() ? impl.codecs[v].spec : "?");
  if (page >= table.size() || table.generation[page] != generation ||
      table.state[page] != PageState::kFull) {
    return Overtaken(page, what);
  }
  if (k >= impl.codecs.size() || v >= impl.codecs.size() || bytes.size() != impl.PageBytes(k, v)) {
    return Status::InvalidArgument(what + ": " + std::to_string(bytes.size()) +
                                   " bytes do not match the codecs");
  }
  const bool on_disk = table.tier[page] == TierKind::kDisk;
  if (on_disk && !impl.HasMaster(page)) {
    return Status::InvalidArgument(what + ": it is on disk without a master");
  }
  const SlotId old = on_disk ? SlotId{} : table.slot[page];
  ARGUS_ASSIGN_OR_RETURN(SlotId slot, on_disk
                                          ? impl.ram.Allocate(bytes.size(), what)
                                          : impl.ram.AllocateReplacing(old, bytes.size(), what));
  std::copy(bytes.begin(), bytes.end(), impl.ram.Bytes(slot).begin());
  if (old.valid()) impl.ram.Free(old);
  impl.SetSummary(page, summary, /*keep_old=*/true);
  impl.SetSlot(page, slot, k, v);
  table.tier[page] = TierKind::kRam;
  table.disk_key[page] = PageKey{};
  table.checksum[page] = Checksum64(impl.ram.Bytes(slot));
  return Status::Ok();
}

Status DropToMaster(KvCache& cache, PageId page) {
  CacheImpl& impl = KvCacheAccess::Of(cache);
  PageTable& table = impl.table;
  const std::string what = "dropping page " + std::to_string(page) + " to its master";
  if (page >= table.size() || table.state[page] != PageState::kFull ||
      table.tier[page] != TierKind::kRam || !impl.HasMaster(page)) {
    return Status::InvalidArgument(what + ": not a full page in RAM with a master");
  }
  if (table.pin_count[page] > 0) return Status::InvalidArgument(what + ": the page is pinned");
  impl.ram.Free(table.slot[page]);
  table.slot[page] = SlotId{};
  table.tier[page] = TierKind::kDisk;
  table.disk_key[page] = table.master_key[page];
  table.k_codec[page] = impl.k_codec;
  table.v_codec[page] = impl.v_codec;
  table.n_bytes[page] = impl.PageBytes(impl.k_codec, impl.v_codec);
  table.k_bytes[page] = impl.KPlaneBytes(impl.k_codec);
  table.checksum[page] = table.master_checksum[page];
  ++table.generation[page];
  return Status::Ok();
}

Result<bool> AppendFitsRam(const KvCache& cache, SeqId seq, uint32_t layer, size_t n_tokens) {
  const CacheImpl& impl = KvCacheAccess::Of(cache);
  ARGUS_ASSIGN_OR_RETURN(const LayerPages* lp, impl.FindLayer(seq, layer));
  // Asked before every piece of an active engine's append (each decode token and layer): no
  // message is built unless the plan overflows, which the append itself then names in full.
  ARGUS_ASSIGN_OR_RETURN(const CacheImpl::AppendPlan plan,
                         impl.PlanAppend(*lp, n_tokens, "append"));
  return impl.ram.Fits(plan.add_bytes, plan.release_bytes);
}

void RecordAttention(KvCache& cache, std::span<const PageId> pages, std::span<const float> mass) {
  CacheImpl& impl = KvCacheAccess::Of(cache);
  PageTable& table = impl.table;
  const uint64_t now = ++impl.clock;
  for (size_t i = 0; i < std::min(pages.size(), mass.size()); ++i) {
    const PageId page = pages[i];
    if (page >= table.size() || table.state[page] == PageState::kFree) continue;
    table.mass[page] = mass[i];
    table.last_use[page] = now;
  }
}

const PageTable& PageTableOf(const KvCache& cache) { return KvCacheAccess::Of(cache).table; }

const Codec& CodecAt(const KvCache& cache, uint16_t index) {
  return *KvCacheAccess::Of(cache).codecs[index].codec;
}

}  // namespace argus
