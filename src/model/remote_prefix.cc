#include "model/remote_prefix.h"

#include <algorithm>
#include <vector>

namespace argus::model {

RemoteFetch FetchRemotePrefix(const KvCache& cache, DiskTier& disk, RemoteTier& remote,
                              std::string_view fingerprint, std::span<const int32_t> tokens) {
  const KvCache::PrefixPages prefix = cache.PrefixPageKeys(fingerprint, tokens);
  const size_t n_pages = prefix.keys.size();
  auto on_disk = [&](const PageKey& key) { return disk.Contains(key); };
  RemoteFetch fetch;
  while (fetch.first_page < n_pages &&
         std::all_of(prefix.keys[fetch.first_page].begin(), prefix.keys[fetch.first_page].end(),
                     on_disk))
    ++fetch.first_page;
  fetch.end_page = fetch.first_page;
  if (n_pages == fetch.first_page || prefix.page_bytes == 0) return fetch;
  const size_t n_layers = prefix.keys[0].size();
  const size_t batch_pages =
      std::max<size_t>(1, kRemoteBatchBytes / std::max<size_t>(1, prefix.page_bytes * n_layers));
  for (size_t first = fetch.first_page; first < n_pages && remote.available();
       first += batch_pages) {
    const size_t end = std::min(n_pages, first + batch_pages);
    std::vector<PageKey> keys;
    for (size_t i = first; i < end; ++i)
      keys.insert(keys.end(), prefix.keys[i].begin(), prefix.keys[i].end());
    const std::vector<std::vector<std::byte>> got = remote.Get(keys, prefix.tag);
    // The run of whole pages (every layer) from the batch's start.
    size_t done = first;
    while (done < end && std::all_of(got.begin() + (done - first) * n_layers,
                                     got.begin() + (done - first + 1) * n_layers,
                                     [&](const auto& p) { return p.size() == prefix.page_bytes; }))
      ++done;
    std::vector<PagePut> puts;
    for (size_t i = first; i < done; ++i) {
      for (size_t l = 0; l < n_layers; ++l) {
        const PageKey& key = prefix.keys[i][l];
        if (!disk.Contains(key)) puts.push_back({key, prefix.tag, got[(i - first) * n_layers + l]});
      }
    }
    // A disk budget too small for the batch ends the fetch: LoadPrefix loads what is there.
    if (!puts.empty() && !disk.Put(puts).ok()) break;
    fetch.end_page = done;
    fetch.n_pages += puts.size();
    if (done < end) break;
  }
  return fetch;
}

size_t StoreRemotePrefix(const KvCache& cache, DiskTier& disk, RemoteTier& remote,
                         std::string_view fingerprint, std::span<const int32_t> tokens) {
  if (!remote.available()) return 0;
  const KvCache::PrefixPages prefix = cache.PrefixPageKeys(fingerprint, tokens);
  std::vector<PageKey> keys;
  for (const auto& page : prefix.keys)
    for (const PageKey& key : page)
      if (disk.Contains(key)) keys.push_back(key);
  const std::vector<bool> present = remote.Contains(keys);
  size_t n_written = 0;
  std::vector<std::vector<std::byte>> payloads;
  std::vector<PagePut> puts;
  size_t batch_bytes = 0;
  auto flush = [&] {
    if (!puts.empty()) n_written += remote.Put(puts);
    puts.clear();
    payloads.clear();
    batch_bytes = 0;
  };
  payloads.reserve(keys.size());  // puts point into payloads: no reallocation within a batch
  for (size_t i = 0; i < keys.size() && remote.available(); ++i) {
    if (present[i]) continue;
    auto info = disk.Info(keys[i]);
    if (!info.ok() || info->tag != prefix.tag) continue;
    std::vector<std::byte> bytes(info->payload_bytes);
    if (!disk.Read(keys[i], bytes).ok()) continue;  // a lost page is not shared
    batch_bytes += bytes.size();
    payloads.push_back(std::move(bytes));
    puts.push_back({keys[i], prefix.tag, payloads.back()});
    if (batch_bytes >= kRemoteBatchBytes) flush();
  }
  flush();
  return n_written;
}

}  // namespace argus::model
