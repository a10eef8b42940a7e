#include "tokenizer/protobuf_reader.h"

#include <cstring>
#include <utility>

#include "core/error.h"

namespace entropyinfer {

ProtobufReader::ProtobufReader(std::string_view bytes, std::string source_name, size_t base_offset)
    : bytes_(bytes), source_name_(std::move(source_name)), base_offset_(base_offset) {}

void ProtobufReader::fail(const std::string& problem) const {
  throw Error(source_name_ + ": corrupt protobuf data at byte " + std::to_string(file_offset()) +
              ": " + problem);
}

uint64_t ProtobufReader::read_raw_varint() {
  uint64_t value = 0;
  // A varint is at most 10 bytes (70 bits of payload for a 64-bit value).
  for (int shift = 0; shift < 70; shift += 7) {
    if (position_ >= bytes_.size()) fail("varint runs past the end of the data (file truncated?)");
    const auto byte = static_cast<uint8_t>(bytes_[position_++]);
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return value;
  }
  fail("varint longer than 10 bytes");
}

bool ProtobufReader::next_field() {
  if (position_ >= bytes_.size()) return false;
  const uint64_t tag = read_raw_varint();
  const uint64_t number = tag >> 3;
  const auto type = static_cast<uint8_t>(tag & 7);
  if (number == 0 || number > 0x1FFFFFFF) fail("invalid field number " + std::to_string(number));
  if (type > 5) fail("invalid wire type " + std::to_string(type));
  field_number_ = static_cast<uint32_t>(number);
  wire_type_ = static_cast<WireType>(type);
  return true;
}

void ProtobufReader::expect_wire_type(WireType expected, const char* what) const {
  if (wire_type_ != expected) {
    fail("field " + std::to_string(field_number_) + " should be a " + what + " but has wire type " +
         std::to_string(static_cast<int>(wire_type_)));
  }
}

uint64_t ProtobufReader::read_varint() {
  expect_wire_type(WireType::kVarint, "varint");
  return read_raw_varint();
}

int32_t ProtobufReader::read_int32() {
  // Truncation to 32 bits is how protobuf defines int32 decoding (negative values arrive as 64-bit
  // two's complement varints).
  return static_cast<int32_t>(static_cast<uint32_t>(read_varint()));
}

bool ProtobufReader::read_bool() { return read_varint() != 0; }

float ProtobufReader::read_float() {
  expect_wire_type(WireType::kFixed32, "32-bit float");
  if (bytes_.size() - position_ < 4) fail("float runs past the end of the data (file truncated?)");
  // The wire format is little-endian, like every host this project targets.
  uint32_t bits = 0;
  for (int i = 0; i < 4; ++i) {
    bits |= static_cast<uint32_t>(static_cast<uint8_t>(bytes_[position_ + i])) << (8 * i);
  }
  position_ += 4;
  float value = 0.0f;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

std::string_view ProtobufReader::read_bytes() {
  expect_wire_type(WireType::kLengthDelimited, "length-delimited value");
  const uint64_t length = read_raw_varint();
  if (length > bytes_.size() - position_) {
    fail("field " + std::to_string(field_number_) + " claims " + std::to_string(length) +
         " bytes but only " + std::to_string(bytes_.size() - position_) +
         " remain (file truncated?)");
  }
  const std::string_view value = bytes_.substr(position_, static_cast<size_t>(length));
  position_ += static_cast<size_t>(length);
  return value;
}

ProtobufReader ProtobufReader::read_message() {
  const std::string_view body = read_bytes();
  const size_t body_offset = base_offset_ + position_ - body.size();
  return ProtobufReader(body, source_name_, body_offset);
}

void ProtobufReader::skip() {
  switch (wire_type_) {
    case WireType::kVarint:
      read_raw_varint();
      return;
    case WireType::kFixed64:
      if (bytes_.size() - position_ < 8) fail("64-bit value runs past the end of the data");
      position_ += 8;
      return;
    case WireType::kLengthDelimited:
      read_bytes();
      return;
    case WireType::kFixed32:
      if (bytes_.size() - position_ < 4) fail("32-bit value runs past the end of the data");
      position_ += 4;
      return;
    case WireType::kStartGroup:
    case WireType::kEndGroup:
      // Groups are deprecated and never used by SentencePiece; meeting one means the data is not a
      // model file.
      fail("unexpected group field " + std::to_string(field_number_));
  }
  fail("invalid wire type");
}

}  // namespace entropyinfer
