#include "traces/file_kind.hpp"

#include <filesystem>
#include <system_error>

#include "traces/hdf5_util.hpp"

namespace kvsim {

FileKind file_kind(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) return FileKind::missing;
  if (std::filesystem::is_directory(status)) return FileKind::directory;
  silence_hdf5_errors();
#if H5_VERSION_GE(1, 12, 0)
  const htri_t hdf5 = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
  const htri_t hdf5 = H5Fis_hdf5(path.c_str());
#endif
  if (hdf5 <= 0) return FileKind::other;
  const H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.valid()) return FileKind::other_hdf5;  // HDF5, yet unreadable (locked, damaged)
  if (h5_attr_exists(file.get(), "kvtrace_version"))
    return h5_attr_exists(file.get(), "kvtrace_compact") ? FileKind::compact_trace
                                                         : FileKind::trace;
  if (h5_attr_exists(file.get(), "kvprompt_version")) return FileKind::prompts;
  return FileKind::other_hdf5;
}

const char* describe(FileKind kind) {
  switch (kind) {
    case FileKind::missing:
      return "missing file";
    case FileKind::trace:
      return "kvtrace file";
    case FileKind::compact_trace:
      return "compact kvtrace file";
    case FileKind::prompts:
      return "kvprompt file";
    case FileKind::other_hdf5:
      return "HDF5 file";
    case FileKind::directory:
      return "directory";
    case FileKind::other:
      break;
  }
  return "file";
}

}  // namespace kvsim
