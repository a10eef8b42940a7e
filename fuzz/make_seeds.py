#!/usr/bin/env python3
"""Writes small, valid seed inputs for the binary and vocabulary formats into OUT/<target>/.

A byte-level vocabulary needs a token for each of the 256 bytes, so even the smallest valid
tokenizer file is a few kilobytes: these are generated at run time by scripts/fuzz.sh rather than
committed. Usage: make_seeds.py OUT
"""
import base64
import json
import pathlib
import struct
import sys


def write(out, target, name, data):
    folder = out / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def safetensors(tensors, metadata=None):
    """tensors: (name, dtype, shape, bytes) in file order."""
    header, data = {}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def llama2c_checkpoint(dim, hidden, layers, heads, kv_heads, vocab, seq_len):
    """Header plus zero weights in llama2.c's order; a negative vocab adds an untied classifier."""
    head_dim = dim // heads
    kv_dim = head_dim * kv_heads
    floats = abs(vocab) * dim + layers * dim  # embedding, rms_att
    floats += layers * (dim * dim + 2 * kv_dim * dim + dim * dim)  # wq, wk, wv, wo
    floats += layers * dim + 3 * layers * hidden * dim  # rms_ffn, w1, w2, w3
    floats += dim + seq_len * head_dim  # rms_final, freq_cis real and imaginary halves
    if vocab < 0:
        floats += abs(vocab) * dim
    header = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, seq_len)
    return header + struct.pack(f"<{floats}f", *(0.01 * (i % 7) for i in range(floats)))


def llama2c_tokenizer(extra_tokens):
    texts = ["<unk>", "\n<s>\n", "\n</s>\n"] + [f"<0x{b:02X}>" for b in range(256)]
    texts += extra_tokens
    encoded = [t.encode() for t in texts]
    out = struct.pack("<i", max(len(t) for t in encoded))
    for index, text in enumerate(encoded):
        score = -1e10 if index < 259 else -float(index)
        out += struct.pack("<fi", score, len(text)) + text
    return out


def tiktoken(extra_tokens):
    tokens = [bytes([b]) for b in range(256)] + [t.encode() for t in extra_tokens]
    return "".join(f"{base64.b64encode(t).decode()} {rank}\n"
                   for rank, t in enumerate(tokens)).encode()


def byte_level_alphabet():
    """GPT-2's byte -> character mapping (printable Latin-1 stays, the rest moves to U+0100+)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(
        range(0xAE, 0x100))
    mapping, moved = {}, 256
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(moved)
            moved += 1
    return mapping


def tokenizer_json():
    alphabet = byte_level_alphabet()

    def spell(text):
        return "".join(alphabet[b] for b in text.encode())

    vocab = {alphabet[b]: b for b in range(256)}
    merges = [("h", "e"), (" ", "w"), ("he", "l"), ("hel", "lo"), ("l", "o"), (" w", "or")]
    for left, right in merges:
        vocab.setdefault(spell(left + right), len(vocab))
    vocab.setdefault(spell("lo"), len(vocab))
    for text in ("o", "or"):
        vocab.setdefault(spell(text), len(vocab))
    root = {
        "added_tokens": [
            {"id": len(vocab), "content": "<|endoftext|>", "special": True},
            {"id": len(vocab) + 1, "content": "<tool_call>", "special": False},
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "post_processor": {"type": "ByteLevel"},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab,
                  "merges": [f"{spell(a)} {spell(b)}" for a, b in merges]},
    }
    return json.dumps(root, ensure_ascii=False).encode()


def varint(value):
    out = b""
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def field_bytes(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_varint(number, value):
    return varint(number << 3) + varint(value & 0xFFFFFFFFFFFFFFFF)


def sentencepiece_model(pieces, byte_fallback):
    """pieces: (text, score, type) with sentencepiece's types (1 normal ... 6 byte)."""
    out = b""
    for text, score, kind in pieces:
        piece = field_bytes(1, text.encode()) + varint(2 << 3 | 5) + struct.pack("<f", score)
        out += field_bytes(1, piece + field_varint(3, kind))
    trainer = field_varint(3, 2) + field_varint(35, int(byte_fallback))
    trainer += field_varint(40, 0) + field_varint(41, 1) + field_varint(42, 2)
    normalizer = field_bytes(1, b"identity") + field_varint(3, 1) + field_varint(4, 1)
    return out + field_bytes(2, trainer) + field_bytes(3, normalizer)


def main():
    out = pathlib.Path(sys.argv[1])

    write(out, "safetensors_header", "three_dtypes.safetensors", safetensors(
        [("a.weight", "F32", [2], struct.pack("<2f", 1.0, -2.0)),
         ("b.weight", "BF16", [1, 2], b"\x80\x3f\x00\xc0"),
         ("empty", "F16", [0, 3], b"")],
        {"format": "pt"}))
    write(out, "safetensors_header", "one_tensor.safetensors",
          safetensors([("x", "F16", [1], b"\x00\x3c")]))

    write(out, "llama2c_checkpoint", "tied.bin", llama2c_checkpoint(4, 8, 2, 2, 1, 5, 3))
    write(out, "llama2c_checkpoint", "untied.bin", llama2c_checkpoint(4, 4, 1, 1, 1, -3, 2))

    # 6 is the longest token's length and so the first byte: the fuzz target's second vocabulary
    # size (256 + 2 * 6 = 268) then matches the file.
    write(out, "llama2c_tokenizer", "bytes_and_merges.bin",
          llama2c_tokenizer([" ", "a", "b", "ab", " ab", "c", "ca", "cab", " cab"]))

    write(out, "tiktoken", "bytes_and_merges.tiktoken",
          tiktoken(["ab", " a", " ab", "  ", "12", "123", "\u00e9", "<|", "|>"]))

    write(out, "tokenizer_json", "byte_level_tiny.json", tokenizer_json())

    normal = [("\u2581", -1.0, 1), ("a", -2.0, 1), ("b", -3.0, 1), ("\u2581a", -4.0, 1),
              ("ab", -5.0, 1), ("\u2581ab", -6.0, 1), ("<user>", 0.0, 4), ("zz", -7.0, 5),
              ("z", -8.0, 1), ("\u2581zz", -9.0, 1)]
    specials = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    write(out, "sentencepiece_model", "bpe_tiny.model",
          sentencepiece_model(specials + normal, byte_fallback=False))
    byte_pieces = [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    write(out, "sentencepiece_model", "bpe_byte_fallback.model",
          sentencepiece_model(specials + byte_pieces + normal, byte_fallback=True))


if __name__ == "__main__":
    main()
