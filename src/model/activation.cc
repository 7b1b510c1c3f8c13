#include "model/activation.h"

#include <cmath>

namespace argus::model {

void SiluMul(KernelPath path, float* gate, const float* up, size_t n) {
  switch (path) {
    case KernelPath::kAvx512:
      return SiluMulAvx512(gate, up, n);
    case KernelPath::kAvx2:
      return SiluMulAvx2(gate, up, n);
    case KernelPath::kScalar:
      break;
  }
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace argus::model
