// Labels of the runs of one policy over several seeds (--seeds N: the random floor), so that
// results can report them together: their mean and their spread over seeds.
#pragma once

#include <string>

namespace kvsim {

// Run k of a policy or preset `name`: NAME@seedK, or NAME@TAG-seedK when the name already carries
// a tag.
std::string seeded_label(const std::string& name, int seed);
// The label whose seeds `label` is one of: NAME for NAME@seedK, NAME@TAG for NAME@TAG-seedK, and
// a sweep's NAME[a=1,b=2] for NAME[a=1,seed=K,b=2] (NAME for NAME[seed=K]); "" for any other.
std::string seed_group_of(const std::string& label);
// How tables name a group of `runs` runs: "random (5 seeds)"; the name alone for one run.
std::string seed_group_text(const std::string& name, int runs);

}  // namespace kvsim
