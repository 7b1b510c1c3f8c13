// Internal: how this library was built (what `argus info` and the benchmarks report).
#pragma once

#include <string>

namespace argus {

struct BuildInfo {
  std::string version, compiler, build_type, flags;
};
const BuildInfo& GetBuildInfo();

}  // namespace argus
