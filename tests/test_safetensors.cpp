// The safetensors reader: round trips in each supported dtype, and one test per kind of corrupt
// file, each asserting the message names the file and the tensor at fault.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "model/safetensors.h"
#include "safetensors_writer.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using testing::encode_floats;
using testing::error_message_of;
using testing::mentions_all;
using testing::TempFolder;
using testing::TensorToWrite;

std::string raw_u16(const std::vector<uint16_t>& values) {
  std::string bytes;
  for (uint16_t value : values) {
    bytes.push_back(static_cast<char>(value & 0xff));
    bytes.push_back(static_cast<char>(value >> 8));
  }
  return bytes;
}

std::vector<float> read_f32(const SafetensorsTensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  std::memcpy(values.data(), tensor.data, tensor.byte_size);
  return values;
}

std::vector<uint16_t> read_u16(const SafetensorsTensor& tensor) {
  std::vector<uint16_t> values(static_cast<size_t>(tensor.numel()));
  std::memcpy(values.data(), tensor.data, tensor.byte_size);
  return values;
}

std::string open_error(const std::string& path) {
  return error_message_of([&] { SafetensorsFile file(path); });
}

TEST(Safetensors, RoundTripF32) {
  TempFolder folder("st-f32");
  const std::vector<float> values = {1.5f, -0.0f, 3.0e38f, -1.0e-40f, 0.1f, 7.0f};
  testing::write_safetensors(folder.file("a.safetensors"),
                             {{"weights", "F32", {2, 3}, encode_floats(values, "F32")}},
                             {{"format", "pt"}});
  SafetensorsFile file(folder.file("a.safetensors"));
  ASSERT_EQ(file.tensors().size(), 1u);
  const SafetensorsTensor* tensor = file.find("weights");
  ASSERT_NE(tensor, nullptr);
  EXPECT_EQ(tensor->dtype, TensorDtype::kF32);
  EXPECT_EQ(tensor->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(tensor->numel(), 6);
  EXPECT_EQ(tensor->byte_size, 24u);
  EXPECT_EQ(tensor->shape_string(), "[2, 3]");
  const std::vector<float> read = read_f32(*tensor);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(std::memcmp(&read[i], &values[i], 4), 0) << "element " << i;
  }
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.find("absent"), nullptr);
}

TEST(Safetensors, RoundTripBf16KnownBitPatterns) {
  TempFolder folder("st-bf16");
  // 1.0, -3.0, the smallest subnormal, the largest finite value, 0.15625.
  const std::vector<uint16_t> bits = {0x3f80, 0xc040, 0x0001, 0x7f7f, 0x3e20};
  const std::vector<float> expected = {1.0f, -3.0f, 9.18354961579912e-41f, 3.3895313892515355e38f,
                                       0.15625f};
  testing::write_safetensors(folder.file("b.safetensors"), {{"t", "BF16", {5}, raw_u16(bits)}});
  SafetensorsFile file(folder.file("b.safetensors"));
  const SafetensorsTensor& tensor = *file.find("t");
  EXPECT_EQ(tensor.dtype, TensorDtype::kBF16);
  EXPECT_EQ(tensor.byte_size, 10u);
  EXPECT_EQ(read_u16(tensor), bits);
  for (size_t i = 0; i < bits.size(); ++i) EXPECT_EQ(bf16_to_f32(bits[i]), expected[i]) << i;
}

TEST(Safetensors, RoundTripF16KnownBitPatterns) {
  TempFolder folder("st-f16");
  // 1.0, -2.0, 65504 (largest), the smallest subnormal 2^-24, 0.333251953125, -0.0.
  const std::vector<uint16_t> bits = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x3555, 0x8000};
  const std::vector<float> expected = {
      1.0f, -2.0f, 65504.0f, 5.9604644775390625e-8f, 0.333251953125f, -0.0f};
  testing::write_safetensors(folder.file("h.safetensors"), {{"t", "F16", {2, 3}, raw_u16(bits)}});
  SafetensorsFile file(folder.file("h.safetensors"));
  const SafetensorsTensor& tensor = *file.find("t");
  EXPECT_EQ(tensor.dtype, TensorDtype::kF16);
  EXPECT_EQ(read_u16(tensor), bits);
  for (size_t i = 0; i < bits.size(); ++i) {
    const float value = f16_to_f32(bits[i]);
    EXPECT_EQ(std::memcmp(&value, &expected[i], 4), 0) << i;
  }
}

TEST(Safetensors, TestWriterEncodesHalvesWithRoundToNearestEven) {
  // The test helper's f16 encoder must agree with the engine's decoder, or round-trip tests lie.
  for (uint32_t bits = 0; bits < 0x7c00; ++bits) {
    const float value = f16_to_f32(static_cast<uint16_t>(bits));
    ASSERT_EQ(testing::f32_to_f16(value), bits) << "f16 bits " << bits;
    ASSERT_EQ(testing::f32_to_f16(-value), bits | 0x8000u) << "f16 bits " << bits;
  }
  EXPECT_EQ(testing::f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);  // tie rounds to even
  EXPECT_EQ(testing::f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);  // tie rounds to even (up)
  EXPECT_EQ(testing::f32_to_f16(70000.0f), 0x7c00);
}

TEST(Safetensors, SeveralTensorsAndAnEmptyOne) {
  TempFolder folder("st-many");
  std::vector<float> rounded;
  const std::string bf16 = encode_floats({0.5f, -1.25f, 2.0f, 4.0f}, "BF16", &rounded);
  testing::write_safetensors(folder.file("m.safetensors"),
                             {{"a", "F32", {1}, encode_floats({42.0f}, "F32")},
                              {"empty", "F32", {0, 4}, ""},
                              {"b", "BF16", {2, 2}, bf16}});
  SafetensorsFile file(folder.file("m.safetensors"));
  EXPECT_EQ(file.tensors().size(), 3u);
  EXPECT_EQ(file.find("empty")->numel(), 0);
  EXPECT_EQ(read_f32(*file.find("a")), std::vector<float>{42.0f});
  EXPECT_EQ(rounded, (std::vector<float>{0.5f, -1.25f, 2.0f, 4.0f}));
  EXPECT_EQ(file.find("b")->byte_size, 8u);
  // Offsets are absolute within the file: tensor b starts 4 bytes after a.
  EXPECT_EQ(file.find("b")->file_offset, file.find("a")->file_offset + 4);
}

TEST(Safetensors, MappingSurvivesBeingTakenAway) {
  TempFolder folder("st-take");
  testing::write_safetensors(folder.file("t.safetensors"),
                             {{"x", "F32", {2}, encode_floats({1.0f, 2.0f}, "F32")}});
  SafetensorsFile file(folder.file("t.safetensors"));
  const float* data = reinterpret_cast<const float*>(file.find("x")->data);
  MappedFile mapping = file.take_mapping();
  EXPECT_GE(reinterpret_cast<const uint8_t*>(data), mapping.data());
  EXPECT_EQ(data[1], 2.0f);
}

// ------------------------------------------------------------------------------------------------
// Corrupt files

TEST(SafetensorsErrors, MissingFile) {
  EXPECT_TRUE(mentions_all(open_error("/nonexistent/entropyinfer/x.safetensors"),
                           {"/nonexistent/entropyinfer/x.safetensors"}));
}

TEST(SafetensorsErrors, FileShorterThanTheLengthField) {
  TempFolder folder("st-short");
  testing::write_file_bytes(folder.file("s.safetensors"), "abcde");
  EXPECT_TRUE(mentions_all(open_error(folder.file("s.safetensors")),
                           {folder.file("s.safetensors"), "truncated", "5 bytes"}));
}

TEST(SafetensorsErrors, EmptyFile) {
  TempFolder folder("st-empty");
  testing::write_file_bytes(folder.file("e.safetensors"), "");
  EXPECT_TRUE(mentions_all(open_error(folder.file("e.safetensors")),
                           {folder.file("e.safetensors"), "truncated"}));
}

TEST(SafetensorsErrors, HeaderLengthPastEndOfFile) {
  TempFolder folder("st-hlen");
  testing::write_safetensors_raw(folder.file("h.safetensors"), "{}", "", 1000);
  EXPECT_TRUE(
      mentions_all(open_error(folder.file("h.safetensors")),
                   {folder.file("h.safetensors"), "header length (1000 bytes)", "past the end"}));
}

TEST(SafetensorsErrors, HugeHeaderLengthDoesNotWrapAround) {
  TempFolder folder("st-hhuge");
  testing::write_safetensors_raw(folder.file("h.safetensors"), "{}", "",
                                 INT64_MAX);  // would wrap a careless 8 + length check
  EXPECT_TRUE(mentions_all(open_error(folder.file("h.safetensors")), {"past the end"}));
}

TEST(SafetensorsErrors, TruncatedInsideTheData) {
  TempFolder folder("st-trunc");
  const std::string path = folder.file("t.safetensors");
  testing::write_safetensors(path, {{"first", "F32", {4}, encode_floats({1, 2, 3, 4}, "F32")},
                                    {"second", "F32", {64}, std::string(256, '\1')}});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 100);
  EXPECT_TRUE(mentions_all(open_error(path), {path, "'second'", "out of range"}));
}

TEST(SafetensorsErrors, TruncatedInsideTheHeader) {
  TempFolder folder("st-trunch");
  const std::string path = folder.file("t.safetensors");
  testing::write_safetensors(path, {{"first", "F32", {4}, encode_floats({1, 2, 3, 4}, "F32")}});
  std::filesystem::resize_file(path, 20);
  EXPECT_TRUE(mentions_all(open_error(path), {path, "past the end"}));
}

TEST(SafetensorsErrors, HeaderNotJson) {
  TempFolder folder("st-json");
  testing::write_safetensors_raw(folder.file("j.safetensors"), "{\"a\": {\"dtype\": ", "");
  EXPECT_TRUE(mentions_all(open_error(folder.file("j.safetensors")),
                           {folder.file("j.safetensors"), "not valid JSON"}));
}

TEST(SafetensorsErrors, HeaderNotAnObject) {
  TempFolder folder("st-arr");
  testing::write_safetensors_raw(folder.file("a.safetensors"), "[1, 2]", "");
  EXPECT_TRUE(mentions_all(open_error(folder.file("a.safetensors")), {"start with '{'"}));
}

TEST(SafetensorsErrors, OffsetsOutOfRange) {
  TempFolder folder("st-range");
  testing::write_safetensors_raw(
      folder.file("r.safetensors"),
      R"({"weight": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
      std::string(16, '\0'));
  EXPECT_TRUE(mentions_all(
      open_error(folder.file("r.safetensors")),
      {folder.file("r.safetensors"), "'weight'", "[8, 24]", "out of range", "16 bytes"}));
}

TEST(SafetensorsErrors, OffsetsReversed) {
  TempFolder folder("st-rev");
  testing::write_safetensors_raw(
      folder.file("r.safetensors"),
      R"({"weight": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})",
      std::string(16, '\0'));
  EXPECT_TRUE(mentions_all(open_error(folder.file("r.safetensors")), {"'weight'", "[8, 4]"}));
}

TEST(SafetensorsErrors, OffsetsNotMatchingDtypeAndShape) {
  TempFolder folder("st-size");
  testing::write_safetensors_raw(
      folder.file("s.safetensors"),
      R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 10]}})",
      std::string(16, '\0'));
  EXPECT_TRUE(mentions_all(
      open_error(folder.file("s.safetensors")),
      {folder.file("s.safetensors"), "'w'", "BF16 [2, 3]", "needs 12 bytes", "span 10"}));
}

TEST(SafetensorsErrors, OverlappingTensors) {
  TempFolder folder("st-overlap");
  testing::write_safetensors_raw(
      folder.file("o.safetensors"),
      R"({"alpha": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
          "beta": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
      std::string(16, '\0'));
  EXPECT_TRUE(mentions_all(open_error(folder.file("o.safetensors")),
                           {folder.file("o.safetensors"), "'alpha'", "'beta'", "overlap"}));
}

TEST(SafetensorsErrors, OverlapHiddenBehindALongTensor) {
  // c lies inside a but after b: only tracking the furthest end so far catches it.
  TempFolder folder("st-overlap2");
  testing::write_safetensors_raw(folder.file("o.safetensors"),
                                 R"({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
          "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
          "c": {"dtype": "F32", "shape": [1], "data_offsets": [16, 20]}})",
                                 std::string(32, '\0'));
  EXPECT_TRUE(mentions_all(open_error(folder.file("o.safetensors")), {"overlap"}));
}

TEST(SafetensorsErrors, UnknownDtypeI8) {
  TempFolder folder("st-i8");
  testing::write_safetensors(folder.file("q.safetensors"),
                             {{"ok", "F32", {1}, encode_floats({1.0f}, "F32")},
                              {"quantized", "I8", {4}, std::string(4, '\0')}});
  EXPECT_TRUE(
      mentions_all(open_error(folder.file("q.safetensors")),
                   {folder.file("q.safetensors"), "'quantized'", "'I8'", "F32, BF16, F16"}));
}

TEST(SafetensorsErrors, UnknownDtypeF8E5M2) {
  TempFolder folder("st-f8");
  testing::write_safetensors(folder.file("f8.safetensors"),
                             {{"fp8_weight", "F8_E5M2", {8}, std::string(8, '\0')}});
  EXPECT_TRUE(mentions_all(open_error(folder.file("f8.safetensors")),
                           {"'fp8_weight'", "'F8_E5M2'", "not supported"}));
}

// FP8 E4M3 bytes are read as stored, one byte each; the OCP values of a few codes.
TEST(Safetensors, F8E4M3TensorsReadAsStored) {
  TempFolder folder("st-f8-e4m3");
  const std::string bytes = {'\x38', '\xb8', '\x7e', '\x01', '\x08', '\x00', '\x80', '\x7f'};
  testing::write_safetensors(folder.file("f8.safetensors"), {{"w", "F8_E4M3", {2, 4}, bytes}});
  SafetensorsFile file(folder.file("f8.safetensors"));
  const SafetensorsTensor& tensor = *file.find("w");
  EXPECT_EQ(tensor.dtype, TensorDtype::kF8E4M3);
  EXPECT_EQ(tensor.byte_size, 8u);
  EXPECT_EQ(fp8_e4m3_to_f32(static_cast<uint8_t>(tensor.data[0])), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(static_cast<uint8_t>(tensor.data[1])), -1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(static_cast<uint8_t>(tensor.data[2])), 448.0f);   // the largest
  EXPECT_EQ(fp8_e4m3_to_f32(static_cast<uint8_t>(tensor.data[3])), 0x1p-9f);  // least subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(static_cast<uint8_t>(tensor.data[4])), 0x1p-6f);  // least normal
  EXPECT_EQ(fp8_e4m3_to_f32(static_cast<uint8_t>(tensor.data[5])), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_f32(static_cast<uint8_t>(tensor.data[6]))));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(static_cast<uint8_t>(tensor.data[7]))));
  EXPECT_EQ(fp8_e4m3_to_f32(0x57), 15.0f);  // 1.875 x 2^(10 - 7)
  EXPECT_EQ(fp8_e4m3_to_f32(0x4f), 7.5f);   // 1.875 x 2^(9 - 7)
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 7 * 0x1p-9f);
}

TEST(SafetensorsErrors, DuplicateTensorName) {
  TempFolder folder("st-dup");
  testing::write_safetensors_raw(folder.file("d.safetensors"),
                                 R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
          "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                                 std::string(8, '\0'));
  EXPECT_TRUE(mentions_all(open_error(folder.file("d.safetensors")),
                           {folder.file("d.safetensors"), "'w'", "twice"}));
}

TEST(SafetensorsErrors, DuplicateKeysInsideAnEntryAreNotTensorNames) {
  // Only top-level keys name tensors; the duplicate detector must not look deeper.
  TempFolder folder("st-dup2");
  testing::write_safetensors_raw(folder.file("d.safetensors"),
                                 R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
          "v": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                                 std::string(8, '\0'));
  SafetensorsFile file(folder.file("d.safetensors"));
  EXPECT_EQ(file.tensors().size(), 2u);
}

TEST(SafetensorsErrors, BadShape) {
  TempFolder folder("st-shape");
  testing::write_safetensors_raw(
      folder.file("s.safetensors"),
      R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}})", std::string(8, '\0'));
  EXPECT_TRUE(mentions_all(open_error(folder.file("s.safetensors")), {"'w'", "shape [2,-1]"}));
}

TEST(SafetensorsErrors, ShapeWhoseSizeOverflows) {
  TempFolder folder("st-overflow");
  testing::write_safetensors_raw(
      folder.file("s.safetensors"),
      R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904],
                "data_offsets": [0, 0]}})",
      "");
  EXPECT_TRUE(mentions_all(open_error(folder.file("s.safetensors")), {"'w'", "too large"}));
}

TEST(SafetensorsErrors, EntryWithoutDtype) {
  TempFolder folder("st-nodtype");
  testing::write_safetensors_raw(folder.file("s.safetensors"),
                                 R"({"w": {"shape": [1], "data_offsets": [0, 4]}})",
                                 std::string(4, '\0'));
  EXPECT_TRUE(mentions_all(open_error(folder.file("s.safetensors")), {"'w'", "dtype"}));
}

TEST(SafetensorsErrors, NonStringMetadata) {
  TempFolder folder("st-meta");
  testing::write_safetensors_raw(folder.file("m.safetensors"), R"({"__metadata__": {"n": 3}})", "");
  EXPECT_TRUE(mentions_all(open_error(folder.file("m.safetensors")), {"metadata", "'n'"}));
}

TEST(SafetensorsErrors, ByteOrderMarkBeforeTheHeader) {
  TempFolder folder("st-bom");
  testing::write_safetensors_raw(folder.file("b.safetensors"),
                                 "\xEF\xBB\xBF{\"w\": {\"dtype\": \"F32\", \"shape\": [1], "
                                 "\"data_offsets\": [0, 4]}}",
                                 std::string(4, '\0'));
  EXPECT_TRUE(mentions_all(open_error(folder.file("b.safetensors")),
                           {folder.file("b.safetensors"), "start with '{'"}));
}

TEST(SafetensorsErrors, HeaderLengthOneByteShort) {
  // The header's closing brace then reads as data and every tensor starts one byte early; the
  // tensors no longer tile the data section, which is how the reader notices.
  TempFolder folder("st-short");
  const std::string header = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}} )";
  testing::write_safetensors_raw(folder.file("s.safetensors"), header, std::string(4, '\0'),
                                 static_cast<int64_t>(header.size()) - 1);
  EXPECT_TRUE(mentions_all(open_error(folder.file("s.safetensors")), {"belong to no tensor"}));
}

TEST(SafetensorsErrors, BytesBetweenTensorsBelongToNone) {
  TempFolder folder("st-hole");
  testing::write_safetensors_raw(folder.file("h.safetensors"),
                                 R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
          "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                                 std::string(12, '\0'));
  EXPECT_TRUE(mentions_all(open_error(folder.file("h.safetensors")),
                           {"data bytes 4-8", "belong to no tensor", "'b'"}));
}

TEST(SafetensorsErrors, TrailingBytesBelongToNone) {
  TempFolder folder("st-tail");
  testing::write_safetensors_raw(folder.file("t.safetensors"),
                                 R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                                 std::string(6, '\0'));
  EXPECT_TRUE(mentions_all(open_error(folder.file("t.safetensors")),
                           {"data bytes 4-6", "end of the file"}));
}

TEST(SafetensorsErrors, NumberBeyondADoubleInTheHeader) {
  TempFolder folder("st-1e400");
  testing::write_safetensors_raw(folder.file("n.safetensors"),
                                 R"({"__metadata__": {}, "x": 1e400})", "");
  EXPECT_TRUE(mentions_all(open_error(folder.file("n.safetensors")),
                           {folder.file("n.safetensors"), "not valid JSON"}));
}

TEST(SafetensorsErrors, DeeplyNestedHeader) {
  TempFolder folder("st-deep");
  const std::string header = "{\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  testing::write_safetensors_raw(folder.file("d.safetensors"), header, "");
  EXPECT_TRUE(mentions_all(open_error(folder.file("d.safetensors")), {"nests deeper than"}));
}

TEST(SafetensorsIndex, MapsTensorsToShardsInOrderOfFirstUse) {
  const SafetensorsIndex index = parse_safetensors_index(
      R"({"metadata": {"total_size": 8}, "weight_map": {"a": "s2.safetensors",
          "b": "s1.safetensors", "c": "s2.safetensors"}})",
      "index");
  ASSERT_EQ(index.shard_names.size(), 2u);
  EXPECT_EQ(index.shard_names[0], "s2.safetensors");
  ASSERT_EQ(index.entries.size(), 3u);
  EXPECT_EQ(index.entries[1].first, "b");
  EXPECT_EQ(index.entries[1].second, 1u);
}

TEST(SafetensorsIndex, RefusesHostileIndexes) {
  auto error_of = [](const std::string& text) {
    return testing::error_message_of([&] { parse_safetensors_index(text, "the index"); });
  };
  EXPECT_TRUE(mentions_all(error_of(R"({"metadata": {"total_size": 1e400}, "weight_map": {}})"),
                           {"the index", "not valid JSON"}));
  EXPECT_TRUE(mentions_all(error_of(R"({"weight_map": {"a": "x", "a": "y"}})"), {"'a'", "twice"}));
  EXPECT_TRUE(mentions_all(error_of(R"({"weight_map": {"a": "../x.safetensors"}})"),
                           {"not a file inside the model folder"}));
  EXPECT_TRUE(mentions_all(error_of(R"({"weight_map": {"a": 3}})"), {"not a file name"}));
  EXPECT_TRUE(mentions_all(error_of(R"({"weight_map": {}})"), {"empty"}));
  EXPECT_TRUE(mentions_all(error_of(std::string(100000, '[')), {"nests deeper than"}));
}

}  // namespace
}  // namespace entropyinfer
