// Sums of attention statistics over calls.
#include <algorithm>

#include "argus/attention.h"

namespace argus {

AttentionStats& AttentionStats::operator+=(const AttentionStats& other) {
  n_pages += other.n_pages;
  n_pages_masked += other.n_pages_masked;
  n_tiles += other.n_tiles;
  n_tiles_skipped += other.n_tiles_skipped;
  bytes_read += other.bytes_read;
  bytes_skipped += other.bytes_skipped;
  n_disk_pages_read += other.n_disk_pages_read;
  disk_bytes_read += other.disk_bytes_read;
  skipped_mass_bound = std::max(skipped_mass_bound, other.skipped_mass_bound);
  return *this;
}

}  // namespace argus
