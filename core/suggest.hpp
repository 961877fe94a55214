// "Did you mean": the known name nearest a mistyped one, for errors about unknown names.
#pragma once

#include <string>
#include <vector>

namespace kvsim {

// The known name nearest `given` by edit distance (insertions, deletions, substitutions and
// swaps of neighbours, each 1), when it is at most a third of the longer name (at least 1): a
// typo, not another word. Ties go to the first in `known`. Empty when none is that near.
std::string nearest_name(const std::string& given, const std::vector<std::string>& known);

// " (did you mean 'NAME'?)" with nearest_name, or "" when there is none: for appending to an
// error message.
std::string did_you_mean(const std::string& given, const std::vector<std::string>& known);

}  // namespace kvsim
