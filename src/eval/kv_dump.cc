// The reader of `argus eval --dump-kv` directories (eval/kv_dump.h).
#include "eval/kv_dump.h"

#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/npy.h"

namespace argus {
namespace {

// A float32 array of 3 non-zero dimensions; errors name the file.
Result<NpyArray> ReadDumpArray(const std::string& path) {
  ARGUS_ASSIGN_OR_RETURN(NpyArray array, ReadNpy(path));
  if (array.type != NpyType::kFloat32) {
    return Status::InvalidArgument(
        fmt::format("{}: dtype {}; a dump holds float32", path,
                    array.type == NpyType::kFloat16 ? "float16" : "uint8"));
  }
  if (array.shape.size() != 3 || array.n_values() == 0 || array.shape[0] > UINT32_MAX ||
      array.shape[1] > UINT32_MAX || array.shape[2] > UINT32_MAX) {
    return Status::InvalidArgument(fmt::format("{}: shape {}; expected [tokens, heads, head_dim]",
                                               path, NpyShapeText(array.shape)));
  }
  return array;
}

// InvalidArgument naming the file whose shape differs from the other file's.
Status SameShape(const std::string& path, const std::vector<size_t>& shape,
                 const std::string& other, const std::vector<size_t>& expected) {
  if (shape == expected) return Status::Ok();
  return Status::InvalidArgument(fmt::format("{}: shape {} differs from {}'s {}", path,
                                             NpyShapeText(shape), other, NpyShapeText(expected)));
}

// The layers the directory holds: the count of layerNN_k.npy files, which must be 00 .. count-1.
Result<uint32_t> CountDumpLayers(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return Status::NotFound(fmt::format("{}: no such directory", dir));
  }
  std::set<uint32_t> layers;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    constexpr std::string_view kPrefix = "layer", kSuffix = "_k.npy";
    if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) continue;
    const std::string digits =
        name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
    if (digits.empty() || digits.size() > 6 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    const uint32_t layer = static_cast<uint32_t>(std::stoul(digits));
    if (DumpName(layer, 'k') == name) layers.insert(layer);  // layer05, layer123; not layer5
  }
  if (ec) return Status::IOError(fmt::format("{}: {}", dir, ec.message()));
  if (layers.empty()) {
    return Status::NotFound(
        fmt::format("{}: no layerNN_k.npy files (write a dump with argus eval --dump-kv)", dir));
  }
  const uint32_t n_layers = static_cast<uint32_t>(layers.size());
  for (uint32_t layer = 0; layer < n_layers; ++layer) {
    if (!layers.contains(layer)) {
      return Status::NotFound(fmt::format("{}: missing, though the dump has layers up to {}",
                                          DumpPath(dir, layer, 'k'),
                                          DumpName(*layers.rbegin(), 'k')));
    }
  }
  return n_layers;
}

}  // namespace

std::string DumpName(uint32_t layer, char plane) {
  return fmt::format("layer{:02}_{}.npy", layer, plane);
}

std::string DumpPath(const std::string& dir, uint32_t layer, char plane) {
  return (std::filesystem::path(dir) / DumpName(layer, plane)).string();
}

Result<KvDump> ReadKvDump(const std::string& dir) {
  ARGUS_ASSIGN_OR_RETURN(const uint32_t n_layers, CountDumpLayers(dir));
  KvDump dump;
  dump.dir = dir;
  std::vector<size_t> k_shape0, q_shape0;  // layer 00's, which every layer must match
  for (uint32_t layer = 0; layer < n_layers; ++layer) {
    const std::string k_path = DumpPath(dir, layer, 'k'), v_path = DumpPath(dir, layer, 'v'),
                      q_path = DumpPath(dir, layer, 'q');
    ARGUS_ASSIGN_OR_RETURN(NpyArray k, ReadDumpArray(k_path));
    ARGUS_ASSIGN_OR_RETURN(NpyArray v, ReadDumpArray(v_path));
    ARGUS_ASSIGN_OR_RETURN(NpyArray q, ReadDumpArray(q_path));
    if (layer == 0) {
      k_shape0 = k.shape;
      if (q.shape[0] != k.shape[0] || q.shape[2] != k.shape[2]) {
        return Status::InvalidArgument(
            fmt::format("{}: shape {}; expected [{}, n_q_heads, {}] ({}'s tokens and head_dim)",
                        q_path, NpyShapeText(q.shape), k.shape[0], k.shape[2], k_path));
      }
      q_shape0 = q.shape;
    }
    ARGUS_RETURN_IF_ERROR(SameShape(k_path, k.shape, DumpName(0, 'k'), k_shape0));
    ARGUS_RETURN_IF_ERROR(SameShape(q_path, q.shape, DumpName(0, 'q'), q_shape0));
    ARGUS_RETURN_IF_ERROR(SameShape(v_path, v.shape, DumpName(layer, 'k'), k.shape));
    const std::vector<float> q_values = q.ToFloat();
    const size_t q_row = q.shape[1] * q.shape[2];
    dump.q.insert(dump.q.end(), q_values.end() - q_row, q_values.end());
    dump.k.push_back(k.ToFloat());
    dump.v.push_back(v.ToFloat());
  }
  dump.n_tokens = static_cast<uint32_t>(k_shape0[0]);
  // "real:stories-kv" for "/tmp/stories-kv/", "." or "../stories-kv".
  std::error_code ec;
  const std::filesystem::path full = std::filesystem::weakly_canonical(dir, ec);
  dump.model.name = "real:" + (ec || full.filename().empty() ? dir : full.filename().string());
  dump.model.geometry = {.n_layers = n_layers,
                         .n_q_heads = static_cast<uint32_t>(q_shape0[1]),
                         .n_kv_heads = static_cast<uint32_t>(k_shape0[1]),
                         .head_dim = static_cast<uint32_t>(k_shape0[2])};
  ARGUS_RETURN_IF_ERROR(dump.model.geometry.Validate().WithContext(DumpPath(dir, 0, 'q') + ", " +
                                                                   DumpPath(dir, 0, 'k')));
  return dump;
}

}  // namespace argus
