// A sequence's pages: appends (planned, all or nothing), crops and copy-on-write forks.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "argus/cache.h"
#include "cache/cache_internal.h"
#include "core/checked.h"
#include "core/checksum.h"

namespace argus {

template <typename T>
Status KvCache::Impl::CheckValues(std::span<const T> x, const char* plane, SeqId seq,
                                  uint32_t layer) const {
  // One branch-free pass over the bits (it vectorises); the scan below only names a bad value.
  // A float is storable when its magnitude's bits are below those of the first magnitude that
  // is not (Inf, or f16's overflow threshold); NaN bits lie above Inf's.
  const uint32_t limit = std::bit_cast<uint32_t>(active_is_f16 ? kHalfOverflow : INFINITY);
  auto storable = [&](T value) {
    if constexpr (std::is_same_v<T, float>) {
      return (std::bit_cast<uint32_t>(value) & 0x7fffffffu) < limit;
    } else {
      return (value & 0x7c00) != 0x7c00;
    }
  };
  size_t n_bad = 0;
  for (T value : x) n_bad += storable(value) ? 0 : 1;
  if (n_bad == 0) return Status::Ok();
  const size_t i = static_cast<size_t>(std::find_if_not(x.begin(), x.end(), storable) - x.begin());
  const size_t row = size_t{n_kv_heads} * head_dim;
  const float value = AsFloat(x[i]);
  return Status::InvalidArgument(
      SeqLayer(seq, layer) + ": " + plane + " value " + std::to_string(value) + " at token " +
      std::to_string(i / row) + ", head " + std::to_string(i % row / head_dim) + ", channel " +
      std::to_string(i % head_dim) +
      (std::isfinite(value) ? " overflows the active codec f16" : " is not finite"));
}

// Writes tokens token0 .. token0 + n_rows - 1 of k, v ([n_tokens, n_kv_heads, head_dim]) as
// rows row0 .. of every tile of an active-codec page.
template <typename T>
Status KvCache::Impl::WriteRows(std::span<std::byte> page, uint32_t row0, uint32_t n_rows,
                                std::span<const T> k, std::span<const T> v, size_t token0) {
  const CodecEntry& active = codecs[kActiveCodec];
  float* converted = row_scratch.as<float>();
  for (uint32_t plane = 0; plane < 2; ++plane) {
    const T* src = (plane == 0 ? k : v).data();
    for (uint32_t t = 0; t < n_rows; ++t) {
      for (uint32_t h = 0; h < n_kv_heads; ++h) {
        const T* in = src + ((token0 + t) * n_kv_heads + h) * head_dim;
        const float* row;
        if constexpr (std::is_same_v<T, float>) {
          row = in;
        } else {
          for (uint32_t d = 0; d < head_dim; ++d) converted[d] = AsFloat(in[d]);
          row = converted;
        }
        const size_t offset = (size_t{plane} * n_kv_heads + h) * active.tile_bytes +
                              size_t{row0 + t} * active_row_bytes;
        ARGUS_RETURN_IF_ERROR(
            active.codec->encode(row, {1, head_dim}, page.subspan(offset, active_row_bytes)));
      }
    }
  }
  return Status::Ok();
}

// Decodes every tile of `src` (codecs src_k, src_v) and encodes its first n_rows rows into the
// tiles of `dst` (codecs dst_k, dst_v). n_rows < page_tokens only into the active codec.
std::string KvCache::Impl::AppendName(SeqId seq, uint32_t layer, size_t n_tokens) {
  return "append of " + std::to_string(n_tokens) + " tokens to " + SeqLayer(seq, layer);
}

// Rows into the active page (which may fill), whole new pages, a new active page.
Result<KvCache::Impl::AppendPlan> KvCache::Impl::PlanAppend(const LayerPages& lp, size_t n_tokens,
                                                            std::string_view what) const {
  AppendPlan plan;
  plan.active = ActivePage(lp);
  const uint32_t room = plan.active == kNoPage ? 0 : page_tokens - table.n_tokens[plan.active];
  plan.n_into_active = static_cast<uint32_t>(std::min<size_t>(n_tokens, room));
  plan.active_fills = plan.active != kNoPage && plan.n_into_active == room;
  plan.n_new_full = (n_tokens - plan.n_into_active) / page_tokens;
  plan.n_tail = static_cast<uint32_t>((n_tokens - plan.n_into_active) % page_tokens);
  plan.n_new_pages = plan.n_new_full + (plan.n_tail > 0 ? 1 : 0);
  // Full pages keep the active page's bytes when their codecs are the active codec.
  plan.in_place = k_codec == kActiveCodec && v_codec == kActiveCodec;
  plan.replaced = plan.active_fills && !plan.in_place ? table.slot[plan.active] : SlotId{};
  plan.full_bytes = PageBytes(k_codec, v_codec);
  plan.active_bytes = ActivePageBytes();
  ARGUS_ASSIGN_OR_RETURN(
      plan.add_bytes,
      CheckedMul(plan.n_new_full + (plan.replaced.valid() ? 1 : 0), plan.full_bytes, what));
  ARGUS_ASSIGN_OR_RETURN(plan.add_bytes,
                         CheckedAdd(plan.add_bytes, plan.n_tail > 0 ? plan.active_bytes : 0, what));
  plan.release_bytes = plan.replaced.valid() ? plan.active_bytes : 0;
  return plan;
}

// All or nothing: the whole append's bytes are checked against the budget and every slot is
// taken before anything visible changes; the active page is written in place only beyond its
// token count, which is raised last.
template <typename T>
Status KvCache::Impl::Append(SeqId seq, uint32_t layer, std::span<const T> k,
                             std::span<const T> v) {
  ARGUS_ASSIGN_OR_RETURN(LayerPages * lp, FindLayer(seq, layer));
  const size_t row_values = size_t{n_kv_heads} * head_dim;
  if (k.empty() || k.size() != v.size() || k.size() % row_values != 0) {
    return Status::InvalidArgument(SeqLayer(seq, layer) + ": k and v must each hold [n_tokens, " +
                                   std::to_string(n_kv_heads) + ", " + std::to_string(head_dim) +
                                   "] values with n_tokens >= 1, got " + std::to_string(k.size()) +
                                   " and " + std::to_string(v.size()));
  }
  const size_t n_tokens = k.size() / row_values;
  if (n_tokens > UINT32_MAX - lp->n_tokens) {
    return Status::InvalidArgument(SeqLayer(seq, layer) + ": " + std::to_string(n_tokens) +
                                   " more tokens overflow the 32-bit token count");
  }
  ARGUS_RETURN_IF_ERROR(CheckValues(k, "k", seq, layer));
  ARGUS_RETURN_IF_ERROR(CheckValues(v, "v", seq, layer));

  const std::string what = AppendName(seq, layer, n_tokens);
  ARGUS_ASSIGN_OR_RETURN(const AppendPlan plan, PlanAppend(*lp, n_tokens, what));
  ARGUS_RETURN_IF_ERROR(ram.CheckFits(plan.add_bytes, plan.release_bytes, what));
  ARGUS_RETURN_IF_ERROR(CheckRows(plan.n_new_pages, what));
  if (plan.n_new_full > 0 && !plan.in_place && stage_scratch.size() == 0) {
    ARGUS_ASSIGN_OR_RETURN(stage_scratch, AlignedBuffer::Allocate(plan.active_bytes));
  }

  Pending pending(*this);
  // The replaced active slot is freed at the commit, so allocations until then are checked as if
  // it were free already.
  auto allocate = [&](size_t n_bytes) {
    return plan.replaced.valid() ? ram.AllocateReplacing(plan.replaced, n_bytes, what)
                                 : ram.Allocate(n_bytes, what);
  };
  size_t token = 0;
  SlotId filled = plan.active_fills ? table.slot[plan.active] : SlotId{};
  if (plan.active != kNoPage) {
    ARGUS_RETURN_IF_ERROR(WriteRows(ram.Bytes(table.slot[plan.active]), table.n_tokens[plan.active],
                                    plan.n_into_active, k, v, 0));
    token = plan.n_into_active;
    if (plan.replaced.valid()) {
      ARGUS_ASSIGN_OR_RETURN(filled, allocate(plan.full_bytes));
      pending.Hold(filled);
      ARGUS_RETURN_IF_ERROR(Transcode(ram.Bytes(plan.replaced), kActiveCodec, kActiveCodec,
                                      ram.Bytes(filled), k_codec, v_codec, page_tokens,
                                      TileScratch()));
    }
    // An active page's summary columns are unused, so they may be written before the commit.
    if (plan.active_fills) {
      ARGUS_RETURN_IF_ERROR(Summarize(ram.Bytes(filled), k_codec, Bounds(plan.active),
                                      Norms(plan.active), TileScratch()));
    }
  }
  std::vector<PageId> new_pages;
  new_pages.reserve(plan.n_new_pages);
  for (size_t i = 0; i < plan.n_new_pages; ++i) {
    const bool full = i < plan.n_new_full;
    const uint32_t n_rows = full ? page_tokens : plan.n_tail;
    ARGUS_ASSIGN_OR_RETURN(SlotId slot, allocate(full ? plan.full_bytes : plan.active_bytes));
    pending.Hold(slot);
    if (full && !plan.in_place) {
      // Staged in the active codec, so the page holds what token-by-token appends would give.
      ARGUS_RETURN_IF_ERROR(WriteRows(stage_scratch.span(), 0, page_tokens, k, v, token));
      ARGUS_RETURN_IF_ERROR(Transcode(stage_scratch.span(), kActiveCodec, kActiveCodec,
                                      ram.Bytes(slot), k_codec, v_codec, page_tokens,
                                      TileScratch()));
    } else {
      ARGUS_RETURN_IF_ERROR(WriteRows(ram.Bytes(slot), 0, n_rows, k, v, token));
    }
    const PageId page =
        pending.HoldRow(NewRow(full ? PageState::kFull : PageState::kActive, seq, layer,
                               static_cast<uint32_t>(lp->n_tokens + token), n_rows,
                               full ? k_codec : kActiveCodec, full ? v_codec : kActiveCodec, slot));
    if (full) {
      ARGUS_RETURN_IF_ERROR(
          Summarize(ram.Bytes(slot), k_codec, Bounds(page), Norms(page), TileScratch()));
      table.checksum[page] = Checksum64(ram.Bytes(slot));
    }
    new_pages.push_back(page);
    token += n_rows;
  }

  // Commit: nothing below can fail.
  if (plan.active_fills) {
    if (plan.replaced.valid()) {
      ram.Free(plan.replaced);
      SetSlot(plan.active, filled, k_codec, v_codec);
    }
    table.state[plan.active] = PageState::kFull;
    table.n_tokens[plan.active] = page_tokens;
    table.checksum[plan.active] = Checksum64(ram.Bytes(filled));
  } else if (plan.active != kNoPage) {
    table.n_tokens[plan.active] += plan.n_into_active;
  }
  lp->pages.insert(lp->pages.end(), new_pages.begin(), new_pages.end());
  lp->n_tokens += static_cast<uint32_t>(n_tokens);
  pending.Commit();
  return Status::Ok();
}

// Pages wholly beyond n_tokens are released first, then each cut full page becomes an active
// page of its first rows, those that free the most bytes first: the bytes in use never exceed
// max(before, after), and after was checked against the budget before anything changed. Only a
// failing slab allocation (the machine out of memory) can stop it part-way, with some layers
// cropped and every layer consistent.
Status KvCache::Impl::Crop(SeqId seq, uint32_t n_tokens) {
  ErasesAtExit erases{*this};
  auto it = sequences.find(seq);
  if (it == sequences.end()) {
    return Status::NotFound("sequence " + std::to_string(seq) + " does not exist");
  }
  Sequence& s = it->second;
  const std::string what =
      "crop of sequence " + std::to_string(seq) + " to " + std::to_string(n_tokens) + " tokens";
  struct Cut {
    uint32_t layer;
    PageId page;
    size_t freed_bytes;  // when its last reference goes
  };
  std::vector<Cut> cuts;
  size_t add = 0, release = 0;
  for (uint32_t l = 0; l < s.layers.size(); ++l) {
    if (n_tokens > s.layers[l].n_tokens) {
      return Status::InvalidArgument(what + ": layer " + std::to_string(l) + " has only " +
                                     std::to_string(s.layers[l].n_tokens));
    }
    for (PageId page : s.layers[l].pages) {
      const uint32_t first = table.first_token[page], end = first + table.n_tokens[page];
      const bool in_ram = table.tier[page] == TierKind::kRam;
      const size_t freed = table.ref_count[page] == 1 && in_ram ? table.n_bytes[page] : 0;
      if (first >= n_tokens) {
        release += freed;
      } else if (end > n_tokens && table.state[page] == PageState::kFull) {
        cuts.push_back({l, page, freed});
        add += ActivePageBytes();
        release += freed;
      }
    }
  }
  ARGUS_RETURN_IF_ERROR(ram.CheckFits(add, release, what));
  ARGUS_RETURN_IF_ERROR(CheckRows(cuts.size(), what));

  for (LayerPages& lp : s.layers) {
    while (!lp.pages.empty() && table.first_token[lp.pages.back()] >= n_tokens) {
      ReleasePage(lp.pages.back());
      lp.pages.pop_back();
    }
    if (lp.pages.empty()) {
      lp.n_tokens = 0;
      continue;
    }
    const PageId last = lp.pages.back();
    // An active page is never shared: cutting it only lowers its token count.
    if (table.state[last] == PageState::kActive) {
      table.n_tokens[last] = std::min(table.n_tokens[last], n_tokens - table.first_token[last]);
    }
    lp.n_tokens = table.first_token[last] + table.n_tokens[last];
  }
  std::sort(cuts.begin(), cuts.end(),
            [](const Cut& a, const Cut& b) { return a.freed_bytes > b.freed_bytes; });
  for (const Cut& cut : cuts) {
    const PageId old = cut.page;
    const SlotId old_slot = table.slot[old];  // invalid on disk, where freed_bytes is 0
    ARGUS_ASSIGN_OR_RETURN(
        SlotId slot, cut.freed_bytes > 0 ? ram.AllocateReplacing(old_slot, ActivePageBytes(), what)
                                         : ram.Allocate(ActivePageBytes(), what));
    const uint32_t first = table.first_token[old], n_rows = n_tokens - first;
    auto old_bytes = PageBytesAnywhere(old);
    Status status = old_bytes.status();
    if (status.ok()) {
      status = Transcode(*old_bytes, table.k_codec[old], table.v_codec[old], ram.Bytes(slot),
                         kActiveCodec, kActiveCodec, n_rows, TileScratch());
    }
    if (!status.ok()) {
      ram.Free(slot);
      return status;
    }
    LayerPages& lp = s.layers[cut.layer];
    lp.pages.back() =
        NewRow(PageState::kActive, seq, cut.layer, first, n_rows, kActiveCodec, kActiveCodec, slot);
    lp.n_tokens = n_tokens;
    ReleasePage(old);
  }
  return Status::Ok();
}

Result<SeqId> KvCache::Impl::Fork(SeqId seq) {
  auto it = sequences.find(seq);
  if (it == sequences.end()) {
    return Status::NotFound("sequence " + std::to_string(seq) + " does not exist");
  }
  if (next_seq == UINT32_MAX) return Status::ResourceExhausted("sequence ids are used up");
  const std::string what = "fork of sequence " + std::to_string(seq);
  Sequence child = it->second;
  size_t n_active = 0;
  for (const LayerPages& lp : child.layers) n_active += ActivePage(lp) != kNoPage ? 1 : 0;
  ARGUS_RETURN_IF_ERROR(ram.CheckFits(n_active * ActivePageBytes(), 0, what));
  ARGUS_RETURN_IF_ERROR(CheckRows(n_active, what));

  const SeqId id = next_seq;
  Pending pending(*this);
  for (uint32_t l = 0; l < child.layers.size(); ++l) {
    const PageId active = ActivePage(child.layers[l]);
    if (active == kNoPage) continue;
    ARGUS_ASSIGN_OR_RETURN(SlotId slot, ram.Allocate(ActivePageBytes(), what));
    pending.Hold(slot);
    std::span<const std::byte> from = ram.Bytes(table.slot[active]);
    std::copy(from.begin(), from.end(), ram.Bytes(slot).begin());
    child.layers[l].pages.back() =
        pending.HoldRow(NewRow(PageState::kActive, id, l, table.first_token[active],
                               table.n_tokens[active], kActiveCodec, kActiveCodec, slot));
  }
  for (const LayerPages& lp : child.layers) {
    for (PageId page : lp.pages) {
      if (table.state[page] == PageState::kFull) ++table.ref_count[page];
    }
  }
  sequences.emplace(id, std::move(child));
  ++next_seq;
  pending.Commit();
  return id;
}

template Status KvCache::Impl::Append<float>(SeqId, uint32_t, std::span<const float>,
                                             std::span<const float>);
template Status KvCache::Impl::Append<uint16_t>(SeqId, uint32_t, std::span<const uint16_t>,
                                                std::span<const uint16_t>);

}  // namespace argus
