#pragma once
// A map keyed by std::string that string_views look up without building a string.

#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace argus {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

template <class Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

}  // namespace argus
