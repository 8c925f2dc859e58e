#include "worker/model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/model/test_util.h"

namespace flotilla {
namespace {

using testing_util::FileImage;
using testing_util::ScratchDir;
using testing_util::WriteBytes;

std::string Data(size_t n) {
  std::string d(n, '\0');
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<char>(i * 7 + 1);
  return d;
}

// Opens an image written to disk; the error message (empty when it opened).
std::string OpenError(const std::string& image) {
  std::string path = ScratchDir("f") + "/x.safetensors";
  WriteBytes(path, image);
  auto f = SafetensorsFile::Open(path);
  return f.ok() ? "" : std::string(f.status().message());
}

TEST(Safetensors, ReadsTensorsAndMetadata) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]},)"
      R"("a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
      R"("s":{"dtype":"F32","shape":[],"data_offsets":[16,20]},)"
      R"("e":{"dtype":"U8","shape":[0,5],"data_offsets":[20,20]}})";
  const std::string data = Data(20);
  std::string path = ScratchDir("f") + "/ok.safetensors";
  WriteBytes(path, FileImage(header, data));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->tensors().size(), 4u);
  EXPECT_EQ((*f)->tensors()[0].name, "a");  // ordered by data offset
  const TensorInfo* b = (*f)->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b->nbytes, 12);
  EXPECT_EQ(b->num_elements(), 6);
  EXPECT_EQ(std::memcmp(b->data, data.data() + 4, 12), 0);
  const TensorInfo* s = (*f)->Find("s");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->nbytes, 4);
  EXPECT_EQ((*f)->Find("e")->nbytes, 0);
  EXPECT_EQ((*f)->Find("missing"), nullptr);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
}

TEST(Safetensors, ParseWorksOnMemory) {
  const std::string image =
      FileImage(R"({"t":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", Data(16));
  auto f = SafetensorsFile::Parse(reinterpret_cast<const uint8_t*>(image.data()),
                                  static_cast<int64_t>(image.size()), "mem");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->Find("t")->dtype, DType::kF64);
}

TEST(Safetensors, KnowsEveryDtype) {
  for (const char* name : {"BF16", "F16", "F32", "F64", "U8", "I8", "I16", "I32", "I64", "BOOL"}) {
    auto d = ParseDType(name);
    ASSERT_TRUE(d.ok()) << name;
    EXPECT_STREQ(DTypeName(*d), name);
    EXPECT_GT(DTypeSize(*d), 0);
  }
}

TEST(Safetensors, MissingFileIsNotFound) {
  auto f = SafetensorsFile::Open(ScratchDir("f") + "/nope.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("nope.safetensors"), absl::string_view::npos);
}

TEST(Safetensors, EmptyFileIsTruncated) {
  EXPECT_NE(OpenError("").find("truncated"), std::string::npos) << OpenError("");
}

TEST(Safetensors, ShorterThanLengthFieldIsTruncated) {
  EXPECT_NE(OpenError("\x10\0\0").find("truncated"), std::string::npos);
}

TEST(Safetensors, HeaderLengthPastEndOfFile) {
  const std::string header = R"({"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  std::string err = OpenError(FileImage(header, Data(4), 1000));
  EXPECT_NE(err.find("runs past the end of the file"), std::string::npos) << err;
}

TEST(Safetensors, HugeHeaderLengthIsRejected) {
  std::string err = OpenError(FileImage("{}", "", int64_t{1} << 60));
  EXPECT_NE(err.find("header length"), std::string::npos) << err;
}

TEST(Safetensors, ZeroHeaderLength) {
  std::string err = OpenError(FileImage("", Data(4)));
  EXPECT_NE(err.find("header length is 0"), std::string::npos) << err;
}

TEST(Safetensors, BadJson) {
  std::string err = OpenError(FileImage(R"({"t":{"dtype":"U8",)", Data(4)));
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
}

TEST(Safetensors, HeaderNotAnObject) {
  std::string err = OpenError(FileImage("[1,2,3]", ""));
  EXPECT_NE(err.find("not a JSON object"), std::string::npos) << err;
}

// A header of one tensor whose entry is wrong: the error names the problem
// (and, where it matters, the tensor).
TEST(Safetensors, BadTensorEntriesSayWhatIsWrong) {
  const struct {
    const char* header;
    int data_bytes;
    std::vector<std::string> problems;  // each must stand in the error
  } cases[] = {
      {R"({"t":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})",
       4,
       {"unsupported dtype 'F8_E4M3'", "'t'"}},
      {R"({"t":{"shape":[4],"data_offsets":[0,4]}})", 4, {"missing dtype"}},
      {R"({"t":{"dtype":"U8","data_offsets":[0,4]}})", 4, {"missing shape"}},
      {R"({"t":{"dtype":"U8","shape":[4]}})", 4, {"data_offsets must be [begin, end]"}},
      {R"({"t":7})", 4, {"not an object"}},
      {R"({"t":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", 4, {"negative"}},
      {R"({"t":{"dtype":"U8","shape":[1.5],"data_offsets":[0,4]}})", 4, {"non-integer"}},
      {R"({"t":{"dtype":"I64","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
       4,
       {"overflows"}},
      {R"({"t":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
       8,
       {"run past the end of the data area"}},
      {R"({"t":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", 8, {"invalid data_offsets"}},
      {R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[-2,0]}})", 8, {"invalid data_offsets"}},
      {R"({"t":{"dtype":"BF16","shape":[4],"data_offsets":[0,6]}})",
       8,
       {"needs 8 bytes", "hold 6"}},
      // A well-formed header whose data was cut short.
      {R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 10, {"truncated"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.header);
    const std::string err = OpenError(FileImage(c.header, Data(c.data_bytes)));
    for (const std::string& problem : c.problems) {
      EXPECT_NE(err.find(problem), std::string::npos) << err;
    }
  }
}

// Found while fuzzing the header parser (tests/fuzz/safetensors_fuzzer.cc;
// corpus/safetensors/crash_deep_shape, 100,000 deep, is what the ASan build
// overflows on): the error for a bad dimension dumped the whole shape, which
// recursed once per nesting level, so a shape nested a million deep overflowed
// the stack.
TEST(Safetensors, DeeplyNestedShapeIsAnErrorNotACrash) {
  const size_t depth = 1000000;
  const std::string header = R"({"t":{"dtype":"U8","shape":)" + std::string(depth, '[') +
                             std::string(depth, ']') + R"(,"data_offsets":[0,0]}})";
  const std::string image = FileImage(header, "");
  auto f = SafetensorsFile::Parse(reinterpret_cast<const uint8_t*>(image.data()),
                                  static_cast<int64_t>(image.size()), "deep");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("shape dimension 0 is negative or non-integer (array)"),
            std::string::npos)
      << f.status().message();
}

TEST(Safetensors, OverlappingTensors) {
  std::string err = OpenError(FileImage(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                                        R"("b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
                                        Data(12)));
  EXPECT_NE(err.find("overlap"), std::string::npos) << err;
  // b lies inside a, with a smaller tensor between them in offset order.
  err = OpenError(FileImage(R"({"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},)"
                            R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
                            R"("c":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
                            Data(12)));
  EXPECT_NE(err.find("overlap"), std::string::npos) << err;
}

TEST(Safetensors, BadMetadata) {
  std::string err = OpenError(FileImage(R"({"__metadata__":{"format":1}})", ""));
  EXPECT_NE(err.find("__metadata__"), std::string::npos) << err;
  err = OpenError(FileImage(R"({"__metadata__":[]})", ""));
  EXPECT_NE(err.find("__metadata__"), std::string::npos) << err;
}

// Damaged headers either fail to parse or describe tensors that lie inside
// the buffer; nothing in between (and nothing crashes, even under ASan).
TEST(Safetensors, RandomHeaderDamageIsCaught) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
      R"("b":{"dtype":"F32","shape":[3],"data_offsets":[12,24]}})";
  const std::string good = FileImage(header, Data(24));
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  int rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string image = good;
    const int edits = 1 + static_cast<int>(next() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = next() % (8 + header.size());
      image[pos] = static_cast<char>(next() & 0xff);
    }
    if (next() % 4 == 0) image.resize(next() % image.size());
    auto f = SafetensorsFile::Parse(reinterpret_cast<const uint8_t*>(image.data()),
                                    static_cast<int64_t>(image.size()), "damaged");
    if (!f.ok()) {
      ++rejected;
      EXPECT_FALSE(f.status().message().empty());
      continue;
    }
    const uint8_t* lo = reinterpret_cast<const uint8_t*>(image.data());
    for (const TensorInfo& t : (*f)->tensors()) {
      ASSERT_GE(t.data, lo);
      ASSERT_LE(t.data + t.nbytes, lo + image.size());
      ASSERT_EQ(t.nbytes, t.num_elements() * DTypeSize(t.dtype));
    }
  }
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace flotilla
