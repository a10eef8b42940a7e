"""Minimal byte-level BPE encoder reading a HF tokenizer.json (GPT-2 regex, ASCII-exact)."""
import json, re
PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+|_+""")
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~")+1))+list(range(ord("¡"), ord("¬")+1))+list(range(ord("®"), ord("ÿ")+1))
    cs = bs[:]; n = 0
    for b in range(256):
        if b not in bs: bs.append(b); cs.append(256+n); n += 1
    return dict(zip(bs, map(chr, cs)))
class BPE:
    def __init__(self, path):
        t = json.load(open(path))
        self.vocab = t["model"]["vocab"]
        self.inv = {v: k for k, v in self.vocab.items()}
        for a in t["added_tokens"]: self.inv[a["id"]] = a["content"]
        self.ranks = {tuple(m if isinstance(m, list) else m.split(" ")): i for i, m in enumerate(t["model"]["merges"])}
        self.b2u = bytes_to_unicode(); self.u2b = {v: k for k, v in self.b2u.items()}
        self.cache = {}
    def bpe(self, word):
        if word in self.cache: return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            best = None
            for i in range(len(parts)-1):
                r = self.ranks.get((parts[i], parts[i+1]))
                if r is not None and (best is None or r < best[0]): best = (r, i)
            if best is None: break
            i = best[1]; parts = parts[:i] + [parts[i]+parts[i+1]] + parts[i+2:]
        ids = [self.vocab[p] for p in parts]
        self.cache[word] = ids
        return ids
    def encode(self, text):
        out = []
        for piece in PAT.findall(text):
            out += self.bpe("".join(self.b2u[b] for b in piece.encode("utf-8")))
        return out
    def decode(self, ids):
        s = "".join(self.inv[i] for i in ids if i > 1)
        return bytes(self.u2b[c] for c in s).decode("utf-8", "replace")
