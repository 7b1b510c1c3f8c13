#include "codec/codec_internal.h"

namespace argus::codec_internal {

Result<std::unique_ptr<Codec>> WrapTransforms(std::unique_ptr<Codec> base, const CodecSpec& spec) {
  (void)base;
  return Status::Unsupported(spec.ToString() + ": transforms are not built yet");
}

}  // namespace argus::codec_internal
