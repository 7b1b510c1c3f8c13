// The disk tier's on-disk encodings (docs/page_format.md): the slot header and the journal's
// file header, record framing and record bodies. Pure functions over bytes: no I/O, no state.
// Decoders treat their input as hostile and return Corruption saying what is wrong (the caller
// adds the file and offset).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "argus/status.h"
#include "argus/store.h"

namespace argus::disk {

inline constexpr size_t kSlotHeaderBytes = 128;
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr size_t kMinAlignment = 512;  // slot sizes are multiples of this at least
inline constexpr size_t kJournalHeaderBytes = 16;
inline constexpr size_t kRecordHeaderBytes = 16;
inline constexpr size_t kMaxRecordNameBytes = 4096;

// The identity and checksums of the page a slot holds.
struct SlotHeader {
  PageKey key;
  uint64_t generation = 0;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;  // XXH3-64 of the payload bytes
  std::string tag;                // at most kMaxPageTagBytes
};

// Writes the kSlotHeaderBytes header (header checksum included) into out.
void EncodeSlotHeader(const SlotHeader& header, std::span<std::byte> out);
// Checks magic, version and the header checksum, then decodes.
Result<SlotHeader> DecodeSlotHeader(std::span<const std::byte> in);

// The journal file's first kJournalHeaderBytes.
std::vector<std::byte> JournalFileHeader();
Status CheckJournalFileHeader(std::span<const std::byte> in);

// Append only: record kinds reach the journal.
enum class RecordKind : uint8_t {
  kPublish = 1,         // pages now live at their slots (replacing older pages of their keys)
  kErase = 2,           // keys no longer stored
  kPutRecord = 3,       // a named record set (replacing)
  kEraseRecord = 4,     // a named record removed
  kNextGeneration = 5,  // the next generation to hand out (written first by compaction)
};

struct PublishedPage {
  PageKey key;
  std::string tag;
  uint64_t generation = 0;
  uint64_t payload_checksum = 0;
  uint64_t slot_bytes = 0;  // the size class: file slots-<slot_bytes>.dat
  uint32_t slot_index = 0;
  uint32_t payload_bytes = 0;
};

struct JournalRecord {
  RecordKind kind = RecordKind::kPublish;
  std::vector<PublishedPage> pages;  // kPublish
  std::vector<PageKey> keys;         // kErase
  std::string name;                  // kPutRecord, kEraseRecord
  std::vector<std::byte> value;      // kPutRecord
  uint64_t next_generation = 0;      // kNextGeneration
};

// Appends the framed record (header and body) to out. InvalidArgument when the body would not
// fit the 32-bit length field.
Status AppendRecord(const JournalRecord& record, std::vector<std::byte>& out);

// A record header: body length and kind; the checksum is verified over header and body.
struct RecordHeader {
  uint64_t checksum = 0;
  uint32_t body_bytes = 0;
  uint8_t kind = 0;
};
RecordHeader DecodeRecordHeader(std::span<const std::byte> in);  // REQUIRES: 16 bytes
// Whether `framed` (header followed by body_bytes of body) carries a matching checksum.
bool RecordChecksumMatches(std::span<const std::byte> framed);
// Decodes a checksummed body; Corruption when it does not parse as `kind`.
Result<JournalRecord> DecodeRecordBody(uint8_t kind, std::span<const std::byte> body);

}  // namespace argus::disk
