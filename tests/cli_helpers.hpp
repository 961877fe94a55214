// Runs the kvsim binary from tests: exit code and combined output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace kvsim::test {

struct CliRun {
  int code;
  std::string output;  // stdout and stderr
};

inline CliRun kvsim(const std::string& args) {
  const std::string cmd = std::string(KVSIM_BINARY) + " " + args + " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

#ifdef KVSIM_TEST_MPIEXEC
// A shell command that runs `kvsim ARGS` as `ranks` MPI ranks on this machine. OpenMPI refuses
// root unless told; --oversubscribe lets more ranks than cores share the machine. In the sanitizer
// build, leak checking is off for the ranks: OpenMPI unloads its plugins before exit, so their
// allocations cannot be attributed or suppressed (the same code runs leak-checked in one process).
inline std::string mpirun_command(int ranks, const std::string& args) {
  return std::string(
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
             "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" ") +
         KVSIM_TEST_MPIEXEC + " -n " + std::to_string(ranks) + " --oversubscribe " + KVSIM_BINARY +
         " " + args;
}
#endif

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace kvsim::test
