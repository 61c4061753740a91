#pragma once
// The views the replay tests run, on the host (test_flat_view) and on a
// device (test_gpu): the ops loaders apply, on a [4, 6, 8] source.
#include "runtime/plan/strided.hpp"

#include <vector>

namespace rlsync::test {

struct view_case {
  const char* name;
  plan::strided view;
};

// The ops loaders apply, on a [4, 6, 8] source: narrow (tp row/column
// splits), transpose, split (several narrows), select (narrow to 1 and a
// view dropping the dim), a reshape of a narrowed view, and a whole tensor.
inline std::vector<view_case> views_of_4x6x8() {
  const plan::strided whole = plan::strided::dense({4, 6, 8});
  return {
    {"whole tensor", whole},
    {"narrow rows (tp split of dim 0)", plan::narrow(whole, 0, 2, 2)},
    {"narrow columns (tp split of dim 2)", plan::narrow(whole, 2, 4, 4)},
    {"transpose(0, 2)", plan::transpose(whole, 0, 2)},
    {"transpose then narrow", plan::narrow(plan::transpose(whole, 1, 2), 1, 3, 5)},
    {"second of three splits of dim 1", plan::narrow(whole, 1, 2, 2)},
    {"select(1, 4)", *plan::reshape(plan::narrow(whole, 1, 4, 1), {4, 8})},
    {"view([24, 8]) then narrow", plan::narrow(*plan::reshape(whole, {24, 8}), 0, 5, 7)},
    {"empty narrow", plan::narrow(whole, 0, 1, 0)},
  };
}

} // namespace rlsync::test
