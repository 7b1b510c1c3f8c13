// The paged KV cache: page table rows, codecs, page bytes and re-encoding, and the KvCache facade
// (appends, crops and forks of a sequence are in sequences.cc).
//
// A page's bytes are one RAM slot: with H = n_kv_heads and k_tile, v_tile the encoded sizes of
// a [page_tokens, head_dim] tile in the page's K and V codecs,
//   K tile h (h < H)   at h * k_tile
//   V tile h (h < H)   at H * k_tile + h * v_tile
// H * (k_tile + v_tile) bytes in all, tiles packed without padding. An active page has the same
// layout in the active codec (f16 or f32, headerless row-major), so the first n rows of each of
// its tiles are a valid tile of n tokens.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>

#include "argus/cache.h"
#include "cache/cache_internal.h"
#include "core/buffer.h"
#include "core/checked.h"
#include "core/checksum.h"

namespace argus {

Status CacheGeometry::Validate() const {
  if (n_layers < 1 || n_q_heads < 1 || n_kv_heads < 1 || head_dim < 1) {
    return Status::InvalidArgument("cache geometry (" + ToString() +
                                   "): every count must be at least 1");
  }
  if (n_q_heads % n_kv_heads != 0) {
    return Status::InvalidArgument("cache geometry (" + ToString() +
                                   "): kv heads must divide q heads");
  }
  if (gqa() > kMaxGroupHeads) {
    return Status::InvalidArgument("cache geometry (" + ToString() + "): a GQA group of " +
                                   std::to_string(gqa()) + " query heads exceeds " +
                                   std::to_string(kMaxGroupHeads));
  }
  if (head_dim > kMaxTileDim) {
    return Status::InvalidArgument("cache geometry (" + ToString() + "): head_dim exceeds " +
                                   std::to_string(kMaxTileDim));
  }
  return Status::Ok();
}

std::string CacheGeometry::ToString() const {
  return std::to_string(n_layers) + " layers, " + std::to_string(n_q_heads) + " q heads, " +
         std::to_string(n_kv_heads) + " kv heads, head_dim " + std::to_string(head_dim);
}

Status KvCache::Impl::Init() {
  if (options.registry == nullptr) options.registry = &CodecRegistry::Default();
  // Never reallocated, so that TranscodePage may read entries while another call adds one.
  codecs.reserve(kMaxCodecs);
  ARGUS_RETURN_IF_ERROR(FindOrAddCodec(options.active_codec, CodecRole::kBoth).status());
  ARGUS_ASSIGN_OR_RETURN(k_codec, FindOrAddCodec(options.k_codec, CodecRole::kKeys));
  ARGUS_ASSIGN_OR_RETURN(v_codec, FindOrAddCodec(options.v_codec, CodecRole::kValues));
  active_is_f16 = codecs[kActiveCodec].spec == "f16";
  ARGUS_ASSIGN_OR_RETURN(active_row_bytes, codecs[kActiveCodec].codec->encoded_size({1, head_dim}));
  if (codecs[kActiveCodec].tile_bytes != size_t{page_tokens} * active_row_bytes) {
    return Status::InvalidArgument("active codec '" + options.active_codec +
                                   "' is not a headerless row-major format");
  }
  ARGUS_ASSIGN_OR_RETURN(size_t n_tile,
                         CheckedMul(size_t{page_tokens} * head_dim, sizeof(float), "tile scratch"));
  ARGUS_ASSIGN_OR_RETURN(size_t n_summary,
                         CheckedMul(SummaryFloats(), sizeof(float), "summary scratch"));
  ARGUS_ASSIGN_OR_RETURN(tile_scratch, AlignedBuffer::Allocate(n_tile));
  ARGUS_ASSIGN_OR_RETURN(row_scratch, AlignedBuffer::Allocate(size_t{head_dim} * sizeof(float)));
  ARGUS_ASSIGN_OR_RETURN(summary_scratch, AlignedBuffer::Allocate(n_summary));
  return Status::Ok();
}

// Codecs are looked up by canonical spec, so "q4_0" given twice is one table entry.
Result<uint16_t> KvCache::Impl::FindOrAddCodec(std::string_view text, CodecRole plane) {
  const std::string which = plane == CodecRole::kKeys     ? "k codec '"
                            : plane == CodecRole::kValues ? "v codec '"
                                                          : "active codec '";
  auto invalid = [&](const std::string& why) {
    return Status::InvalidArgument(which + std::string(text) + "': " + why);
  };
  auto parsed = CodecSpec::Parse(text);
  if (!parsed.ok()) return invalid(parsed.status().message());
  const std::string spec = parsed->ToString();
  auto found = std::find_if(codecs.begin(), codecs.end(),
                            [&](const CodecEntry& e) { return e.spec == spec; });
  size_t index = static_cast<size_t>(found - codecs.begin());
  if (found == codecs.end()) {
    if (codecs.size() == kMaxCodecs) return invalid("the cache's codec table is full");
    auto codec = options.registry->Create(*parsed);
    if (!codec.ok()) return invalid(codec.status().message());
    auto tile_bytes = (*codec)->encoded_size({page_tokens, head_dim});
    if (!tile_bytes.ok())
      return invalid("cannot hold a page tile: " + tile_bytes.status().message());
    codecs.push_back({spec, std::move(codec).value(), *tile_bytes});
  }
  const CodecRole role = codecs[index].codec->info().role;
  if ((static_cast<uint8_t>(role) & static_cast<uint8_t>(plane)) == 0) {
    return invalid(role == CodecRole::kKeys ? "a keys-only codec cannot hold values"
                                            : "a values-only codec cannot hold keys");
  }
  return static_cast<uint16_t>(index);
}

Result<const LayerPages*> KvCache::Impl::FindLayer(SeqId seq, uint32_t layer) const {
  auto it = sequences.find(seq);
  if (it == sequences.end()) {
    return Status::NotFound("sequence " + std::to_string(seq) + " does not exist");
  }
  if (layer >= options.geometry.n_layers) {
    return Status::InvalidArgument("layer " + std::to_string(layer) +
                                   " is out of range: the cache has " +
                                   std::to_string(options.geometry.n_layers) + " layers");
  }
  return &it->second.layers[layer];
}

Status KvCache::Impl::CheckRows(size_t n_new, std::string_view what) const {
  // Page ids are uint32_t and kNoPage is never one.
  if (n_new <= free_rows.size() + (size_t{kNoPage} - table.size())) return Status::Ok();
  return Status::ResourceExhausted("page table: " + std::string(what) + " needs " +
                                   std::to_string(n_new) + " more page ids than remain");
}

PageId KvCache::Impl::NewRow(PageState state, SeqId owner, uint32_t layer, uint32_t first_token,
                             uint32_t n_tokens, uint16_t k, uint16_t v, SlotId slot) {
  PageId page;
  if (!free_rows.empty()) {
    page = free_rows.back();
    free_rows.pop_back();
  } else {
    page = static_cast<PageId>(table.size());
    const size_t n = table.size() + 1;
    table.state.resize(n);
    table.owner.resize(n);
    table.layer.resize(n);
    table.first_token.resize(n);
    table.n_tokens.resize(n);
    table.k_codec.resize(n);
    table.v_codec.resize(n);
    table.tier.resize(n);
    table.slot.resize(n);
    table.disk_key.resize(n);
    table.n_bytes.resize(n);
    table.k_bytes.resize(n);
    table.checksum.resize(n);
    table.ref_count.resize(n);
    table.pin_count.resize(n);
    table.master_key.resize(n);
    table.master_checksum.resize(n);
    table.generation.resize(n);
    table.mass.resize(n);
    table.last_use.resize(n);
    table.key_bounds.resize(n * 2 * n_kv_heads * head_dim);
    table.key_norm_max.resize(n * n_kv_heads);
  }
  table.state[page] = state;
  table.owner[page] = owner;
  table.layer[page] = layer;
  table.first_token[page] = first_token;
  table.n_tokens[page] = n_tokens;
  table.tier[page] = TierKind::kRam;
  table.ref_count[page] = 1;
  SetSlot(page, slot, k, v);
  return page;
}

void KvCache::Impl::SetSlot(PageId page, SlotId slot, uint16_t k, uint16_t v) {
  table.slot[page] = slot;
  table.k_codec[page] = k;
  table.v_codec[page] = v;
  table.n_bytes[page] = ram.SlotBytes(slot);
  table.k_bytes[page] = KPlaneBytes(k);
  ++table.generation[page];
}

void KvCache::Impl::FreeRow(PageId page) {
  table.state[page] = PageState::kFree;
  table.owner[page] = 0;
  table.layer[page] = 0;
  table.first_token[page] = 0;
  table.n_tokens[page] = 0;
  table.k_codec[page] = table.v_codec[page] = 0;
  table.tier[page] = TierKind::kRam;
  table.slot[page] = SlotId{};
  table.disk_key[page] = PageKey{};
  table.n_bytes[page] = table.k_bytes[page] = 0;
  table.checksum[page] = 0;
  table.ref_count[page] = table.pin_count[page] = 0;
  table.master_key[page] = PageKey{};
  table.master_checksum[page] = 0;
  ++table.generation[page];
  table.mass[page] = 0;
  table.last_use[page] = 0;
  std::fill_n(Bounds(page), 2 * size_t{n_kv_heads} * head_dim, 0.0f);
  std::fill_n(Norms(page), n_kv_heads, 0.0f);
  free_rows.push_back(page);
}

void KvCache::Impl::ReleasePage(PageId page) {
  if (--table.ref_count[page] > 0) return;
  if (table.tier[page] == TierKind::kDisk) {
    released_disk_keys.push_back(table.disk_key[page]);
  } else {
    ram.Free(table.slot[page]);
    if (HasMaster(page)) released_disk_keys.push_back(table.master_key[page]);
  }
  FreeRow(page);
}

Status KvCache::Impl::Transcode(std::span<const std::byte> src, uint16_t src_k, uint16_t src_v,
                                std::span<std::byte> dst, uint16_t dst_k, uint16_t dst_v,
                                uint32_t n_rows, float* x) const {
  for (uint32_t plane = 0; plane < 2; ++plane) {
    const CodecEntry& from = codecs[plane == 0 ? src_k : src_v];
    const CodecEntry& to = codecs[plane == 0 ? dst_k : dst_v];
    const size_t from_base = plane == 0 ? 0 : KPlaneBytes(src_k);
    const size_t to_base = plane == 0 ? 0 : KPlaneBytes(dst_k);
    size_t out_bytes = to.tile_bytes;
    if (n_rows != page_tokens) {
      ARGUS_ASSIGN_OR_RETURN(out_bytes, to.codec->encoded_size({n_rows, head_dim}));
    }
    for (uint32_t h = 0; h < n_kv_heads; ++h) {
      ARGUS_RETURN_IF_ERROR(
          from.codec->decode(src.subspan(from_base + h * from.tile_bytes, from.tile_bytes),
                             {page_tokens, head_dim}, x));
      ARGUS_RETURN_IF_ERROR(to.codec->encode(x, {n_rows, head_dim},
                                             dst.subspan(to_base + h * to.tile_bytes, out_bytes)));
    }
  }
  return Status::Ok();
}

// The key summary of a full page, from its decoded keys: what attention reads.
Status KvCache::Impl::Summarize(std::span<const std::byte> page, uint16_t k, float* bounds,
                                float* norms, float* x) const {
  const CodecEntry& codec = codecs[k];
  for (uint32_t h = 0; h < n_kv_heads; ++h) {
    ARGUS_RETURN_IF_ERROR(codec.codec->decode(page.subspan(h * codec.tile_bytes, codec.tile_bytes),
                                              {page_tokens, head_dim}, x));
    float* lo = bounds + size_t{h} * head_dim;
    float* hi = bounds + (size_t{n_kv_heads} + h) * head_dim;
    std::copy_n(x, head_dim, lo);
    std::copy_n(x, head_dim, hi);
    double max_sq = 0;
    for (uint32_t t = 0; t < page_tokens; ++t) {
      const float* row = x + size_t{t} * head_dim;
      double sq = 0;
      for (uint32_t d = 0; d < head_dim; ++d) {
        lo[d] = std::min(lo[d], row[d]);
        hi[d] = std::max(hi[d], row[d]);
        sq += double{row[d]} * row[d];
      }
      max_sq = std::max(max_sq, sq);
    }
    norms[h] = RoundUp(std::sqrt(max_sq));
  }
  return Status::Ok();
}

Status KvCache::Impl::Reencode(PageId page, std::string_view k_spec, std::string_view v_spec) {
  const size_t n_codecs = codecs.size();
  Status status = ReencodeBody(page, k_spec, v_spec);
  // Codecs this call added to the table are used by no page.
  if (!status.ok()) codecs.erase(codecs.begin() + static_cast<ptrdiff_t>(n_codecs), codecs.end());
  return status;
}

Status KvCache::Impl::ReencodeBody(PageId page, std::string_view k_spec, std::string_view v_spec) {
  if (page >= table.size() || table.state[page] != PageState::kFull) {
    return Status::InvalidArgument("re-encode: page " + std::to_string(page) +
                                   " is not a full page");
  }
  if (table.tier[page] != TierKind::kRam) {
    return Status::Unsupported("re-encode: page " + std::to_string(page) +
                               " is on disk; move it to RAM first");
  }
  ARGUS_ASSIGN_OR_RETURN(uint16_t k, FindOrAddCodec(k_spec, CodecRole::kKeys));
  ARGUS_ASSIGN_OR_RETURN(uint16_t v, FindOrAddCodec(v_spec, CodecRole::kValues));
  // Decoding and encoding again would only add error.
  if (k == table.k_codec[page] && v == table.v_codec[page]) return Status::Ok();
  const std::string what = "re-encoding page " + std::to_string(page) + " to k " + codecs[k].spec +
                           ", v " + codecs[v].spec;
  const SlotId old = table.slot[page];
  ARGUS_ASSIGN_OR_RETURN(SlotId slot, ram.AllocateReplacing(old, PageBytes(k, v), what));
  Pending pending(*this);
  pending.Hold(slot);
  ARGUS_RETURN_IF_ERROR(Transcode(ram.Bytes(old), table.k_codec[page], table.v_codec[page],
                                  ram.Bytes(slot), k, v, page_tokens, TileScratch()));
  float* summary = summary_scratch.as<float>();
  ARGUS_RETURN_IF_ERROR(Summarize(ram.Bytes(slot), k, summary,
                                  summary + 2 * size_t{n_kv_heads} * head_dim, TileScratch()));
  SetSummary(page, summary, /*keep_old=*/HasMaster(page));
  ram.Free(old);
  SetSlot(page, slot, k, v);
  table.checksum[page] = Checksum64(ram.Bytes(slot));
  pending.Commit();
  return Status::Ok();
}

PageView KvCache::Impl::View(PageId page) const {
  PageView view;
  view.id = page;
  view.first_token = table.first_token[page];
  view.n_tokens = table.n_tokens[page];
  view.k_codec = codecs[table.k_codec[page]].codec.get();
  view.v_codec = codecs[table.v_codec[page]].codec.get();
  view.tier = table.tier[page];
  view.n_bytes = table.n_bytes[page];
  if (view.tier == TierKind::kDisk) {
    view.disk_key = table.disk_key[page];
  } else {
    view.bytes = ram.Bytes(table.slot[page]).data();
  }
  view.k_stride = table.k_bytes[page] / n_kv_heads;
  view.v_offset = table.k_bytes[page];
  view.v_stride = (table.n_bytes[page] - table.k_bytes[page]) / n_kv_heads;
  if (table.state[page] == PageState::kFull) {
    view.k_tile_bytes = view.k_stride;
    view.v_tile_bytes = view.v_stride;
    const float* bounds = table.key_bounds.data() + size_t{page} * 2 * n_kv_heads * head_dim;
    view.key_min = bounds;
    view.key_max = bounds + size_t{n_kv_heads} * head_dim;
    view.key_norm_max = table.key_norm_max.data() + size_t{page} * n_kv_heads;
  } else {
    view.k_tile_bytes = view.v_tile_bytes = size_t{view.n_tokens} * active_row_bytes;
  }
  return view;
}

// Approximate but honest: vector capacities and the hash map's nodes and buckets.
size_t KvCache::Impl::MetadataBytes() const {
  size_t n = CapacityBytes(table.state) + CapacityBytes(table.owner) + CapacityBytes(table.layer) +
             CapacityBytes(table.first_token) + CapacityBytes(table.n_tokens) +
             CapacityBytes(table.k_codec) + CapacityBytes(table.v_codec) +
             CapacityBytes(table.tier) + CapacityBytes(table.slot) + CapacityBytes(table.disk_key) +
             CapacityBytes(table.n_bytes) + CapacityBytes(table.k_bytes) +
             CapacityBytes(table.checksum) + CapacityBytes(table.ref_count) +
             CapacityBytes(table.pin_count) + CapacityBytes(table.master_key) +
             CapacityBytes(table.master_checksum) + CapacityBytes(table.generation) +
             CapacityBytes(table.mass) + CapacityBytes(table.last_use) +
             CapacityBytes(table.key_bounds) + CapacityBytes(table.key_norm_max) +
             CapacityBytes(free_rows) + codecs.size() * sizeof(CodecEntry);
  n += sequences.bucket_count() * sizeof(void*);
  for (const auto& [id, s] : sequences) {
    n += sizeof(std::pair<const SeqId, Sequence>) + sizeof(void*) + CapacityBytes(s.layers);
    for (const LayerPages& lp : s.layers) n += CapacityBytes(lp.pages);
  }
  return n;
}

// ---- KvCache ---------------------------------------------------------------------------------

Result<std::unique_ptr<KvCache>> KvCache::Create(const CacheOptions& options) {
  ARGUS_RETURN_IF_ERROR(options.geometry.Validate());
  if (options.page_tokens < 1 || options.page_tokens > kMaxPageTokens ||
      !std::has_single_bit(options.page_tokens)) {
    return Status::InvalidArgument("page_tokens " + std::to_string(options.page_tokens) +
                                   " must be a power of two in [1, " +
                                   std::to_string(kMaxPageTokens) + "]");
  }
  if (options.ram_budget_bytes == 0) {
    return Status::InvalidArgument("ram_budget_bytes must be above 0");
  }
  if (options.active_codec != "f16" && options.active_codec != "f32") {
    return Status::InvalidArgument("active codec '" + options.active_codec +
                                   "' must be f16 or f32");
  }
  auto impl = std::make_unique<Impl>(options);
  ARGUS_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<KvCache>(new KvCache(std::move(impl)));
}

Result<size_t> KvCache::RequiredRamBytes(const CacheOptions& options, uint32_t n_tokens) {
  CacheOptions sizing = options;
  sizing.ram_budget_bytes = 1;  // validated and never used: nothing is stored
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, Create(sizing));
  const Impl& impl = *cache->impl_;
  const uint32_t n_full = n_tokens / impl.page_tokens;
  const size_t full = impl.PageBytes(impl.k_codec, impl.v_codec), active = impl.ActivePageBytes();
  const std::string what = "RAM bytes of " + std::to_string(n_tokens) + " tokens";
  ARGUS_ASSIGN_OR_RETURN(size_t layer_bytes, CheckedMul(n_full, full, what));
  // The peak is now (full pages and the active page) or, on a page boundary, just before the
  // last page filled (one full page fewer, the active page instead).
  size_t extra = n_tokens % impl.page_tokens != 0 ? active
                 : n_full > 0 && active > full    ? active - full
                                                  : 0;
  ARGUS_ASSIGN_OR_RETURN(layer_bytes, CheckedAdd(layer_bytes, extra, what));
  return CheckedMul(layer_bytes, options.geometry.n_layers, what);
}

KvCache::KvCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvCache::~KvCache() = default;

const CacheOptions& KvCache::options() const { return impl_->options; }
const CacheGeometry& KvCache::geometry() const { return impl_->options.geometry; }
uint32_t KvCache::page_tokens() const { return impl_->page_tokens; }

Result<SeqId> KvCache::CreateSequence() {
  if (impl_->next_seq == UINT32_MAX) return Status::ResourceExhausted("sequence ids are used up");
  Sequence s;
  s.layers.resize(impl_->options.geometry.n_layers);
  impl_->sequences.emplace(impl_->next_seq, std::move(s));
  return impl_->next_seq++;
}

Status KvCache::Append(SeqId seq, uint32_t layer, std::span<const float> k,
                       std::span<const float> v) {
  return impl_->Append(seq, layer, k, v);
}

Status KvCache::AppendF16(SeqId seq, uint32_t layer, std::span<const uint16_t> k,
                          std::span<const uint16_t> v) {
  return impl_->Append(seq, layer, k, v);
}

Status KvCache::Crop(SeqId seq, uint32_t n_tokens) { return impl_->Crop(seq, n_tokens); }

Result<SeqId> KvCache::Fork(SeqId seq) { return impl_->Fork(seq); }

Status KvCache::Release(SeqId seq) {
  auto it = impl_->sequences.find(seq);
  if (it == impl_->sequences.end()) {
    return Status::NotFound("sequence " + std::to_string(seq) + " does not exist");
  }
  Impl::ErasesAtExit erases{*impl_};
  for (const LayerPages& lp : it->second.layers) {
    for (PageId page : lp.pages) impl_->ReleasePage(page);
  }
  impl_->sequences.erase(it);
  return Status::Ok();
}

Result<uint32_t> KvCache::Length(SeqId seq, uint32_t layer) const {
  ARGUS_ASSIGN_OR_RETURN(const LayerPages* lp, impl_->FindLayer(seq, layer));
  return lp->n_tokens;
}

Result<std::vector<PageView>> KvCache::Pages(SeqId seq, uint32_t layer) const {
  ARGUS_ASSIGN_OR_RETURN(const LayerPages* lp, impl_->FindLayer(seq, layer));
  std::vector<PageView> views;
  views.reserve(lp->pages.size());
  for (PageId page : lp->pages) views.push_back(impl_->View(page));
  return views;
}

Status KvCache::Reencode(PageId page, std::string_view k_codec, std::string_view v_codec) {
  return impl_->Reencode(page, k_codec, v_codec);
}

CacheStats KvCache::stats() const {
  const Impl& impl = *impl_;
  const PageTable& table = impl.table;
  CacheStats s;
  s.n_sequences = impl.sequences.size();
  std::vector<CodecBytes> per_codec(impl.codecs.size());
  for (PageId page = 0; page < table.size(); ++page) {
    if (table.state[page] == PageState::kFree) continue;
    ++s.n_pages;
    ++(table.state[page] == PageState::kFull ? s.n_full_pages : s.n_active_pages);
    s.page_bytes += table.n_bytes[page];
    if (table.tier[page] == TierKind::kDisk) {
      ++s.n_disk_pages;
      s.disk_page_bytes += table.n_bytes[page];
    } else {
      ++s.n_ram_pages;
      s.ram_page_bytes += table.n_bytes[page];
    }
    const bool on_disk = table.tier[page] == TierKind::kDisk;
    CodecBytes& k = per_codec[table.k_codec[page]];
    k.k_bytes += table.k_bytes[page];
    if (on_disk) k.k_disk_bytes += table.k_bytes[page];
    ++k.n_k_pages;
    CodecBytes& v = per_codec[table.v_codec[page]];
    v.v_bytes += table.n_bytes[page] - table.k_bytes[page];
    if (on_disk) v.v_disk_bytes += table.n_bytes[page] - table.k_bytes[page];
    ++v.n_v_pages;
  }
  for (size_t i = 0; i < per_codec.size(); ++i) {
    if (per_codec[i].n_k_pages + per_codec[i].n_v_pages == 0) continue;
    per_codec[i].codec = impl.codecs[i].spec;
    s.by_codec.push_back(std::move(per_codec[i]));
  }
  s.metadata_bytes = impl.MetadataBytes();
  s.ram = impl.ram.stats();
  s.n_disk_erase_failures = impl.n_disk_erase_failures;
  if (impl.options.disk != nullptr) {
    s.has_disk = true;
    s.disk = impl.options.disk->stats();
  }
  return s;
}

}  // namespace argus
