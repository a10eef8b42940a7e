"""A stand-in for the `tokenizers` package, for CPU smoke tests of training/train.py only.

Where `tokenizers` cannot be installed (no PyPI), this module lets train.py run end to end: the
"trained" vocabulary is the special tokens, the 256 bytes and the most frequent GPT-2 pre-tokens
of the training text; encoding looks each pre-token up whole and falls back to its bytes. It is
not BPE and its tokenizer.json is not a Hugging Face file: never use it for a real model.
"""

import json
import re

_PRETOKEN = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
__version__ = "stand-in"


class Encoding:
    def __init__(self, ids):
        self.ids = ids


class Tokenizer:
    def __init__(self, model=None):
        self.tokens, self.index, self.special_count = [], {}, 0
        self.pre_tokenizer = self.decoder = self.post_processor = None

    def train_from_iterator(self, iterator, trainer=None, length=None):
        counts = {}
        for text in iterator:
            for piece in _PRETOKEN.findall(text):
                if len(piece) > 1:
                    counts[piece] = counts.get(piece, 0) + 1
        specials = list(trainer.special_tokens)
        words = sorted(counts, key=lambda w: (-counts[w], w))[: trainer.vocab_size - 256 - len(specials)]
        self._set(specials + [bytes([b]).decode("latin-1") for b in range(256)] + words, len(specials))

    def _set(self, tokens, special_count):
        self.tokens, self.special_count = tokens, special_count
        self.index = {t: i for i, t in enumerate(tokens)}

    def save(self, path):
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"standin_tokens": self.tokens, "special_count": self.special_count}, handle)

    @staticmethod
    def from_file(path):
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        tokenizer = Tokenizer()
        tokenizer._set(data["standin_tokens"], data["special_count"])
        return tokenizer

    def token_to_id(self, token):
        return self.index.get(token)

    def get_vocab_size(self, with_added_tokens=True):
        return len(self.tokens)

    def encode(self, text, add_special_tokens=True):
        ids = [0] if add_special_tokens else []
        for piece in _PRETOKEN.findall(text):
            found = self.index.get(piece) if len(piece) > 1 else None
            if found is not None:
                ids.append(found)
            else:
                ids.extend(self.special_count + b for b in piece.encode("utf-8"))
        return Encoding(ids)

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            if i >= self.special_count:
                token = self.tokens[i]
                out += token.encode("latin-1") if i < self.special_count + 256 else token.encode("utf-8")
        return out.decode("utf-8", errors="replace")


class _Settings:
    def __init__(self, *args, **kwargs):
        self.__dict__.update(kwargs)


class models:  # noqa: N801 - mirrors the package's module names
    BPE = _Settings


class decoders:  # noqa: N801
    ByteLevel = _Settings


class processors:  # noqa: N801
    TemplateProcessing = _Settings


class trainers:  # noqa: N801
    BpeTrainer = _Settings


class pre_tokenizers:  # noqa: N801
    class ByteLevel(_Settings):
        @staticmethod
        def alphabet():
            return []
