// Internal: checked size arithmetic. Every size derived from untrusted values (files, pages,
// arguments) goes through these.
#pragma once

#include <cstddef>
#include <string_view>

#include "argus/status.h"

namespace argus {

// Returns a*b, or InvalidArgument naming `what` when it does not fit in size_t.
Result<size_t> CheckedMul(size_t a, size_t b, std::string_view what);
// Returns a+b, or InvalidArgument naming `what` on overflow.
Result<size_t> CheckedAdd(size_t a, size_t b, std::string_view what);

}  // namespace argus
