#include "worker/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla {
namespace {

using nlohmann::json;

// A header larger than this is certainly corrupt (real ones are < 1 MB).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

struct DTypeEntry {
  const char* name;
  DType dtype;
  int64_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {"BF16", DType::kBF16, 2}, {"F16", DType::kF16, 2}, {"F32", DType::kF32, 4},
    {"F64", DType::kF64, 8},   {"U8", DType::kU8, 1},   {"I8", DType::kI8, 1},
    {"I16", DType::kI16, 2},   {"I32", DType::kI32, 4}, {"I64", DType::kI64, 8},
    {"BOOL", DType::kBool, 1},
};

}  // namespace

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported dtype '", name, "' (known: BF16 F16 F32 F64 U8 I8 I16 I32 I64 BOOL)"));
}

const char* DTypeName(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

int64_t DTypeSize(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, static_cast<size_t>(size_));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = st.st_size;
  if (f->size_ < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": truncated safetensors file: ", f->size_, " bytes, shorter than the 8-byte header length"));
  }
  void* m = mmap(nullptr, static_cast<size_t>(f->size_), PROT_READ, MAP_PRIVATE, fd, 0);
  int mmap_errno = errno;
  ::close(fd);
  if (m == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(mmap_errno)));
  }
  f->mapping_ = m;
  f->bytes_ = static_cast<const uint8_t*>(m);
  FLOTILLA_RETURN_IF_ERROR(f->ParseHeader());
  return f;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(const uint8_t* bytes,
                                                                        int64_t size,
                                                                        const std::string& origin) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = origin;
  f->bytes_ = bytes;
  f->size_ = size;
  FLOTILLA_RETURN_IF_ERROR(f->ParseHeader());
  return f;
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status SafetensorsFile::ParseHeader() {
  auto fail = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", parts...));
  };
  if (size_ < 8) {
    return fail("truncated safetensors file: ", size_,
                " bytes, shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes_[i];
  const uint64_t avail = static_cast<uint64_t>(size_) - 8;
  if (n == 0) return fail("header length is 0");
  if (n > kMaxHeaderBytes) return fail("header length ", n, " is implausibly large (corrupt file?)");
  if (n > avail) {
    return fail("header length ", n, " runs past the end of the file (", avail,
                " bytes after the length field): truncated or corrupt");
  }
  const char* hdr = reinterpret_cast<const char*>(bytes_ + 8);
  json j = json::parse(hdr, hdr + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail("header is not valid JSON");
  if (!j.is_object()) return fail("header is not a JSON object");

  const uint8_t* data = bytes_ + 8 + n;
  const int64_t data_size = static_cast<int64_t>(avail - n);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return fail("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return fail("__metadata__['", m.key(), "'] is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) return fail("tensor '", name, "': entry is not an object");
    TensorInfo t;
    t.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) return fail("tensor '", name, "': missing dtype");
    absl::StatusOr<DType> dtype = ParseDType(dt->get<std::string>());
    if (!dtype.ok()) return fail("tensor '", name, "': ", dtype.status().message());
    t.dtype = *dtype;
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) return fail("tensor '", name, "': missing shape");
    int64_t elems = 1;
    bool overflow = false;
    for (const json& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        // Not sh->dump(): a dimension may be nested arbitrarily deep, and
        // dumping recurses once per level (a stack overflow on a crafted header).
        return fail("tensor '", name, "': shape dimension ", t.shape.size(),
                    " is negative or non-integer (", d.type_name(), ")");
      }
      int64_t dim = d.get<int64_t>();
      t.shape.push_back(dim);
      overflow |= __builtin_mul_overflow(elems, dim, &elems);
    }
    int64_t want_bytes = 0;
    overflow |= __builtin_mul_overflow(elems, DTypeSize(t.dtype), &want_bytes);
    if (overflow) return fail("tensor '", name, "': shape ", sh->dump(), " overflows");
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_integer() || !(*off)[1].is_number_integer()) {
      return fail("tensor '", name, "': data_offsets must be [begin, end]");
    }
    const int64_t begin = (*off)[0].get<int64_t>();
    const int64_t end = (*off)[1].get<int64_t>();
    if (begin < 0 || end < begin) {
      return fail("tensor '", name, "': invalid data_offsets [", begin, ", ", end, "]");
    }
    if (end > data_size) {
      return fail("tensor '", name, "': data_offsets [", begin, ", ", end,
                  "] run past the end of the data area (", data_size, " bytes): truncated file?");
    }
    if (end - begin != want_bytes) {
      return fail("tensor '", name, "': ", DTypeName(t.dtype), " ", ShapeString(t.shape), " needs ",
                  want_bytes, " bytes but data_offsets [", begin, ", ", end, "] hold ", end - begin);
    }
    t.data = data + begin;
    t.nbytes = want_bytes;
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data != b.data ? a.data < b.data : a.nbytes < b.nbytes;
  });
  const TensorInfo* last = nullptr;  // the non-empty tensor reaching furthest so far
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    if (t.nbytes > 0) {
      if (last != nullptr && t.data < last->data + last->nbytes) {
        return fail("tensors '", last->name, "' and '", t.name, "' overlap in the data area");
      }
      if (last == nullptr || t.data + t.nbytes > last->data + last->nbytes) last = &t;
    }
    index_[t.name] = i;
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensorsWith(
    const std::string& path, const std::vector<TensorSpec>& specs,
    const std::function<void(size_t i, std::ostream& out)>& write_data) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  for (const TensorSpec& t : specs) {
    int64_t bytes = DTypeSize(t.dtype);
    for (int64_t d : t.shape) bytes *= d;
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot create"));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (size_t i = 0; i < specs.size(); ++i) write_data(i, out);
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed (disk full?)"));
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  return WriteSafetensorsWith(path, specs, [&](size_t i, std::ostream& out) {
    int64_t bytes = DTypeSize(specs[i].dtype);
    for (int64_t d : specs[i].shape) bytes *= d;
    out.write(static_cast<const char*>(tensors[i].data), static_cast<std::streamsize>(bytes));
  });
}

}  // namespace flotilla
