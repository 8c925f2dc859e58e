// Read-only access to one safetensors file through a memory mapping.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
// (tensor name -> {dtype, shape, data_offsets}, plus an optional
// "__metadata__" object of strings), then the raw little-endian data;
// data_offsets are [begin, end) relative to the first byte after the header.
// Open() validates all of it, so the views it hands out are always inside
// the mapping and exactly as large as their dtype and shape say.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flotilla {

enum class DType { kBF16, kF16, kF32, kF64, kU8, kI8, kI16, kI32, kI64, kBool };

// "BF16" -> DType::kBF16, ...; an error naming the string for anything else.
absl::StatusOr<DType> ParseDType(absl::string_view name);
const char* DTypeName(DType dtype);
int64_t DTypeSize(DType dtype);  // bytes per element

// "[2, 3, 4]"
std::string ShapeString(const std::vector<int64_t>& shape);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping
  int64_t nbytes = 0;
  int64_t num_elements() const { return DTypeSize(dtype) == 0 ? 0 : nbytes / DTypeSize(dtype); }
};

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates the header. Errors name the file and
  // what is wrong (truncated, not JSON, unknown dtype, offsets out of range,
  // overlapping tensors, size that does not match the shape, ...).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  // Validates a file image already in memory (`origin` names it in errors).
  // The returned object views `bytes`, which must outlive it.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(const uint8_t* bytes,
                                                                int64_t size,
                                                                const std::string& origin);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // In the order of their data offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor of that name.
  const TensorInfo* Find(absl::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  int64_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  absl::Status ParseHeader();

  std::string path_;
  void* mapping_ = nullptr;  // owned when non-null (munmap on destruction)
  const uint8_t* bytes_ = nullptr;
  int64_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// One tensor's name, dtype and shape: what a configuration implies
// (ExpectedTensors) and what a safetensors header says of it.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
};

// Writes a safetensors file at `path`: the header of `specs` in this order
// (padded to 8 bytes, metadata {"format": "pt"}), then each tensor's data,
// written by `write_data(i, out)`, which must write exactly DTypeSize(dtype)
// bytes per element of specs[i]. PERMISSION_DENIED when `path` cannot be
// created, INTERNAL when a write fails.
absl::Status WriteSafetensorsWith(
    const std::string& path, const std::vector<TensorSpec>& specs,
    const std::function<void(size_t i, std::ostream& out)>& write_data);

// One tensor for WriteSafetensors: `data` holds its elements (DTypeSize(dtype)
// bytes each, as many as the shape says).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes `tensors` in this order as one safetensors file at `path` (the
// header padded to 8 bytes, metadata {"format": "pt"}).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace flotilla
