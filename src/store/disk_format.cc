// Encoding and hostile-input decoding of slot headers and journal records (docs/page_format.md).
#include "store/disk_format.h"

#include <bit>
#include <cstring>
#include <limits>
#include <string>

#include "core/byte_codec.h"
#include "core/checksum.h"

namespace argus::disk {
namespace {

static_assert(std::endian::native == std::endian::little, "the formats are little-endian");

constexpr char kSlotMagic[8] = {'A', 'R', 'G', 'U', 'S', 'P', 'G', '1'};
constexpr char kJournalMagic[8] = {'A', 'R', 'G', 'U', 'S', 'J', 'L', '1'};
constexpr size_t kHeaderChecksumAt = kSlotHeaderBytes - 8;

template <typename T>
void Store(std::span<std::byte> out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof v);
}
template <typename T>
T Load(std::span<const std::byte> in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

void PutKey(ByteWriter& w, const PageKey& key) { w.Put(key.hi).Put(key.lo); }

Result<PageKey> GetKey(ByteReader& r) {
  PageKey key;
  ARGUS_ASSIGN_OR_RETURN(key.hi, r.Get<uint64_t>("key"));
  ARGUS_ASSIGN_OR_RETURN(key.lo, r.Get<uint64_t>("key"));
  return key;
}

// Entries are at least this big, so a count is checked against the bytes left before reserving.
constexpr size_t kMinPublishedPageBytes = 8 * 6 + 1;
constexpr size_t kErasedKeyBytes = 16;

}  // namespace

// Slot header layout (byte offsets): 0 magic[8], 8 version u32, 12 header bytes u32,
// 16 key hi u64, 24 key lo u64, 32 generation u64, 40 payload bytes u64,
// 48 payload XXH3-64 u64, 56 tag length u8, 57..63 zero, 64 tag[48], 112..119 zero,
// 120 XXH3-64 of bytes 0..119.
void EncodeSlotHeader(const SlotHeader& h, std::span<std::byte> out) {
  std::memset(out.data(), 0, kSlotHeaderBytes);
  std::memcpy(out.data(), kSlotMagic, sizeof kSlotMagic);
  Store<uint32_t>(out, 8, kFormatVersion);
  Store<uint32_t>(out, 12, static_cast<uint32_t>(kSlotHeaderBytes));
  Store<uint64_t>(out, 16, h.key.hi);
  Store<uint64_t>(out, 24, h.key.lo);
  Store<uint64_t>(out, 32, h.generation);
  Store<uint64_t>(out, 40, h.payload_bytes);
  Store<uint64_t>(out, 48, h.payload_checksum);
  Store<uint8_t>(out, 56, static_cast<uint8_t>(h.tag.size()));
  std::memcpy(out.data() + 64, h.tag.data(), h.tag.size());
  Store<uint64_t>(out, kHeaderChecksumAt, Checksum64(out.first(kHeaderChecksumAt)));
}

Result<SlotHeader> DecodeSlotHeader(std::span<const std::byte> in) {
  if (in.size() < kSlotHeaderBytes) return Status::Corruption("slot shorter than its header");
  if (std::memcmp(in.data(), kSlotMagic, sizeof kSlotMagic) != 0) {
    return Status::Corruption("bad slot magic (not a written slot)");
  }
  if (Checksum64(in.first(kHeaderChecksumAt)) != Load<uint64_t>(in, kHeaderChecksumAt)) {
    return Status::Corruption("slot header checksum mismatch");
  }
  const auto version = Load<uint32_t>(in, 8);
  if (version != kFormatVersion || Load<uint32_t>(in, 12) != kSlotHeaderBytes) {
    return Status::Corruption("slot format version " + std::to_string(version) + ", expected " +
                              std::to_string(kFormatVersion));
  }
  SlotHeader h;
  h.key = {Load<uint64_t>(in, 16), Load<uint64_t>(in, 24)};
  h.generation = Load<uint64_t>(in, 32);
  h.payload_bytes = Load<uint64_t>(in, 40);
  h.payload_checksum = Load<uint64_t>(in, 48);
  const auto tag_bytes = Load<uint8_t>(in, 56);
  if (tag_bytes > kMaxPageTagBytes) {
    return Status::Corruption("slot tag length " + std::to_string(tag_bytes) + " exceeds " +
                              std::to_string(kMaxPageTagBytes));
  }
  h.tag.assign(reinterpret_cast<const char*>(in.data() + 64), tag_bytes);
  return h;
}

std::vector<std::byte> JournalFileHeader() {
  std::vector<std::byte> out(kJournalHeaderBytes);
  std::memcpy(out.data(), kJournalMagic, sizeof kJournalMagic);
  Store<uint32_t>(out, 8, kFormatVersion);
  return out;
}

Status CheckJournalFileHeader(std::span<const std::byte> in) {
  if (in.size() < kJournalHeaderBytes ||
      std::memcmp(in.data(), kJournalMagic, sizeof kJournalMagic) != 0) {
    return Status::Corruption("not an ARGUS journal (bad magic)");
  }
  const auto version = Load<uint32_t>(in, 8);
  if (version != kFormatVersion) {
    return Status::Unsupported("journal format version " + std::to_string(version) +
                               ", this build reads " + std::to_string(kFormatVersion));
  }
  return Status::Ok();
}

// Record framing: 0 XXH3-64 of bytes 8 .. 16+body, 8 body bytes u32, 12 kind u8, 13..15 zero.
Status AppendRecord(const JournalRecord& r, std::vector<std::byte>& out) {
  const size_t start = out.size();
  out.resize(start + kRecordHeaderBytes);
  ByteWriter w(std::move(out));
  switch (r.kind) {
    case RecordKind::kPublish:
      w.Put(static_cast<uint32_t>(r.pages.size()));
      for (const PublishedPage& p : r.pages) {
        PutKey(w, p.key);
        w.Put(p.generation).Put(p.payload_checksum).Put(p.slot_bytes);
        w.Put(p.slot_index).Put(p.payload_bytes);
        w.PutString<uint8_t>(p.tag);
      }
      break;
    case RecordKind::kErase:
      w.Put(static_cast<uint32_t>(r.keys.size()));
      for (const PageKey& key : r.keys) PutKey(w, key);
      break;
    case RecordKind::kPutRecord:
    case RecordKind::kEraseRecord:
      w.PutString<uint16_t>(r.name);
      if (r.kind == RecordKind::kPutRecord) {
        w.Put(static_cast<uint64_t>(r.value.size())).PutBytes(r.value);
      }
      break;
    case RecordKind::kNextGeneration:
      w.Put(r.next_generation);
      break;
  }
  out = std::move(w.bytes());
  const size_t body_bytes = out.size() - start - kRecordHeaderBytes;
  if (body_bytes > std::numeric_limits<uint32_t>::max()) {
    out.resize(start);
    return Status::InvalidArgument("journal record of " + std::to_string(body_bytes) +
                                   " bytes exceeds the 4 GiB record limit");
  }
  std::span<std::byte> framed(out.data() + start, out.size() - start);
  Store<uint32_t>(framed, 8, static_cast<uint32_t>(body_bytes));
  Store<uint8_t>(framed, 12, static_cast<uint8_t>(r.kind));
  Store<uint64_t>(framed, 0, Checksum64(framed.subspan(8)));
  return Status::Ok();
}

RecordHeader DecodeRecordHeader(std::span<const std::byte> in) {
  return {Load<uint64_t>(in, 0), Load<uint32_t>(in, 8), Load<uint8_t>(in, 12)};
}

bool RecordChecksumMatches(std::span<const std::byte> framed) {
  return Checksum64(framed.subspan(8)) == Load<uint64_t>(framed, 0);
}

Result<JournalRecord> DecodeRecordBody(uint8_t kind, std::span<const std::byte> body) {
  JournalRecord r;
  ByteReader in(body, "journal record body");
  switch (kind) {
    case static_cast<uint8_t>(RecordKind::kPublish): {
      r.kind = RecordKind::kPublish;
      ARGUS_ASSIGN_OR_RETURN(const uint32_t n, in.Get<uint32_t>("page count"));
      if (n == 0 || n > in.remaining() / kMinPublishedPageBytes) {
        return Status::Corruption("publish record declares " + std::to_string(n) + " pages in " +
                                  std::to_string(in.remaining()) + " bytes");
      }
      r.pages.resize(n);
      for (PublishedPage& p : r.pages) {
        ARGUS_ASSIGN_OR_RETURN(p.key, GetKey(in));
        ARGUS_ASSIGN_OR_RETURN(p.generation, in.Get<uint64_t>("generation"));
        ARGUS_ASSIGN_OR_RETURN(p.payload_checksum, in.Get<uint64_t>("payload checksum"));
        ARGUS_ASSIGN_OR_RETURN(p.slot_bytes, in.Get<uint64_t>("slot bytes"));
        ARGUS_ASSIGN_OR_RETURN(p.slot_index, in.Get<uint32_t>("slot index"));
        ARGUS_ASSIGN_OR_RETURN(p.payload_bytes, in.Get<uint32_t>("payload bytes"));
        ARGUS_ASSIGN_OR_RETURN(const uint8_t tag_bytes, in.Get<uint8_t>("tag length"));
        if (tag_bytes > kMaxPageTagBytes) {
          return Status::Corruption("page tag length " + std::to_string(tag_bytes));
        }
        ARGUS_ASSIGN_OR_RETURN(p.tag, in.GetText(tag_bytes, "tag"));
        if (p.payload_bytes == 0 || p.payload_bytes > kMaxPagePayloadBytes ||
            p.slot_bytes % kMinAlignment != 0 ||
            p.slot_bytes < kSlotHeaderBytes + uint64_t{p.payload_bytes}) {
          return Status::Corruption("page " + p.key.ToString() + ": payload of " +
                                    std::to_string(p.payload_bytes) + " bytes in a slot of " +
                                    std::to_string(p.slot_bytes));
        }
      }
      break;
    }
    case static_cast<uint8_t>(RecordKind::kErase): {
      r.kind = RecordKind::kErase;
      ARGUS_ASSIGN_OR_RETURN(const uint32_t n, in.Get<uint32_t>("key count"));
      if (n == 0 || n > in.remaining() / kErasedKeyBytes) {
        return Status::Corruption("erase record declares " + std::to_string(n) + " keys in " +
                                  std::to_string(in.remaining()) + " bytes");
      }
      r.keys.resize(n);
      for (PageKey& key : r.keys) {
        ARGUS_ASSIGN_OR_RETURN(key, GetKey(in));
      }
      break;
    }
    case static_cast<uint8_t>(RecordKind::kPutRecord):
    case static_cast<uint8_t>(RecordKind::kEraseRecord): {
      r.kind = static_cast<RecordKind>(kind);
      ARGUS_ASSIGN_OR_RETURN(const uint16_t name_bytes, in.Get<uint16_t>("name length"));
      if (name_bytes == 0 || name_bytes > kMaxRecordNameBytes) {
        return Status::Corruption("record name length " + std::to_string(name_bytes));
      }
      ARGUS_ASSIGN_OR_RETURN(r.name, in.GetText(name_bytes, "name"));
      if (r.kind == RecordKind::kPutRecord) {
        ARGUS_ASSIGN_OR_RETURN(const uint64_t value_bytes, in.Get<uint64_t>("value length"));
        if (value_bytes != in.remaining()) {
          return Status::Corruption("record '" + r.name + "' declares " +
                                    std::to_string(value_bytes) + " value bytes, has " +
                                    std::to_string(in.remaining()));
        }
        ARGUS_ASSIGN_OR_RETURN(std::span<const std::byte> value, in.GetBytes(value_bytes, "value"));
        r.value.assign(value.begin(), value.end());
      }
      break;
    }
    case static_cast<uint8_t>(RecordKind::kNextGeneration): {
      r.kind = RecordKind::kNextGeneration;
      ARGUS_ASSIGN_OR_RETURN(r.next_generation, in.Get<uint64_t>("next generation"));
      break;
    }
    default:
      return Status::Corruption("unknown record kind " + std::to_string(kind));
  }
  if (in.remaining() != 0) {
    return Status::Corruption(std::to_string(in.remaining()) + " stray bytes after the body");
  }
  return r;
}

}  // namespace argus::disk
