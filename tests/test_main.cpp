#include <gtest/gtest.h>

#include <filesystem>

#include "tests/tiny_trace.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  // temp_path() gives each test process its own directory; remove it when the process is done.
  std::error_code ignored;
  std::filesystem::remove_all(std::filesystem::path(kvsim::test::temp_path("x")).parent_path(),
                              ignored);
  return rc;
}
