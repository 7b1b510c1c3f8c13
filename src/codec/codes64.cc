// The code blocks of codes64.h, scalar.
#include "codec/codes64.h"

namespace argus::codec_internal {

void PackCodes64(const uint8_t* codes, uint32_t bits, std::byte* block) {
  for (uint32_t j = 0; j < kCodeBlockValues; ++j) {
    block[j % 16] |= static_cast<std::byte>((codes[j] & 3) << (2 * (j / 16)));
    if (bits == 3) block[16 + j / 8] |= static_cast<std::byte>(((codes[j] >> 2) & 1) << (j % 8));
  }
}

uint32_t CodeAt(const std::byte* block, uint32_t bits, uint32_t j) {
  uint32_t c = (std::to_integer<uint32_t>(block[j % 16]) >> (2 * (j / 16))) & 3;
  if (bits == 3) c |= ((std::to_integer<uint32_t>(block[16 + j / 8]) >> (j % 8)) & 1) << 2;
  return c;
}

void UnpackCodes64(const std::byte* block, uint32_t bits, uint8_t* codes) {
  for (uint32_t j = 0; j < kCodeBlockValues; ++j)
    codes[j] = static_cast<uint8_t>(CodeAt(block, bits, j));
}

// 2^(-e/8) rounded to float.
const float kChannelStepFactor[64] = {
    1.0f,           0.917004049f,   0.840896428f,   0.771105409f,   0.707106769f,   0.648419797f,
    0.594603539f,   0.545253873f,   0.5f,           0.458502024f,   0.420448214f,   0.385552704f,
    0.353553385f,   0.324209899f,   0.297301769f,   0.272626936f,   0.25f,          0.229251012f,
    0.210224107f,   0.192776352f,   0.176776692f,   0.162104949f,   0.148650885f,   0.136313468f,
    0.125f,         0.114625506f,   0.105112053f,   0.0963881761f,  0.0883883461f,  0.0810524747f,
    0.0743254423f,  0.0681567341f,  0.0625f,        0.0573127531f,  0.0525560267f,  0.048194088f,
    0.0441941731f,  0.0405262373f,  0.0371627212f,  0.0340783671f,  0.03125f,       0.0286563765f,
    0.0262780134f,  0.024097044f,   0.0220970865f,  0.0202631187f,  0.0185813606f,  0.0170391835f,
    0.015625f,      0.0143281883f,  0.0131390067f,  0.012048522f,   0.0110485433f,  0.0101315593f,
    0.00929068029f, 0.00851959176f, 0.0078125f,     0.00716409413f, 0.00656950334f, 0.00602426101f,
    0.00552427163f, 0.00506577967f, 0.00464534014f, 0.00425979588f,
};

}  // namespace argus::codec_internal
