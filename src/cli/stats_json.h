// JSON forms of the runtime's statistics, shared by the reports of argus and argus-bench.
#pragma once

#include <nlohmann/json.hpp>

#include "argus/cache.h"

namespace argus {

// {codec, k_bytes, v_bytes, n_k_pages, n_v_pages}
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CodecBytes, codec, k_bytes, v_bytes, k_disk_bytes, v_disk_bytes,
                                   n_k_pages, n_v_pages)

}  // namespace argus
