// Loads the CUDA backend module (gpu/, libkvsim_cuda.so) on first use. kvsim links no CUDA
// library itself: starting it costs nothing on machines without a GPU, and a build without CUDA
// (or a missing module) is a clear error at --backend cuda rather than a failure to start.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "sim/live/backend.hpp"

namespace kvsim::live {

namespace {

// KVSIM_CUDA_MODULE, else the module beside the executable, else where the build put it.
void* open_module(std::string& tried) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KVSIM_CUDA_MODULE")) candidates.push_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back((exe.parent_path() / "libkvsim_cuda.so").string());
#ifdef KVSIM_CUDA_MODULE_PATH
  candidates.push_back(KVSIM_CUDA_MODULE_PATH);
#endif
  for (const auto& path : candidates) {
    if (!std::filesystem::exists(path)) continue;
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    tried += " " + path + " (" + dlerror() + ")";
  }
  return nullptr;
}

void* module() {
  static std::string tried;
  static void* handle = open_module(tried);
  if (!handle)
    throw std::runtime_error(
        "the CUDA backend module libkvsim_cuda.so is not available: kvsim was built without "
        "CUDA (cmake -DKVSIM_CUDA=ON with nvcc installed) or the module failed to load" +
        (tried.empty() ? std::string() : ":" + tried));
  return handle;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  using Make = Backend* (*)(int, char*, int);
  auto make = reinterpret_cast<Make>(dlsym(module(), "kvsim_cuda_make_backend_on"));
  if (!make) throw std::runtime_error("libkvsim_cuda.so lacks kvsim_cuda_make_backend_on");
  char error[512] = "";
  Backend* b = make(device, error, sizeof error);
  if (!b) throw std::runtime_error(std::string("CUDA backend: ") + error);
  return std::unique_ptr<Backend>(b);
}

bool cuda_available() {
  try {
    using Count = int (*)();
    auto count = reinterpret_cast<Count>(dlsym(module(), "kvsim_cuda_device_count"));
    return count && count() > 0;
  } catch (const std::runtime_error&) {
    return false;
  }
}

}  // namespace kvsim::live
