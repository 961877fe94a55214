// Thin RAII and error helpers over the HDF5 C API, shared by the kvtrace reader and writer.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvsim {

// Every problem with a trace file: the message names the file, sample and dataset.
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Owns one HDF5 identifier and closes it with the matching H5?close.
class H5Handle {
 public:
  H5Handle() = default;
  explicit H5Handle(hid_t id) : id_(id) {}
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle(H5Handle&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  H5Handle& operator=(H5Handle&& o) noexcept;
  ~H5Handle() { reset(); }
  void reset();
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Turns off HDF5's own printing to stderr; kvsim reports errors itself. Idempotent.
void silence_hdf5_errors();

// The innermost message of HDF5's current error stack ("" if none).
std::string hdf5_last_error();

bool h5_path_exists(hid_t loc, const std::string& path);
bool h5_attr_exists(hid_t obj, const std::string& name);

std::optional<std::int64_t> h5_read_int_attr(hid_t obj, const std::string& name);
std::optional<double> h5_read_float_attr(hid_t obj, const std::string& name);
// A one-dimensional integer attribute of 1..`most` values (a scalar reads as one).
std::optional<std::vector<std::int64_t>> h5_read_int_array_attr(hid_t obj, const std::string& name,
                                                                std::size_t most);
std::optional<std::string> h5_read_string_attr(hid_t obj, const std::string& name);

void h5_write_int_attr(hid_t obj, const std::string& name, std::int64_t value);
void h5_write_float_attr(hid_t obj, const std::string& name, double value);
void h5_write_int_array_attr(hid_t obj, const std::string& name,
                             const std::vector<std::int64_t>& values);
void h5_write_string_attr(hid_t obj, const std::string& name, const std::string& value);

// Shape of a dataset.
std::vector<hsize_t> h5_dataset_shape(hid_t dset);

// The IEEE binary16 type as h5py and numpy write it.
hid_t h5_float16_type();

// Creation property lists (H5P_FILE_CREATE, H5P_GROUP_CREATE or H5P_DATASET_CREATE) that do not
// record object times: HDF5 stamps every object header with its creation time by default, so
// two runs with the same inputs would otherwise never write the same bytes.
H5Handle h5_untimed_plist(hid_t plist_class);

// Throws TraceError (prefixed by `where`) when a dataset declaring `declared_bytes` was never
// fully written: it would read as fill values, not a recording. Deflate compresses at most
// 1032:1, so a dataset declaring far more than that over its stored bytes is not fully written
// either; checking this before reading keeps a tiny file from asking for any amount of memory.
void h5_check_written(hid_t dset, double declared_bytes, const std::string& where);

// Creates (or opens) every group along path.
H5Handle h5_require_group(hid_t loc, const std::string& path);

// The kind of object at path (H5I_GROUP, H5I_DATASET, ...), H5I_BADID when there is none.
H5I_type_t h5_object_kind(hid_t loc, const std::string& path);

// Names of the members of the group at path, in name order.
std::vector<std::string> h5_group_members(hid_t loc, const std::string& path);

// Writes a one-dimensional dataset; `where` prefixes the error message.
void h5_write_1d(hid_t group, const char* name, hid_t file_type, hid_t mem_type, const void* data,
                 std::size_t n, const std::string& where);
template <typename T>
void h5_write_1d(hid_t group, const char* name, hid_t file_type, hid_t mem_type,
                 const std::vector<T>& data, const std::string& where) {
  h5_write_1d(group, name, file_type, mem_type, data.data(), data.size(), where);
}
// Writes a [rows, cols] dataset from row-major data; `where` prefixes the error message.
void h5_write_2d(hid_t group, const char* name, hid_t file_type, hid_t mem_type, const void* data,
                 std::size_t rows, std::size_t cols, const std::string& where);
// Writes an [n0, n1, n2] dataset from row-major data.
void h5_write_3d(hid_t group, const char* name, hid_t file_type, hid_t mem_type, const void* data,
                 std::size_t n0, std::size_t n1, std::size_t n2, const std::string& where);

// The values of an open one-dimensional integer dataset of n elements, read through int64 so
// that a value T cannot hold is reported rather than saturated by HDF5's conversion. Errors are
// prefixed by `where`; `type_name` names T in them ("uint8", "int32").
template <typename T>
std::vector<T> h5_read_ints(hid_t dset, std::size_t n, const char* type_name,
                            const std::string& where) {
  H5Handle type(H5Dget_type(dset));
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    throw TraceError(where + ": element type must be an integer type");
  h5_check_written(dset, 8.0 * static_cast<double>(n), where);
  std::vector<std::int64_t> wide(n);
  if (n > 0 && H5Dread(dset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, wide.data()) < 0)
    throw TraceError(where + ": cannot read (truncated or corrupt file?): " + hdf5_last_error());
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (wide[i] < std::numeric_limits<T>::min() || wide[i] > std::numeric_limits<T>::max())
      throw TraceError(where + ": value " + std::to_string(wide[i]) + " at position " +
                       std::to_string(i) + " does not fit the format's " + type_name);
    out[i] = static_cast<T>(wide[i]);
  }
  return out;
}

}  // namespace kvsim
