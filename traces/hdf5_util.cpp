#include "traces/hdf5_util.hpp"

#include <cstdio>
#include <mutex>
#include <sstream>

namespace kvsim {

H5Handle& H5Handle::operator=(H5Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void H5Handle::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      H5Fclose(id_);
      break;
    case H5I_GROUP:
      H5Gclose(id_);
      break;
    case H5I_DATASET:
      H5Dclose(id_);
      break;
    case H5I_DATASPACE:
      H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      H5Tclose(id_);
      break;
    case H5I_ATTR:
      H5Aclose(id_);
      break;
    case H5I_GENPROP_LST:
      H5Pclose(id_);
      break;
    default:
      break;
  }
  id_ = H5I_INVALID_HID;
}

void silence_hdf5_errors() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

namespace {

std::string with_thousands(unsigned long long n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// HDF5's own words for a short file ("truncated file: eof = 1000000, sblock->base_addr = 0,
// stored_eof = 2615448") in the user's: how long the file is and how long it should be.
std::string plain_hdf5_message(const std::string& msg) {
  unsigned long long eof = 0, base = 0, stored = 0;
  if (std::sscanf(msg.c_str(),
                  "truncated file: eof = %llu, sblock->base_addr = %llu, stored_eof = %llu", &eof,
                  &base, &stored) == 3 &&
      base == 0)
    return "the file is " + with_thousands(eof) + " bytes, its header says " +
           with_thousands(stored) + ": a truncated copy?";
  return msg;
}

}  // namespace

std::string hdf5_last_error() {
  std::string msg;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
        auto* out = static_cast<std::string*>(data);
        if (err->desc && *err->desc) *out = err->desc;  // keep the innermost
        return 0;
      },
      &msg);
  H5Eclear2(H5E_DEFAULT);
  return plain_hdf5_message(msg);
}

bool h5_path_exists(hid_t loc, const std::string& path) {
  // H5Lexists fails on a missing intermediate group, so walk the path one link at a time.
  std::string prefix;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    prefix += prefix.empty() ? part : "/" + part;
    if (H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

bool h5_attr_exists(hid_t obj, const std::string& name) {
  return H5Aexists(obj, name.c_str()) > 0;
}

namespace {

template <typename T>
std::optional<T> read_numeric_attr(hid_t obj, const std::string& name, hid_t mem_type,
                                   H5T_class_t want) {
  if (!h5_attr_exists(obj, name)) return std::nullopt;
  H5Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
  H5Handle type(H5Aget_type(attr.get()));
  H5Handle space(H5Aget_space(attr.get()));
  const H5T_class_t cls = H5Tget_class(type.get());
  const bool ok_class = cls == want || (want == H5T_FLOAT && cls == H5T_INTEGER);
  if (!ok_class || H5Sget_simple_extent_npoints(space.get()) != 1)
    throw TraceError("attribute '" + name + "' must be a single " +
                     (want == H5T_INTEGER ? "integer" : "number"));
  T value{};
  if (H5Aread(attr.get(), mem_type, &value) < 0)
    throw TraceError("cannot read attribute '" + name + "': " + hdf5_last_error());
  return value;
}

}  // namespace

std::optional<std::int64_t> h5_read_int_attr(hid_t obj, const std::string& name) {
  return read_numeric_attr<std::int64_t>(obj, name, H5T_NATIVE_INT64, H5T_INTEGER);
}

std::optional<std::vector<std::int64_t>> h5_read_int_array_attr(hid_t obj, const std::string& name,
                                                                std::size_t most) {
  if (!h5_attr_exists(obj, name)) return std::nullopt;
  H5Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
  H5Handle type(H5Aget_type(attr.get()));
  H5Handle space(H5Aget_space(attr.get()));
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (H5Tget_class(type.get()) != H5T_INTEGER || n < 1 || static_cast<std::size_t>(n) > most)
    throw TraceError("attribute '" + name + "' must be 1 to " + std::to_string(most) + " integers");
  std::vector<std::int64_t> values(static_cast<std::size_t>(n));
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, values.data()) < 0)
    throw TraceError("cannot read attribute '" + name + "': " + hdf5_last_error());
  return values;
}

std::optional<double> h5_read_float_attr(hid_t obj, const std::string& name) {
  return read_numeric_attr<double>(obj, name, H5T_NATIVE_DOUBLE, H5T_FLOAT);
}

std::optional<std::string> h5_read_string_attr(hid_t obj, const std::string& name) {
  if (!h5_attr_exists(obj, name)) return std::nullopt;
  H5Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
  H5Handle type(H5Aget_type(attr.get()));
  H5Handle space(H5Aget_space(attr.get()));
  if (H5Tget_class(type.get()) != H5T_STRING || H5Sget_simple_extent_npoints(space.get()) != 1)
    throw TraceError("attribute '" + name + "' must be a single string");
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Handle mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* buf = nullptr;
    if (H5Aread(attr.get(), mem.get(), &buf) < 0)
      throw TraceError("cannot read attribute '" + name + "': " + hdf5_last_error());
    std::string out = buf ? buf : "";
    H5free_memory(buf);
    return out;
  }
  const std::size_t size = H5Tget_size(type.get());
  std::string out(size, '\0');
  if (H5Aread(attr.get(), type.get(), out.data()) < 0)
    throw TraceError("cannot read attribute '" + name + "': " + hdf5_last_error());
  out.resize(out.find('\0') == std::string::npos ? size : out.find('\0'));
  return out;
}

namespace {

void write_attr(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type,
                const void* data) {
  if (h5_attr_exists(obj, name)) H5Adelete(obj, name.c_str());
  H5Handle space(H5Screate(H5S_SCALAR));
  H5Handle attr(H5Acreate2(obj, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid() || H5Awrite(attr.get(), mem_type, data) < 0)
    throw TraceError("cannot write attribute '" + name + "': " + hdf5_last_error());
}

}  // namespace

void h5_write_int_attr(hid_t obj, const std::string& name, std::int64_t value) {
  write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void h5_write_int_array_attr(hid_t obj, const std::string& name,
                             const std::vector<std::int64_t>& values) {
  if (h5_attr_exists(obj, name)) H5Adelete(obj, name.c_str());
  const hsize_t n = values.size();
  H5Handle space(H5Screate_simple(1, &n, nullptr));
  H5Handle attr(
      H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, values.data()) < 0)
    throw TraceError("cannot write attribute '" + name + "': " + hdf5_last_error());
}

void h5_write_float_attr(hid_t obj, const std::string& name, double value) {
  write_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void h5_write_string_attr(hid_t obj, const std::string& name, const std::string& value) {
  H5Handle type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  const char* ptr = value.c_str();
  write_attr(obj, name, type.get(), type.get(), &ptr);
}

std::vector<hsize_t> h5_dataset_shape(hid_t dset) {
  H5Handle space(H5Dget_space(dset));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(rank > 0 ? rank : 0);
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

hid_t h5_float16_type() {
  static hid_t type = [] {
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(t, 15, 10, 5, 0, 10);
    H5Tset_size(t, 2);
    H5Tset_ebias(t, 15);
    H5Tlock(t);
    return t;
  }();
  return type;
}

void h5_check_written(hid_t dset, double declared_bytes, const std::string& where) {
  const double stored = static_cast<double>(H5Dget_storage_size(dset));
  if (declared_bytes > 0 && (stored == 0 || declared_bytes > 1032.0 * stored + 65536.0))
    throw TraceError(where + ": declares " +
                     std::to_string(static_cast<long long>(declared_bytes)) + " bytes but stores " +
                     std::to_string(static_cast<long long>(stored)) +
                     " (its data were never fully written)");
}

H5Handle h5_untimed_plist(hid_t plist_class) {
  H5Handle p(H5Pcreate(plist_class));
  H5Pset_obj_track_times(p.get(), false);
  return p;
}

H5Handle h5_require_group(hid_t loc, const std::string& path) {
  std::string prefix;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    prefix += prefix.empty() ? part : "/" + part;
    if (H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Handle g(H5Gcreate2(loc, prefix.c_str(), H5P_DEFAULT,
                            h5_untimed_plist(H5P_GROUP_CREATE).get(), H5P_DEFAULT));
      if (!g.valid())
        throw TraceError("cannot create group '" + prefix + "': " + hdf5_last_error());
    }
  }
  H5Handle g(H5Gopen2(loc, path.c_str(), H5P_DEFAULT));
  if (!g.valid()) throw TraceError("cannot open group '" + path + "': " + hdf5_last_error());
  return g;
}

H5I_type_t h5_object_kind(hid_t loc, const std::string& path) {
  if (!h5_path_exists(loc, path)) return H5I_BADID;
  H5Handle obj(H5Oopen(loc, path.c_str(), H5P_DEFAULT));
  if (!obj.valid()) {
    hdf5_last_error();
    return H5I_BADID;
  }
  return H5Iget_type(obj.get());
}

std::vector<std::string> h5_group_members(hid_t loc, const std::string& path) {
  H5Handle group(H5Gopen2(loc, path.c_str(), H5P_DEFAULT));
  std::vector<std::string> names;
  H5G_info_t info;
  if (!group.valid() || H5Gget_info(group.get(), &info) < 0) return names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr,
                                           0, H5P_DEFAULT);
    if (len < 0) throw TraceError("cannot list group '" + path + "': " + hdf5_last_error());
    std::string name(len, '\0');
    H5Lget_name_by_idx(group.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), len + 1,
                       H5P_DEFAULT);
    names.push_back(name);
  }
  return names;
}

namespace {
void write_dataset(hid_t group, const char* name, hid_t file_type, hid_t mem_type, const void* data,
                   int rank, const hsize_t* dims, const std::string& where) {
  H5Handle space(H5Screate_simple(rank, dims, nullptr));
  H5Handle d(H5Dcreate2(group, name, file_type, space.get(), H5P_DEFAULT,
                        h5_untimed_plist(H5P_DATASET_CREATE).get(), H5P_DEFAULT));
  hsize_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[i];
  if (!d.valid() || (n > 0 && H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
    throw TraceError(where + ": cannot write dataset '" + name + "': " + hdf5_last_error());
}
}  // namespace

void h5_write_1d(hid_t group, const char* name, hid_t file_type, hid_t mem_type, const void* data,
                 std::size_t n, const std::string& where) {
  const hsize_t dims[1] = {n};
  write_dataset(group, name, file_type, mem_type, data, 1, dims, where);
}

void h5_write_2d(hid_t group, const char* name, hid_t file_type, hid_t mem_type, const void* data,
                 std::size_t rows, std::size_t cols, const std::string& where) {
  const hsize_t dims[2] = {rows, cols};
  write_dataset(group, name, file_type, mem_type, data, 2, dims, where);
}

void h5_write_3d(hid_t group, const char* name, hid_t file_type, hid_t mem_type, const void* data,
                 std::size_t n0, std::size_t n1, std::size_t n2, const std::string& where) {
  const hsize_t dims[3] = {n0, n1, n2};
  write_dataset(group, name, file_type, mem_type, data, 3, dims, where);
}

}  // namespace kvsim
