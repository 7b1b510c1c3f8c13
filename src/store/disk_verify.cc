// Verification of every slot read from disk: the slot header must name the page and generation
// the index expects, and the payload must match its checksum. A mismatch is Corruption, counted,
// and the page is reported lost (docs/page_format.md).
#include <string>

#include "core/checksum.h"
#include "store/disk_tier_impl.h"

namespace argus {

using disk::kSlotHeaderBytes;

Status DiskTier::Impl::Verify(const ReadTarget& t, std::span<const std::byte> slot) {
  Status s = VerifyBytes(t, slot);
  std::lock_guard lock(mu);
  if (s.ok()) {
    ++n_reads;
    read_bytes += t.slot_bytes;
  } else {
    ++n_corrupt_reads;
    lost_keys.insert(t.key);
  }
  return s;
}

Status DiskTier::Impl::VerifyBytes(const ReadTarget& t, std::span<const std::byte> slot) const {
  const std::string where = "page " + t.key.ToString() + " in " + t.file->path() + " slot " +
                            std::to_string(t.slot) + ": ";
  auto header = disk::DecodeSlotHeader(slot);
  if (!header.ok()) return Status::Corruption(where + header.status().message());
  if (!(header->key == t.key) || header->generation != t.generation) {
    return Status::Corruption(where + "holds page " + header->key.ToString() + " generation " +
                              std::to_string(header->generation) + ", expected generation " +
                              std::to_string(t.generation));
  }
  if (header->payload_bytes != t.payload_bytes || header->payload_checksum != t.payload_checksum) {
    return Status::Corruption(where + "header describes " + std::to_string(header->payload_bytes) +
                              " payload bytes, the journal " + std::to_string(t.payload_bytes));
  }
  if (Checksum64(slot.subspan(kSlotHeaderBytes, t.payload_bytes)) != t.payload_checksum) {
    return Status::Corruption(where + "payload checksum mismatch");
  }
  return Status::Ok();
}

}  // namespace argus
