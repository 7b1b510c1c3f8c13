// The cache's use of the disk tier: moving pages between tiers, saving and restoring sequences,
// and prefix pages keyed by a hash chain.
//
// A saved sequence is a named record in the store (a manifest, format below) plus one stored
// page per page of the sequence, keyed by a hash of the save's name, a save serial and the
// page's index: a new save of the same name writes new keys, publishes its manifest, and only
// then erases the old pages, so a crash leaves the old save or the new one.
//
// Manifest, little-endian: "ARGUSSQ1", u32 n_layers, n_q_heads, n_kv_heads, head_dim,
// page_tokens, str active codec, u64 serial, then per layer u32 n_tokens, u32 n_pages and per
// page u64 key.hi, u64 key.lo, u32 first_token, u32 n_tokens, u8 state (1 active, 2 full),
// str k codec, str v codec, u64 XXH3 of the page bytes. A str is u16 length then bytes.
#include <chrono>
#include <cstring>
#include <deque>
#include <random>

#include "argus/cache.h"
#include "argus/store.h"
#include "cache/cache_internal.h"
#include "core/buffer.h"
#include "core/byte_codec.h"
#include "core/checked.h"
#include "core/checksum.h"

namespace argus {
namespace {

constexpr char kManifestMagic[8] = {'A', 'R', 'G', 'U', 'S', 'S', 'Q', '1'};
constexpr size_t kMaxSaveNameBytes = 200;

constexpr size_t kSaveBatchPages = 64;

// Erases the keys that are stored: a best-effort cleanup (a key lost at open, or erased
// already, must not keep the others).
Status EraseStored(DiskTier& disk, std::vector<PageKey> keys) {
  std::erase_if(keys, [&](const PageKey& key) { return !disk.Contains(key); });
  return keys.empty() ? Status::Ok() : disk.Erase(keys);
}

std::string SaveRecordName(std::string_view name) { return "seq:" + std::string(name); }

struct ManifestPage {
  PageKey key;
  uint32_t first_token = 0, n_tokens = 0;
  PageState state = PageState::kFull;
  std::string k_codec, v_codec;
  uint64_t checksum = 0;
};

struct Manifest {
  CacheGeometry geometry;
  uint32_t page_tokens = 0;
  std::string active_codec;
  uint64_t serial = 0;
  std::vector<uint32_t> layer_tokens;
  std::vector<std::vector<ManifestPage>> layers;
};

std::vector<std::byte> EncodeManifest(const Manifest& m) {
  ByteWriter w;
  for (char c : kManifestMagic) w.Put(c);
  w.Put(m.geometry.n_layers);
  w.Put(m.geometry.n_q_heads);
  w.Put(m.geometry.n_kv_heads);
  w.Put(m.geometry.head_dim);
  w.Put(m.page_tokens);
  w.PutString(m.active_codec);
  w.Put(m.serial);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    w.Put(m.layer_tokens[l]);
    w.Put(static_cast<uint32_t>(m.layers[l].size()));
    for (const ManifestPage& p : m.layers[l]) {
      w.Put(p.key.hi);
      w.Put(p.key.lo);
      w.Put(p.first_token);
      w.Put(p.n_tokens);
      w.Put(static_cast<uint8_t>(p.state));
      w.PutString(p.k_codec);
      w.PutString(p.v_codec);
      w.Put(p.checksum);
    }
  }
  return std::move(w.bytes());
}

Result<Manifest> DecodeManifest(std::span<const std::byte> bytes, std::string_view name) {
  ByteReader r(bytes, "saved sequence '" + std::string(name) + "'");
  Manifest m;
  for (char c : kManifestMagic) {
    ARGUS_ASSIGN_OR_RETURN(char got, r.Get<char>("magic"));
    if (got != c) return r.Corrupt("bad magic");
  }
  ARGUS_ASSIGN_OR_RETURN(m.geometry.n_layers, r.Get<uint32_t>("n_layers"));
  ARGUS_ASSIGN_OR_RETURN(m.geometry.n_q_heads, r.Get<uint32_t>("n_q_heads"));
  ARGUS_ASSIGN_OR_RETURN(m.geometry.n_kv_heads, r.Get<uint32_t>("n_kv_heads"));
  ARGUS_ASSIGN_OR_RETURN(m.geometry.head_dim, r.Get<uint32_t>("head_dim"));
  ARGUS_ASSIGN_OR_RETURN(m.page_tokens, r.Get<uint32_t>("page_tokens"));
  ARGUS_ASSIGN_OR_RETURN(m.active_codec, r.GetString("active codec"));
  ARGUS_ASSIGN_OR_RETURN(m.serial, r.Get<uint64_t>("serial"));
  if (!m.geometry.Validate().ok()) return r.Corrupt("invalid geometry");
  if (m.page_tokens == 0) return r.Corrupt("page_tokens 0");
  // Each layer takes at least 8 bytes: the count cannot exceed what remains.
  if (m.geometry.n_layers > r.remaining() / 8) return r.Corrupt("layer count beyond the record");
  m.layers.resize(m.geometry.n_layers);
  m.layer_tokens.resize(m.geometry.n_layers);
  for (uint32_t l = 0; l < m.geometry.n_layers; ++l) {
    ARGUS_ASSIGN_OR_RETURN(m.layer_tokens[l], r.Get<uint32_t>("layer tokens"));
    ARGUS_ASSIGN_OR_RETURN(uint32_t n_pages, r.Get<uint32_t>("layer pages"));
    // Each page takes at least 41 bytes: the count cannot exceed what remains.
    if (n_pages > r.remaining() / 41) return r.Corrupt("page count beyond the record");
    uint64_t expected_first = 0;
    for (uint32_t i = 0; i < n_pages; ++i) {
      ManifestPage p;
      ARGUS_ASSIGN_OR_RETURN(p.key.hi, r.Get<uint64_t>("key"));
      ARGUS_ASSIGN_OR_RETURN(p.key.lo, r.Get<uint64_t>("key"));
      ARGUS_ASSIGN_OR_RETURN(p.first_token, r.Get<uint32_t>("first token"));
      ARGUS_ASSIGN_OR_RETURN(p.n_tokens, r.Get<uint32_t>("page tokens"));
      ARGUS_ASSIGN_OR_RETURN(uint8_t state, r.Get<uint8_t>("state"));
      ARGUS_ASSIGN_OR_RETURN(p.k_codec, r.GetString("k codec"));
      ARGUS_ASSIGN_OR_RETURN(p.v_codec, r.GetString("v codec"));
      ARGUS_ASSIGN_OR_RETURN(p.checksum, r.Get<uint64_t>("checksum"));
      const bool last = i + 1 == n_pages;
      if (state != 1 && state != 2) return r.Corrupt("bad page state");
      p.state = static_cast<PageState>(state);
      if (p.first_token != expected_first || p.n_tokens == 0 || p.n_tokens > m.page_tokens ||
          (p.state == PageState::kFull && p.n_tokens != m.page_tokens) ||
          (p.state == PageState::kActive && !last)) {
        return r.Corrupt("page " + std::to_string(i) + " of layer " + std::to_string(l) +
                         " does not continue the layer");
      }
      expected_first += p.n_tokens;
      m.layers[l].push_back(std::move(p));
    }
    if (expected_first != m.layer_tokens[l]) return r.Corrupt("layer token count mismatch");
  }
  if (!r.done()) return r.Corrupt("trailing bytes");
  return m;
}

std::vector<PageKey> ManifestKeys(const Manifest& m) {
  std::vector<PageKey> keys;
  for (const auto& layer : m.layers)
    for (const ManifestPage& p : layer) keys.push_back(p.key);
  return keys;
}

PageKey HashKey(std::span<const std::byte> bytes) {
  const Hash128 h = Checksum128(bytes);
  return {h.hi, h.lo};
}

std::string Tag(std::string_view k, std::string_view v) {
  return std::string(k) + "/" + std::string(v);
}

}  // namespace

void KvCache::Impl::EraseReleasedDiskPages() {
  if (released_disk_keys.empty()) return;
  // The pages' bytes are gone from the cache either way; a store that refuses the erase has
  // failed, and the count tells the user their slots leaked.
  if (!EraseStored(*options.disk, std::move(released_disk_keys)).ok()) ++n_disk_erase_failures;
  released_disk_keys.clear();
}

KvCache::Impl::~Impl() {
  if (options.disk == nullptr) return;
  std::vector<PageKey> keys;
  for (PageId page = 0; page < table.size(); ++page) {
    if (table.state[page] == PageState::kFree) continue;
    if (table.tier[page] == TierKind::kDisk) {
      keys.push_back(table.disk_key[page]);
    } else if (HasMaster(page)) {
      keys.push_back(table.master_key[page]);
    }
  }
  // Best effort: a failed store keeps the pages until it is compacted.
  (void)EraseStored(*options.disk, std::move(keys));
}

uint64_t KvCache::Impl::NewKeyNonce() {
  std::random_device device;
  const uint64_t time =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return (uint64_t{device()} << 32 | device()) ^ time;
}

Status KvCache::Impl::CheckPageChecksum(PageId page, std::span<const std::byte> bytes) const {
  if (Checksum64(bytes) == table.checksum[page]) return Status::Ok();
  return Status::Corruption("page " + std::to_string(page) + " read from disk as " +
                            table.disk_key[page].ToString() +
                            ": bytes differ from those the cache wrote");
}

Result<std::span<const std::byte>> KvCache::Impl::PageBytesAnywhere(PageId page) {
  if (table.tier[page] == TierKind::kRam) return std::as_const(ram).Bytes(table.slot[page]);
  if (load_scratch.size() < table.n_bytes[page]) {
    ARGUS_ASSIGN_OR_RETURN(load_scratch, AlignedBuffer::Allocate(table.n_bytes[page]));
  }
  std::span<std::byte> bytes = load_scratch.span().first(table.n_bytes[page]);
  ARGUS_RETURN_IF_ERROR(options.disk->Read(table.disk_key[page], bytes));
  ARGUS_RETURN_IF_ERROR(CheckPageChecksum(page, bytes));
  return std::span<const std::byte>(bytes);
}

Result<PageId> KvCache::Impl::LoadRow(Pending& pending, const PageKey& key, PageState state,
                                      SeqId owner, uint32_t layer, uint32_t first_token,
                                      uint32_t n_tokens, uint16_t k, uint16_t v,
                                      std::string_view what) {
  const size_t n_bytes = state == PageState::kFull ? PageBytes(k, v) : ActivePageBytes();
  auto found = options.disk->Info(key);
  if (!found.ok()) {
    // Named by a manifest or found a moment ago: gone now means lost, not "nothing saved".
    return found.status().code() == StatusCode::kNotFound
               ? Status::Corruption(std::string(what) + ": page " + key.ToString() +
                                    " is missing from the store")
               : found.status();
  }
  const StoredPageInfo& info = *found;
  const std::string tag = Tag(codecs[k].spec, codecs[v].spec);
  if (info.payload_bytes != n_bytes || info.tag != tag) {
    return Status::Corruption(std::string(what) + ": stored page " + key.ToString() + " holds " +
                              std::to_string(info.payload_bytes) + " bytes of '" + info.tag +
                              "', expected " + std::to_string(n_bytes) + " of '" + tag + "'");
  }
  ARGUS_ASSIGN_OR_RETURN(SlotId slot, ram.Allocate(n_bytes, what));
  pending.Hold(slot);
  ARGUS_RETURN_IF_ERROR(options.disk->Read(key, ram.Bytes(slot)));
  const PageId page =
      pending.HoldRow(NewRow(state, owner, layer, first_token, n_tokens, k, v, slot));
  if (state == PageState::kFull) {
    ARGUS_RETURN_IF_ERROR(Summarize(ram.Bytes(slot), k, Bounds(page), Norms(page), TileScratch()));
    table.checksum[page] = Checksum64(ram.Bytes(slot));
  }
  return page;
}

DiskTier* KvCache::disk() const { return impl_->options.disk; }

Status KvCache::MoveToDisk(PageId page) {
  Impl& impl = *impl_;
  PageTable& table = impl.table;
  const std::string what = "moving page " + std::to_string(page) + " to disk";
  ARGUS_RETURN_IF_ERROR(impl.CheckMovable(page, TierKind::kRam, what));
  const PageKey key{impl.key_nonce, impl.next_key_serial++};
  const std::string tag =
      Tag(impl.codecs[table.k_codec[page]].spec, impl.codecs[table.v_codec[page]].spec);
  ARGUS_RETURN_IF_ERROR(
      impl.options.disk->Put({key, tag, impl.ram.Bytes(table.slot[page])}).WithContext(what));
  impl.ram.Free(table.slot[page]);
  table.slot[page] = SlotId{};
  table.tier[page] = TierKind::kDisk;
  table.disk_key[page] = key;
  ++table.generation[page];
  return Status::Ok();
}

Status KvCache::MoveToRam(PageId page) {
  Impl& impl = *impl_;
  PageTable& table = impl.table;
  const std::string what = "moving page " + std::to_string(page) + " to RAM";
  ARGUS_RETURN_IF_ERROR(impl.CheckMovable(page, TierKind::kDisk, what));
  ARGUS_ASSIGN_OR_RETURN(SlotId slot, impl.ram.Allocate(table.n_bytes[page], what));
  const PageKey key = table.disk_key[page];
  Status status = impl.options.disk->Read(key, impl.ram.Bytes(slot));
  if (status.ok()) status = impl.CheckPageChecksum(page, impl.ram.Bytes(slot));
  // The disk copy goes only once the RAM copy is verified; if it cannot go, the page stays on
  // disk and the RAM copy is dropped, so the page is in exactly one place.
  if (status.ok()) status = impl.options.disk->Erase(std::span<const PageKey>(&key, 1));
  if (!status.ok()) {
    impl.ram.Free(slot);
    return status.WithContext(what);
  }
  table.slot[page] = slot;
  table.tier[page] = TierKind::kRam;
  table.disk_key[page] = PageKey{};
  table.master_key[page] = PageKey{};  // if the disk copy was the master, it is gone
  table.master_checksum[page] = 0;
  ++table.generation[page];
  return Status::Ok();
}

Status KvCache::Impl::CheckMovable(PageId page, TierKind from, std::string_view what) const {
  if (options.disk == nullptr)
    return Status::InvalidArgument(std::string(what) + ": the cache has no disk tier");
  if (page >= table.size() || table.state[page] != PageState::kFull)
    return Status::InvalidArgument(std::string(what) + ": not a full page");
  if (table.tier[page] != from)
    return Status::InvalidArgument(std::string(what) + ": it is already there");
  if (table.pin_count[page] > 0)
    return Status::InvalidArgument(std::string(what) + ": the page is pinned");
  if (from == TierKind::kRam && HasMaster(page))
    return Status::InvalidArgument(std::string(what) + ": it has a master on disk (DropToMaster)");
  return Status::Ok();
}

Status KvCache::Save(SeqId seq, std::string_view name) {
  Impl& impl = *impl_;
  const std::string what =
      "saving sequence " + std::to_string(seq) + " as '" + std::string(name) + "'";
  if (impl.options.disk == nullptr)
    return Status::InvalidArgument(what + ": the cache has no disk tier");
  if (name.empty() || name.size() > kMaxSaveNameBytes)
    return Status::InvalidArgument(what + ": a name has 1 to 200 bytes");
  auto it = impl.sequences.find(seq);
  if (it == impl.sequences.end())
    return Status::NotFound("sequence " + std::to_string(seq) + " does not exist");
  DiskTier& disk = *impl.options.disk;
  const std::string record = SaveRecordName(name);

  Manifest old;
  bool has_old = false;
  if (auto bytes = disk.GetRecord(record); bytes.ok()) {
    ARGUS_ASSIGN_OR_RETURN(old, DecodeManifest(*bytes, name));
    has_old = true;
  }
  Manifest m;
  m.geometry = impl.options.geometry;
  m.page_tokens = impl.page_tokens;
  m.active_codec = impl.codecs[kActiveCodec].spec;
  m.serial = has_old ? old.serial + 1 : 1;
  ByteWriter key_seed;
  key_seed.PutString<uint64_t>("argus-save-v1").PutString<uint64_t>(name).Put(m.serial);

  // Pages go to the store in batches of up to kSaveBatchPages (one journal record and sync
  // each); a page on disk is copied through the one scratch page, so it is a batch of its own.
  // A save that fails erases the pages it wrote: no manifest will ever name them.
  std::vector<PagePut> batch;
  std::deque<std::string> tags;  // the batch's tags: a deque keeps their addresses
  std::vector<PageKey> written;
  auto flush = [&]() -> Status {
    if (batch.empty()) return Status::Ok();
    Status status = disk.Put(batch).WithContext(what);
    if (status.ok())
      for (const PagePut& put : batch) written.push_back(put.key);
    batch.clear();
    tags.clear();
    return status;
  };
  auto save_pages = [&]() -> Status {
    const Sequence& s = it->second;
    m.layers.resize(s.layers.size());
    m.layer_tokens.resize(s.layers.size());
    uint64_t index = 0;
    for (size_t l = 0; l < s.layers.size(); ++l) {
      m.layer_tokens[l] = s.layers[l].n_tokens;
      for (PageId page : s.layers[l].pages) {
        const PageTable& table = impl.table;
        ManifestPage p;
        ByteWriter seed = key_seed;
        p.key = HashKey(seed.Put(index++).bytes());
        p.first_token = table.first_token[page];
        p.n_tokens = table.n_tokens[page];
        p.state = table.state[page];
        p.k_codec = impl.codecs[table.k_codec[page]].spec;
        p.v_codec = impl.codecs[table.v_codec[page]].spec;
        const bool on_disk = table.tier[page] == TierKind::kDisk;
        if (on_disk || batch.size() == kSaveBatchPages) ARGUS_RETURN_IF_ERROR(flush());
        ARGUS_ASSIGN_OR_RETURN(std::span<const std::byte> bytes, impl.PageBytesAnywhere(page));
        p.checksum = Checksum64(bytes);
        tags.push_back(Tag(p.k_codec, p.v_codec));
        batch.push_back({p.key, tags.back(), bytes});
        if (on_disk) ARGUS_RETURN_IF_ERROR(flush());
        m.layers[l].push_back(std::move(p));
      }
    }
    ARGUS_RETURN_IF_ERROR(flush());
    return disk.PutRecord(record, EncodeManifest(m)).WithContext(what);
  };
  if (Status status = save_pages(); !status.ok()) {
    (void)EraseStored(disk, written);
    return status;
  }
  // The new save is published: the old one's pages are garbage now.
  if (has_old) (void)EraseStored(disk, ManifestKeys(old));
  return Status::Ok();
}

Result<SeqId> KvCache::Restore(std::string_view name) {
  Impl& impl = *impl_;
  const std::string what = "restoring saved sequence '" + std::string(name) + "'";
  if (impl.options.disk == nullptr)
    return Status::InvalidArgument(what + ": the cache has no disk tier");
  auto bytes = impl.options.disk->GetRecord(SaveRecordName(name));
  if (!bytes.ok()) return bytes.status().WithContext(what);
  ARGUS_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(*bytes, name));
  const CacheGeometry& g = impl.options.geometry;
  if (m.geometry.n_layers != g.n_layers || m.geometry.n_q_heads != g.n_q_heads ||
      m.geometry.n_kv_heads != g.n_kv_heads || m.geometry.head_dim != g.head_dim ||
      m.page_tokens != impl.page_tokens || m.active_codec != impl.codecs[kActiveCodec].spec) {
    return Status::InvalidArgument(what + ": saved by a cache of " + m.geometry.ToString() + ", " +
                                   std::to_string(m.page_tokens) + "-token pages, active " +
                                   m.active_codec + "; this cache has " + g.ToString() + ", " +
                                   std::to_string(impl.page_tokens) + "-token pages, active " +
                                   impl.codecs[kActiveCodec].spec);
  }
  if (impl.next_seq == UINT32_MAX) return Status::ResourceExhausted("sequence ids are used up");
  const size_t n_codecs = impl.codecs.size();
  auto restore = [&]() -> Result<SeqId> {
    struct Resolved {
      uint16_t k, v;
    };
    std::vector<std::vector<Resolved>> codecs(m.layers.size());
    size_t n_bytes = 0, n_pages = 0;
    for (size_t l = 0; l < m.layers.size(); ++l) {
      for (const ManifestPage& p : m.layers[l]) {
        uint16_t k = kActiveCodec, v = kActiveCodec;
        if (p.state == PageState::kFull) {
          ARGUS_ASSIGN_OR_RETURN(k, impl.FindOrAddCodec(p.k_codec, CodecRole::kKeys));
          ARGUS_ASSIGN_OR_RETURN(v, impl.FindOrAddCodec(p.v_codec, CodecRole::kValues));
        }
        codecs[l].push_back({k, v});
        n_bytes += p.state == PageState::kFull ? impl.PageBytes(k, v) : impl.ActivePageBytes();
        ++n_pages;
      }
    }
    ARGUS_RETURN_IF_ERROR(impl.ram.CheckFits(n_bytes, 0, what));
    ARGUS_RETURN_IF_ERROR(impl.CheckRows(n_pages, what));
    const SeqId id = impl.next_seq;
    Sequence s;
    s.layers.resize(m.layers.size());
    Impl::Pending pending(impl);
    for (uint32_t l = 0; l < m.layers.size(); ++l) {
      for (size_t i = 0; i < m.layers[l].size(); ++i) {
        const ManifestPage& p = m.layers[l][i];
        ARGUS_ASSIGN_OR_RETURN(
            PageId page, impl.LoadRow(pending, p.key, p.state, id, l, p.first_token, p.n_tokens,
                                      codecs[l][i].k, codecs[l][i].v, what));
        // LoadRow took a full page's checksum already; an active page's is taken here.
        const uint64_t checksum = p.state == PageState::kFull
                                      ? impl.table.checksum[page]
                                      : Checksum64(impl.ram.Bytes(impl.table.slot[page]));
        if (checksum != p.checksum) {
          return Status::Corruption(what + ": page " + p.key.ToString() +
                                    " differs from the page saved");
        }
        s.layers[l].pages.push_back(page);
      }
      s.layers[l].n_tokens = m.layer_tokens[l];
    }
    impl.sequences.emplace(id, std::move(s));
    ++impl.next_seq;
    pending.Commit();
    return id;
  };
  auto result = restore();
  // Codecs this call added to the table are used by no page.
  if (!result.ok())
    impl.codecs.erase(impl.codecs.begin() + static_cast<ptrdiff_t>(n_codecs), impl.codecs.end());
  return result;
}

Status KvCache::EraseSave(std::string_view name) {
  DiskTier* disk = impl_->options.disk;
  if (disk == nullptr) return Status::InvalidArgument("erasing a save: the cache has no disk tier");
  const std::string record = SaveRecordName(name);
  ARGUS_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, disk->GetRecord(record));
  ARGUS_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(bytes, name));
  // Pages first: a failure leaves the save whole or its record naming pages already gone, which
  // Restore reports, never pages that nothing names.
  ARGUS_RETURN_IF_ERROR(EraseStored(*disk, ManifestKeys(m)));
  return disk->EraseRecord(record);
}

// Prefix keys: chain_0 hashes what makes K/V comparable (fingerprint, geometry, page size,
// codecs); chain_i hashes chain_{i-1} and page i's token ids; a page's key hashes chain_i and
// its layer.
std::vector<std::vector<PageKey>> KvCache::Impl::PrefixKeys(std::string_view fingerprint,
                                                            std::span<const int32_t> tokens,
                                                            size_t n_pages) const {
  ByteWriter seed;
  seed.PutString<uint64_t>("argus-prefix-v1").PutString<uint64_t>(fingerprint);
  const CacheGeometry& g = options.geometry;
  for (uint32_t x : {g.n_layers, g.n_q_heads, g.n_kv_heads, g.head_dim, page_tokens}) seed.Put(x);
  for (uint16_t codec : {kActiveCodec, k_codec, v_codec})
    seed.PutString<uint64_t>(codecs[codec].spec);
  PageKey chain = HashKey(seed.bytes());
  std::vector<std::vector<PageKey>> keys(n_pages);
  for (size_t i = 0; i < n_pages; ++i) {
    ByteWriter link;
    link.Put(chain).PutBytes(std::as_bytes(tokens.subspan(i * page_tokens, page_tokens)));
    chain = HashKey(link.bytes());
    for (uint32_t l = 0; l < g.n_layers; ++l) {
      ByteWriter leaf;
      keys[i].push_back(HashKey(leaf.Put(chain).Put(l).bytes()));
    }
  }
  return keys;
}

KvCache::PrefixPages KvCache::PrefixPageKeys(std::string_view fingerprint,
                                             std::span<const int32_t> tokens) const {
  const Impl& impl = *impl_;
  return {impl.PrefixKeys(fingerprint, tokens, tokens.size() / impl.page_tokens),
          Tag(impl.codecs[impl.k_codec].spec, impl.codecs[impl.v_codec].spec),
          impl.PageBytes(impl.k_codec, impl.v_codec)};
}

Status KvCache::StorePrefix(SeqId seq, std::string_view fingerprint,
                            std::span<const int32_t> tokens, uint32_t n_exact_tokens,
                            PrefixStoreStats& stats) {
  Impl& impl = *impl_;
  const std::string what = "storing the prefix pages of sequence " + std::to_string(seq);
  if (impl.options.disk == nullptr)
    return Status::InvalidArgument(what + ": the cache has no disk tier");
  auto it = impl.sequences.find(seq);
  if (it == impl.sequences.end())
    return Status::NotFound("sequence " + std::to_string(seq) + " does not exist");
  const Sequence& s = it->second;
  size_t n_pages = tokens.size() / impl.page_tokens;
  for (const LayerPages& lp : s.layers) {
    size_t n_full = 0;
    while (n_full < lp.pages.size() && impl.table.state[lp.pages[n_full]] == PageState::kFull)
      ++n_full;
    n_pages = std::min(n_pages, n_full);
  }
  const size_t n_exact_pages = std::min<size_t>(n_pages, n_exact_tokens / impl.page_tokens);
  stats.n_inexact += (n_pages - n_exact_pages) * s.layers.size();
  const auto keys = impl.PrefixKeys(fingerprint, tokens, n_exact_pages);
  for (size_t i = 0; i < n_exact_pages; ++i) {
    for (uint32_t l = 0; l < s.layers.size(); ++l) {
      const PageId page = s.layers[l].pages[i];
      // A page re-encoded since it filled is not what a fresh computation would store.
      if (impl.table.k_codec[page] != impl.k_codec || impl.table.v_codec[page] != impl.v_codec) {
        ++stats.n_reencoded;
        continue;
      }
      if (impl.options.disk->Contains(keys[i][l])) {
        ++stats.n_present;
        continue;
      }
      ARGUS_ASSIGN_OR_RETURN(std::span<const std::byte> bytes, impl.PageBytesAnywhere(page));
      const std::string tag = Tag(impl.codecs[impl.k_codec].spec, impl.codecs[impl.v_codec].spec);
      ARGUS_RETURN_IF_ERROR(impl.options.disk->Put({keys[i][l], tag, bytes}).WithContext(what));
      ++stats.n_stored;
    }
  }
  return Status::Ok();
}

Result<uint32_t> KvCache::LoadPrefix(SeqId seq, std::string_view fingerprint,
                                     std::span<const int32_t> tokens) {
  Impl& impl = *impl_;
  const std::string what = "loading prefix pages into sequence " + std::to_string(seq);
  if (impl.options.disk == nullptr)
    return Status::InvalidArgument(what + ": the cache has no disk tier");
  auto it = impl.sequences.find(seq);
  if (it == impl.sequences.end())
    return Status::NotFound("sequence " + std::to_string(seq) + " does not exist");
  Sequence& s = it->second;
  for (const LayerPages& lp : s.layers) {
    if (lp.n_tokens != 0) return Status::InvalidArgument(what + ": the sequence is not empty");
  }
  const auto keys = impl.PrefixKeys(fingerprint, tokens, tokens.size() / impl.page_tokens);
  size_t n_pages = 0;
  while (n_pages < keys.size() &&
         std::all_of(keys[n_pages].begin(), keys[n_pages].end(),
                     [&](const PageKey& key) { return impl.options.disk->Contains(key); }))
    ++n_pages;
  if (n_pages == 0) return 0u;
  const size_t n_rows = n_pages * s.layers.size();
  ARGUS_ASSIGN_OR_RETURN(size_t n_bytes,
                         CheckedMul(n_rows, impl.PageBytes(impl.k_codec, impl.v_codec), what));
  ARGUS_RETURN_IF_ERROR(impl.ram.CheckFits(n_bytes, 0, what));
  ARGUS_RETURN_IF_ERROR(impl.CheckRows(n_rows, what));
  Impl::Pending pending(impl);
  std::vector<std::vector<PageId>> loaded(s.layers.size());
  for (uint32_t l = 0; l < s.layers.size(); ++l) {
    for (size_t i = 0; i < n_pages; ++i) {
      ARGUS_ASSIGN_OR_RETURN(
          PageId page, impl.LoadRow(pending, keys[i][l], PageState::kFull, seq, l,
                                    static_cast<uint32_t>(i * impl.page_tokens), impl.page_tokens,
                                    impl.k_codec, impl.v_codec, what));
      loaded[l].push_back(page);
    }
  }
  for (uint32_t l = 0; l < s.layers.size(); ++l) {
    s.layers[l].pages = std::move(loaded[l]);
    s.layers[l].n_tokens = static_cast<uint32_t>(n_pages * impl.page_tokens);
  }
  pending.Commit();
  return static_cast<uint32_t>(n_pages * impl.page_tokens);
}

}  // namespace argus
