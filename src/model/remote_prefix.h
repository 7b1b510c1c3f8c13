// Prefix pages between the remote tier and the local disk tier, for model::Context: the remote
// tier sits below the disk, so pages come from it into the disk tier and are loaded from there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "argus/cache.h"
#include "argus/remote.h"
#include "argus/store.h"

namespace argus::model {

// Pages [first_page, end_page) of the prefix were fetched from the remote tier into the disk
// tier; the pages before first_page were on the disk already.
struct RemoteFetch {
  size_t first_page = 0, end_page = 0;
  size_t n_pages = 0;  // pages (of single layers) put into the disk tier
};

// Fetches the leading whole pages of `tokens` (every layer) that the disk tier lacks from the
// remote tier, in batches of about kRemoteBatchBytes (one MGET each), stopping at the first page
// missing remotely, refused by verification, or not fitting the disk's budget. Never fails: what
// cannot be fetched is computed by the caller.
RemoteFetch FetchRemotePrefix(const KvCache& cache, DiskTier& disk, RemoteTier& remote,
                              std::string_view fingerprint, std::span<const int32_t> tokens);

// Writes the prefix pages of `tokens` held by the disk tier that the remote tier lacks (one
// pipelined EXISTS, then pipelined SETs in batches). Returns the pages written.
size_t StoreRemotePrefix(const KvCache& cache, DiskTier& disk, RemoteTier& remote,
                         std::string_view fingerprint, std::span<const int32_t> tokens);

inline constexpr size_t kRemoteBatchBytes = size_t{32} << 20;

}  // namespace argus::model
