// Internal: whole-file I/O.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "argus/status.h"

namespace argus {

Result<std::vector<std::byte>> ReadFileBytes(const std::string& path);
// Writes to path.tmp, then renames, so a failure never leaves a half-written file at path.
Status WriteFileBytes(const std::string& path, std::span<const std::byte> bytes);

}  // namespace argus
