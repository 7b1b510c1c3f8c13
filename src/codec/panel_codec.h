// The reading half shared by the codecs that store panel-layout code planes (affine.cc,
// plane.cc): once a subclass says how its bytes map onto a CodedTile, decode and the fused
// kernels are the same. Not for *_avx2.cc files.
#pragma once

#include "codec/affine_kernels.h"
#include "codec/codec_internal.h"

namespace argus::codec_internal {

class PanelCodec : public CodecBase {
 public:
  PanelCodec(CodecInfo info, KernelPath path)
      : CodecBase(std::move(info), path, KernelPath::kAvx512) {}

 protected:
  Status DecodeChecked(std::span<const std::byte> in, TileShape shape, float* x) const override {
    PanelDecode(View(in.data(), shape), x);
    return Status::Ok();
  }

  Status ScoresChecked(std::span<const std::byte> k, TileShape shape, const float* q, uint32_t n_q,
                       float* s) const override {
    PanelScores(View(k.data(), shape), q, n_q, s, path_);
    return Status::Ok();
  }

  Status AccumulateChecked(std::span<const std::byte> v, TileShape shape, const float* p,
                           uint32_t n_q, float* acc) const override {
    PanelAccumulate(View(v.data(), shape), p, n_q, acc, path_);
    return Status::Ok();
  }

  // The tile's parts. REQUIRES: bytes hold encoded_size(shape) bytes (checked by the callers).
  virtual CodedTile View(const std::byte* bytes, TileShape shape) const = 0;
};

}  // namespace argus::codec_internal
