#include <cstdio>

#include "argus/codec.h"

int main() {
  for (const auto& info : argus::CodecRegistry::Default().List()) std::printf("%s\n", info.name.c_str());
  return 0;
}
