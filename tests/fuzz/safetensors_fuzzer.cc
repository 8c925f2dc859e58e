// Fuzz target: the safetensors header parser. Input: a whole file image
// (8-byte header length, JSON header, data), validated by
// SafetensorsFile::Parse exactly as Open() validates a mapped file.
// Properties: nothing crashes; every tensor of an accepted file lies inside
// the image, is as large as its dtype and shape say, does not overlap the
// next one, and is found by name.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "worker/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using flotilla::SafetensorsFile;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Parse(data, static_cast<int64_t>(size), "fuzz input");
  if (!file.ok()) {
    FLOTILLA_FUZZ_CHECK(!file.status().message().empty());
    return 0;
  }
  const uint8_t* end = data + size;
  const uint8_t* prev_end = nullptr;
  unsigned sum = 0;
  for (const flotilla::TensorInfo& t : (*file)->tensors()) {
    FLOTILLA_FUZZ_CHECK(t.nbytes >= 0);
    int64_t elements = 1;
    for (int64_t d : t.shape) {
      FLOTILLA_FUZZ_CHECK(d >= 0);
      elements *= d;  // Parse refuses shapes whose size overflows
    }
    FLOTILLA_FUZZ_CHECK(elements * flotilla::DTypeSize(t.dtype) == t.nbytes);
    if (t.nbytes > 0) {
      FLOTILLA_FUZZ_CHECK(t.data >= data && t.data + t.nbytes <= end);
      if (prev_end != nullptr) FLOTILLA_FUZZ_CHECK(t.data >= prev_end);
      prev_end = t.data + t.nbytes;
      sum += t.data[0] + t.data[t.nbytes - 1];  // ASan checks both ends are readable
    }
    FLOTILLA_FUZZ_CHECK((*file)->Find(t.name) == &t);
    (void)flotilla::ShapeString(t.shape);
  }
  for (const auto& [key, value] : (*file)->metadata())
    sum += static_cast<unsigned>(key.size() + value.size());
  (void)sum;
  return 0;
}
