// Codec specs, the registry, and the list of built-in codecs.
#include <algorithm>
#include <cmath>

#include "argus/core.h"
#include "codec/codec_internal.h"

namespace argus {

std::string_view KernelPathName(KernelPath path) {
  switch (path) {
    case KernelPath::kAvx512:
      return "avx512";
    case KernelPath::kAvx2:
      return "avx2";
    case KernelPath::kScalar:
      break;
  }
  return "scalar";
}

KernelPath BestKernelPath() {
  const CpuFeatures& cpu = GetCpuFeatures();
  if (cpu.avx512_kernels()) return KernelPath::kAvx512;
  return cpu.avx2_kernels() ? KernelPath::kAvx2 : KernelPath::kScalar;
}

Status ValidateShape(TileShape shape) {
  if (shape.tokens < 1 || shape.tokens > kMaxTileTokens || shape.dim < 1 ||
      shape.dim > kMaxTileDim) {
    return Status::InvalidArgument("tile shape " + std::to_string(shape.tokens) + "x" +
                                   std::to_string(shape.dim) + " is out of range (tokens 1.." +
                                   std::to_string(kMaxTileTokens) + ", dim 1.." +
                                   std::to_string(kMaxTileDim) + ")");
  }
  return Status::Ok();
}

Result<CodecSpec> CodecSpec::Parse(std::string_view text) {
  CodecSpec spec;
  size_t plus = text.find('+');
  std::string_view head = text.substr(0, plus);
  while (plus != std::string_view::npos) {
    size_t next = text.find('+', plus + 1);
    std::string_view flag =
        text.substr(plus + 1, next == std::string_view::npos ? next : next - plus - 1);
    if (flag == "rot") {
      spec.rotate = true;
    } else if (flag == "center") {
      spec.center = true;
    } else {
      return Status::InvalidArgument("codec spec '" + std::string(text) +
                                     "': unknown transform '+" + std::string(flag) +
                                     "' (known: +rot, +center)");
    }
    plus = next;
  }
  size_t colon = head.find(':');
  spec.name = std::string(head.substr(0, colon));
  if (colon != std::string_view::npos) {
    std::string_view grouping = head.substr(colon + 1);
    if (grouping == "token") {
      spec.grouping = Grouping::kToken;
    } else if (grouping == "channel") {
      spec.grouping = Grouping::kChannel;
    } else {
      return Status::InvalidArgument("codec spec '" + std::string(text) + "': unknown grouping '" +
                                     std::string(grouping) + "' (known: token, channel)");
    }
    spec.grouping_given = true;
  }
  if (spec.name.empty())
    return Status::InvalidArgument("codec spec '" + std::string(text) + "' has no name");
  return spec;
}

std::string CodecSpec::ToString() const {
  std::string s = name;
  if (grouping_given) s += grouping == Grouping::kChannel ? ":channel" : ":token";
  if (rotate) s += "+rot";
  if (center) s += "+center";
  return s;
}

CodecRegistry& CodecRegistry::Default() {
  static CodecRegistry* registry = [] {
    auto* r = new CodecRegistry();
    Status status = codec_internal::RegisterBuiltinCodecs(*r);
    assert(status.ok());  // built-in names are fixed and distinct
    (void)status;
    return r;
  }();
  return *registry;
}

Status CodecRegistry::Register(std::string name, CodecInfo info, CodecFactory factory) {
  bool well_formed = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '/';
  });
  if (!well_formed)
    return Status::InvalidArgument("codec name '" + name + "' is malformed (use [a-z0-9_/]+)");
  if (!factory) return Status::InvalidArgument("codec '" + name + "' has no factory");
  std::lock_guard lock(mu_);
  for (const Entry& e : entries_) {
    if (e.info.name == name)
      return Status::InvalidArgument("codec '" + name + "' is already registered");
  }
  info.name = std::move(name);
  entries_.push_back({std::move(info), std::move(factory)});
  return Status::Ok();
}

Status CodecRegistry::Unregister(std::string_view name) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.info.name == name; });
  if (it == entries_.end())
    return Status::NotFound("codec '" + std::string(name) + "' is not registered");
  entries_.erase(it);
  return Status::Ok();
}

Result<std::unique_ptr<Codec>> CodecRegistry::Create(const CodecSpec& spec) const {
  CodecFactory factory;
  bool groupable = false;
  {
    std::lock_guard lock(mu_);
    for (const Entry& e : entries_) {
      if (e.info.name == spec.name) {
        factory = e.factory;
        groupable = e.info.groupable;
      }
    }
  }
  if (!factory)
    return Status::NotFound("codec '" + spec.name + "' is not registered (see `argus codecs`)");
  // Checked here, once, for built-in and application codecs alike.
  if (spec.grouping_given && !groupable) {
    return Status::InvalidArgument(spec.name + " has no grouping option");
  }
  ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, factory(spec));
  if (!spec.rotate && !spec.center) return codec;
  return codec_internal::WrapTransforms(std::move(codec), spec);
}

Result<std::unique_ptr<Codec>> CodecRegistry::Create(std::string_view spec) const {
  ARGUS_ASSIGN_OR_RETURN(CodecSpec parsed, CodecSpec::Parse(spec));
  return Create(parsed);
}

std::vector<CodecInfo> CodecRegistry::Find(const Query& query) const {
  std::vector<CodecInfo> found;
  std::lock_guard lock(mu_);
  for (const Entry& e : entries_) {
    const CodecInfo& info = e.info;
    bool role_ok = query.role == CodecRole::kBoth ||
                   (static_cast<uint8_t>(info.role) & static_cast<uint8_t>(query.role));
    if (role_ok && (!query.lossless_only || info.lossless) &&
        info.bits_per_value <= query.max_bits_per_value) {
      found.push_back(info);
    }
  }
  std::sort(found.begin(), found.end(),
            [](const CodecInfo& a, const CodecInfo& b) { return a.name < b.name; });
  return found;
}

namespace codec_internal {

void CodecBase::ComputeBitsPerValue() {
  auto n = encoded_size({256, 128});
  info_.bits_per_value = n.ok() ? static_cast<double>(*n) * 8.0 / (256.0 * 128.0) : 0.0;
}

Status CodecBase::CheckEncoded(size_t n_bytes, TileShape shape) const {
  ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
  ARGUS_ASSIGN_OR_RETURN(size_t expected, encoded_size(shape));
  if (n_bytes != expected) {
    return Status::Corruption(info_.name + " tile of " + std::to_string(shape.tokens) + "x" +
                              std::to_string(shape.dim) + " needs " + std::to_string(expected) +
                              " bytes, got " + std::to_string(n_bytes));
  }
  return Status::Ok();
}

Status CodecBase::CheckGroup(TileShape shape, uint32_t n_q) const {
  ARGUS_RETURN_IF_ERROR(ValidateShape(shape));
  if (n_q < 1 || n_q > kMaxGroupHeads) {
    return Status::InvalidArgument(info_.name + ": " + std::to_string(n_q) +
                                   " query heads per group (1.." + std::to_string(kMaxGroupHeads) +
                                   ")");
  }
  return Status::Ok();
}

Status CodecBase::CheckFinite(const float* x, TileShape shape) const {
  for (size_t i = 0; i < shape.n_values(); ++i) {
    if (!std::isfinite(x[i])) {
      return Status::InvalidArgument(
          info_.name + ": cannot encode the non-finite value at token " +
          std::to_string(i / shape.dim) + ", channel " + std::to_string(i % shape.dim) + " of a " +
          std::to_string(shape.tokens) + "x" + std::to_string(shape.dim) + " tile");
    }
  }
  return Status::Ok();
}

Status CodecBase::KeysOnly() const {
  return Status::Unsupported(info_.name + " is a keys-only codec: it has no accumulate()");
}

// Each family factory is registered under every name it accepts; the registry's info comes
// from an instance made with the default spec.
Status RegisterBuiltinCodecs(CodecRegistry& registry) {
  struct Family {
    CodecFactory factory;
    std::vector<const char*> names;
  };
  const Family families[] = {
      {MakeFloatCodec, {"f32", "f16", "bf16"}},
      {MakeAffineCodec, {"int8", "int4", "int2"}},
      {MakePlaneCodec, {"plane8", "plane8/4", "plane8/2"}},
      {MakeGgmlCodec, {"q8_0", "q4_0", "iq4_nl"}},
      {MakeSketchCodec, {"int1", "jl"}},
      {MakeLosslessCodec, {"lossless_f16", "lossless_bf16"}},
      {MakeFp8Codec, {"fp8_e4m3", "fp8_e5m2"}},
      {MakeNonUniformCodec, {"nl3", "nl2"}},
      {MakeChannel16Codec, {"chan3", "chan2"}},
  };
  for (const Family& family : families) {
    for (const char* name : family.names) {
      CodecSpec spec;
      spec.name = name;
      ARGUS_ASSIGN_OR_RETURN(std::unique_ptr<Codec> sample, family.factory(spec));
      ARGUS_RETURN_IF_ERROR(registry.Register(name, sample->info(), family.factory));
    }
  }
  return Status::Ok();
}

}  // namespace codec_internal
}  // namespace argus
