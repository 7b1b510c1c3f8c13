// Internal to the library: the placement mechanism of a KvCache and its page table, for the
// placement engine (src/policy), the attention engine's bookkeeping (src/attention) and tests.
// These tools decide nothing; each checks that the page is still the one the caller's staged work
// was made from (its generation) and leaves the page unchanged on error.
//
// Thread safety: as KvCache's. The mutating ones (AddCodec, NewDiskKey, AttachMaster, InstallPage,
// DropToMaster, RecordAttention) need the cache's external serialisation; TranscodePage is the
// exception stated at it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "argus/cache.h"
#include "argus/codec.h"
#include "argus/status.h"
#include "argus/store.h"
#include "cache/page_table.h"

namespace argus {

// The codec-table index of a spec, added when new (at most 256 codecs per cache). Table entries
// never move once added.
Result<uint16_t> AddCodec(KvCache& cache, std::string_view spec, CodecRole plane);
// Codec-table indices of full pages' K and V codecs as they fill (CacheOptions k_codec,
// v_codec): the codecs of masters. Index 0 is the active codec.
uint16_t FullKCodec(const KvCache& cache);
uint16_t FullVCodec(const KvCache& cache);
// Bytes of a full page in these codecs.
size_t FullPageBytes(const KvCache& cache, uint16_t k, uint16_t v);
// Floats of a key summary: [2][n_kv_heads][head_dim] bounds then [n_kv_heads] norms.
size_t SummaryFloats(const KvCache& cache);
// Re-encodes a full page's bytes (codecs src_k, src_v) into dst (codecs dst_k, dst_v; exactly
// FullPageBytes(dst_k, dst_v) bytes) and writes the key summary of the result. Thread-safe,
// also beside mutating calls (even those adding codecs): it reads only codec-table entries,
// which never move, and immutable codecs; scratch holds page_tokens * head_dim floats.
Status TranscodePage(const KvCache& cache, std::span<const std::byte> src, uint16_t src_k,
                     uint16_t src_v, std::span<std::byte> dst, uint16_t dst_k, uint16_t dst_v,
                     float* summary, float* scratch);
// A fresh key for a page copy in the disk tier, and the tag such copies carry.
PageKey NewDiskKey(KvCache& cache);
std::string DiskTag(const KvCache& cache, uint16_t k, uint16_t v);
// Records that the disk tier holds, under `key` (written with DiskTag of the full codecs), the
// page's exact bytes with this checksum. Aborted (the caller erases its copy) when the page
// changed since `generation` or is not in its full codecs in RAM; InvalidArgument for a page that
// has a master already.
Status AttachMaster(KvCache& cache, PageId page, uint32_t generation, const PageKey& key,
                    uint64_t checksum);
// Replaces a full page's bytes (in RAM, or on disk with a master) by `bytes` in codecs (k, v),
// made from the page as of `generation`; the key summary becomes the union of the old one and
// `summary` (a bound for every copy the page may be read from). The RAM budget is checked as if
// the old bytes were freed. Aborted when the page changed since; the budget's ResourceExhausted;
// on error nothing changes.
Status InstallPage(KvCache& cache, PageId page, uint32_t generation, uint16_t k, uint16_t v,
                   std::span<const std::byte> bytes, const float* summary);
// Frees the RAM bytes of a full page that has a master: the page is read from its master.
Status DropToMaster(KvCache& cache, PageId page);
// Whether KvCache::Append of n_tokens rows to the sequence's layer fits the RAM budget now, by
// the append's own reckoning (the bytes of its new slots, less the active slot a filling page is
// re-encoded out of): false exactly when the append would fail with the budget's
// ResourceExhausted. NotFound for an unknown sequence, InvalidArgument for a layer out of range.
Result<bool> AppendFitsRam(const KvCache& cache, SeqId seq, uint32_t layer, size_t n_tokens);

// Called by the attention engine: mass[i] for pages[i]; advances the attention clock.
void RecordAttention(KvCache& cache, std::span<const PageId> pages, std::span<const float> mass);

// The cache's page table, by reference: it lives as long as the cache and changes with every
// mutating call.
const PageTable& PageTableOf(const KvCache& cache);
// Codec of a page-table codec index. REQUIRES: index was returned by AddCodec, FullKCodec,
// FullVCodec or is 0 (the active codec).
const Codec& CodecAt(const KvCache& cache, uint16_t index);

}  // namespace argus
