// A minimal reader for the protocol buffers wire format: enough to walk a SentencePiece ModelProto
// without the protobuf library. It reads one message (a byte range) field by field; nested messages
// are read by opening a new reader on a length-delimited field's bytes. Every malformed or
// truncated input throws Error naming the file and the byte offset, so a corrupt file can never be
// read out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace entropyinfer {

class ProtobufReader {
 public:
  enum class WireType : uint8_t {
    kVarint = 0,
    kFixed64 = 1,
    kLengthDelimited = 2,
    kStartGroup = 3,
    kEndGroup = 4,
    kFixed32 = 5,
  };

  // `source_name` names the file in error messages; `base_offset` is where `bytes` starts inside
  // the file, so that offsets in messages are file offsets even for nested messages.
  ProtobufReader(std::string_view bytes, std::string source_name, size_t base_offset = 0);

  // Advances to the next field; false at the end of the message. After it returns true, exactly one
  // of the read_* / skip calls below must consume the field's value.
  bool next_field();
  uint32_t field_number() const { return field_number_; }
  WireType wire_type() const { return wire_type_; }

  uint64_t read_varint();
  int32_t read_int32();  // int32/enum fields: negative values are sign-extended 10-byte varints
  bool read_bool();
  float read_float();             // fixed32
  std::string_view read_bytes();  // length-delimited: strings, bytes, nested messages
  // A reader over a length-delimited field holding a nested message.
  ProtobufReader read_message();
  void skip();  // skips the current field's value, whatever its wire type

  // Offset in the source file of the next unread byte (for error messages).
  size_t file_offset() const { return base_offset_ + position_; }
  const std::string& source_name() const { return source_name_; }

 private:
  [[noreturn]] void fail(const std::string& problem) const;
  void expect_wire_type(WireType expected, const char* what) const;
  uint64_t read_raw_varint();

  std::string_view bytes_;
  std::string source_name_;
  size_t base_offset_ = 0;
  size_t position_ = 0;
  uint32_t field_number_ = 0;
  WireType wire_type_ = WireType::kVarint;
};

}  // namespace entropyinfer
