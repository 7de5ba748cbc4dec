"""llama.cpp's tokenizers, read from GGUF metadata: GPT-2 byte-level BPE and SentencePiece (SPM).

Bit-exact with llama.cpp's ``src/llama-vocab.cpp`` and ``src/unicode.cpp`` (checked against
llama-cpp-python 0.3.36 on SmolLM2's, Gemma 3's and Qwen3's vocabularies; see
``tests/data/tokenizer/README.md``):

* vocabulary loading (``llama_vocab::impl::load``): token attributes from ``tokenizer.ggml.token_type``,
  special ids with their per-model defaults, ``add_bos`` / ``add_eos`` rules, text-based detection of
  EOT / EOM / FIM tokens, and the end-of-generation (EOG) set;
* ``tokenizer_st_partition``: special tokens matched whole (longest first) before pre-tokenization;
  control and unknown tokens only when ``parse_special`` is on, user-defined tokens always;
* BPE (``llm_tokenizer_bpe_session``): the pre-tokenizer regexes chosen by ``tokenizer.ggml.pre``,
  GPT-2 byte-to-unicode encoding, merges applied lowest rank first (leftmost on ties);
* SPM (``llm_tokenizer_spm_session``): spaces escaped to U+2581, a space prefix at the start and after
  every special token, bigrams merged highest score first, byte fallback ``<0xXX>``;
* ``token_to_piece`` and ``detokenize`` (the ``clean_spaces`` passes and the stream decoder are in
  ``detokenize.py``).

The pre-tokenizers (the regexes, the Unicode collapse, GPT-2's byte table) are in ``pretokenize.py``.
The vocabulary's tables (token types and attributes, GGUF keys, special-token texts) are in ``vocab.py``.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterable, Mapping, Sequence

from quantkit.errors import ModelError
from quantkit.model.detokenize import StreamDecoder, clean_spaces, decode_gpt2_text
from quantkit.model.pretokenize import (BYTE_ENCODE_TABLE, BYTE_TO_UNICODE, PRE_TOKENIZERS, SplitRegex,
                                        split_regexes, split_words)
from quantkit.model.vocab import (ALWAYS_RENDERED, ATTR_BYTE, ATTR_CONTROL, ATTR_LSTRIP, ATTR_NORMAL, ATTR_RSTRIP,
                                  ATTR_UNDEFINED, ATTR_UNKNOWN, ATTR_UNUSED, ATTR_USER_DEFINED, EOG_TEXTS, EOM_TEXTS,
                                  EOT_TEXTS, FIM_TEXTS, KEY_ADD_BOS, KEY_ADD_EOS, KEY_ADD_PREFIX, KEY_ADD_SEP,
                                  KEY_MERGES, KEY_MODEL, KEY_PRE, KEY_SCORES, KEY_TOKENS, KEY_TOKEN_TYPE,
                                  SPECIAL_KEYS, TYPE_TO_ATTR)

_C_ISSPACE = frozenset(" \t\n\v\f\r")


# --------------------------------------------------------------------------------------------------
# the tokenizer
# --------------------------------------------------------------------------------------------------


class Tokenizer:
    """A llama.cpp vocabulary: ``encode`` / ``decode`` / ``token_to_piece`` and the special ids.

    Build it with :meth:`from_metadata` (a ``dict`` of GGUF key -> plain Python value) or
    :meth:`from_gguf` (a path or a ``gguf.GGUFReader``).
    """

    def __init__(self, meta: Mapping[str, Any]):
        model = meta.get(KEY_MODEL)
        if model is None:
            raise ModelError(f"tokenizer: metadata has no {KEY_MODEL} key")
        model = str(model)
        if model == "llama":
            self.kind = "spm"
        elif model == "gpt2":
            self.kind = "bpe"
        else:
            raise ModelError(f"tokenizer: unsupported {KEY_MODEL} {model!r} (supported: 'gpt2', 'llama')")
        self.model = model
        self.pre = str(meta.get(KEY_PRE) or "")

        tokens = meta.get(KEY_TOKENS)
        if tokens is None:
            raise ModelError(f"tokenizer: metadata has no {KEY_TOKENS} key")
        tokens = [str(t) for t in tokens]
        n = len(tokens)
        if n == 0:
            raise ModelError(f"tokenizer: {KEY_TOKENS} is empty")

        # defaults per vocab type
        self.add_space_prefix = False
        self.add_bos = False
        self.add_eos = False
        self.add_sep = False
        self.clean_spaces = False
        self.ignore_merges = False
        ids: dict[str, int | None] = {k: None for k, _ in SPECIAL_KEYS}
        self._regexes: tuple[SplitRegex, ...] = ()
        self._ranks: dict[tuple[str, str], int] = {}
        if self.kind == "spm":
            ids.update(bos=1, eos=2, unk=0)
            self.add_space_prefix = True
            self.add_bos = True
        else:
            merges = meta.get(KEY_MERGES)
            if merges is None:
                raise ModelError(f"tokenizer: gpt2 tokenizer but metadata has no {KEY_MERGES} key")
            ranks = self._ranks
            for i, word in enumerate(merges):
                word = str(word)
                pos = word.find(" ", 1)
                pair = (word[:pos], word[pos + 1 :]) if pos >= 0 else ("", "")
                ranks.setdefault(pair, i)
            ids.update(bos=11, eos=11)
            self.clean_spaces = True
            pre = self.pre or "default"
            rule = PRE_TOKENIZERS.get(pre)
            if rule is None:
                raise ModelError(f"tokenizer: unsupported pre-tokenizer {KEY_PRE} = {pre!r}")
            self.clean_spaces = rule.clean_spaces
            self.ignore_merges = rule.ignore_merges
            self.add_bos = rule.add_bos
            if rule.no_bos:
                ids["bos"] = None
            self._regexes = split_regexes(rule.kind)
        if KEY_ADD_PREFIX in meta:
            self.add_space_prefix = bool(meta[KEY_ADD_PREFIX])

        scores = meta.get(KEY_SCORES)
        if scores is not None and len(scores) < n:
            raise ModelError(f"tokenizer: {KEY_SCORES} has {len(scores)} entries for {n} tokens")
        types = meta.get(KEY_TOKEN_TYPE)
        if types is not None and len(types) < n:
            raise ModelError(f"tokenizer: {KEY_TOKEN_TYPE} has {len(types)} entries for {n} tokens")

        self.tokens: list[str] = []
        self.scores: list[float] = [float(s) for s in scores[:n]] if scores is not None else [0.0] * n
        self.attrs: list[int] = []
        self.token_to_id: dict[str, int] = {}
        for i, word in enumerate(tokens):
            if not word:
                word = f"[EMPTY_{i}]"
            if word in self.token_to_id:
                raise ModelError(f"tokenizer: duplicate token {word!r} with ids {self.token_to_id[word]} and {i}")
            self.token_to_id[word] = i
            self.tokens.append(word)
            self.attrs.append(TYPE_TO_ATTR.get(int(types[i]), ATTR_UNDEFINED) if types is not None
                              else ATTR_NORMAL)

        # special ids: defaults out of range are disabled; GGUF values in range override
        for name, key in SPECIAL_KEYS:
            if ids[name] is not None and ids[name] >= n:
                ids[name] = None
            if key in meta and meta[key] is not None:
                v = int(meta[key])
                if 0 <= v < n:
                    ids[name] = v
        if KEY_ADD_BOS in meta:
            self.add_bos = bool(meta[KEY_ADD_BOS])
        if KEY_ADD_EOS in meta:
            self.add_eos = bool(meta[KEY_ADD_EOS])
        if KEY_ADD_SEP in meta:
            self.add_sep = bool(meta[KEY_ADD_SEP])
        for flag, name, key in ((self.add_bos, "bos", KEY_ADD_BOS), (self.add_eos, "eos", KEY_ADD_EOS),
                                (self.add_sep, "sep", KEY_ADD_SEP)):
            if flag and ids[name] is None:
                raise ModelError(f"tokenizer: {key} is true but the model has no {name} token")

        self._detect_special(ids)
        self.bos_id: int | None = ids["bos"]
        self.eos_id: int | None = ids["eos"]
        self.eot_id: int | None = ids["eot"]
        self.eom_id: int | None = ids["eom"]
        self.unk_id: int | None = ids["unk"]
        self.sep_id: int | None = ids["sep"]
        self.pad_id: int | None = ids["pad"]
        self.mask_id: int | None = ids["mask"]
        self.fim_ids: dict[str, int | None] = {k: ids[k] for k in FIM_TEXTS}

        # special tokens matched whole by tokenizer_st_partition, longest first
        special = [i for i, a in enumerate(self.attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        special.sort(key=lambda i: -len(self.tokens[i].encode("utf-8")))
        self.special_ids: tuple[int, ...] = tuple(special)

        name = str(meta.get("general.name") or "").lower()
        if "phi-3" in name or "phi3" in name:
            for i in special:
                self.attrs[i] |= ATTR_RSTRIP
            for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if t not in self.token_to_id:
                    raise ModelError(f"tokenizer: phi-3 model without the {t!r} token")
                j = self.token_to_id[t]
                self.attrs[j] = (self.attrs[j] | ATTR_RSTRIP) if on else (self.attrs[j] & ~ATTR_RSTRIP)

        self._pieces: list[bytes | None] = [None] * n
        self._word_cache: dict[str, tuple[int, ...]] = {}
        self.nl_id: int | None = self._find_newline()

    # ---------------------------------------------------------------- construction helpers

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """From a plain mapping of GGUF keys to Python values (lists for arrays)."""
        return cls(meta)

    @staticmethod
    def metadata_from_reader(reader: Any) -> dict[str, Any]:
        """The ``tokenizer.*`` and ``general.name`` fields of a ``gguf.GGUFReader`` as plain values."""
        out: dict[str, Any] = {}
        for key, field in reader.fields.items():
            if key.startswith("tokenizer.") or key in ("general.name", "general.architecture"):
                out[key] = field.contents()
        return out

    @classmethod
    def from_gguf(cls, source: Any) -> "Tokenizer":
        """From a GGUF path (read with quantkit's reader: 0.5 s for Gemma 3's 262k-token vocabulary,
        where ``gguf.GGUFReader`` alone takes 10 s) or an open ``gguf.GGUFReader``."""
        if hasattr(source, "fields"):
            return cls(cls.metadata_from_reader(source))
        from quantkit.formats.gguf_io import GGUFModel

        with GGUFModel(source) as g:
            return cls(g.metadata)

    def _detect_special(self, ids: dict[str, int | None]) -> None:
        """EOT / EOM / FIM / EOG detection by token text, as llama_vocab::impl::load does it.

        llama.cpp walks an unordered_map, so when several texts match it keeps whichever it meets
        first; here the lowest id wins."""
        t2i = self.token_to_id
        attrs = self.attrs

        def mark_control(i: int) -> None:
            attrs[i] |= ATTR_CONTROL

        def detect(name: str, texts: Iterable[str]) -> None:
            if ids[name] is not None:
                return
            found = sorted(t2i[t] for t in texts if t in t2i)
            if found:
                ids[name] = found[0]
                mark_control(found[0])

        detect("eot", EOT_TEXTS)
        detect("eom", EOM_TEXTS)
        for name, texts in FIM_TEXTS.items():
            detect(name, texts)

        for i, a in enumerate(attrs):
            if a & ATTR_CONTROL and not a & ATTR_UNUSED and "unused" in self.tokens[i]:
                attrs[i] = a | ATTR_UNUSED

        eog: set[int] = set()
        for name in ("fim_pad", "fim_rep", "fim_sep"):
            if ids[name] is not None:
                eog.add(ids[name])
        for t in EOG_TEXTS:
            if t in t2i:
                eog.add(t2i[t])
                mark_control(t2i[t])
        for t in ALWAYS_RENDERED:
            if t in t2i:
                attrs[t2i[t]] = ATTR_USER_DEFINED
        for name in ("eos", "eot", "eom"):
            if ids[name] is not None:
                eog.add(ids[name])

        texts = {self.tokens[i]: i for i in eog}
        if "<|end|>" in texts and (("<|return|>" in texts and "<|call|>" in texts)
                                   or ("<|calls|>" in texts and "<|flush|>" in texts)):
            j = texts["<|end|>"]
            eog.discard(j)
            attrs[j] = ATTR_USER_DEFINED
        if "<|tool_response>" in texts and "</s>" in texts:
            j = texts["</s>"]
            eog.discard(j)
            attrs[j] = ATTR_NORMAL
        self.eog_ids: frozenset[int] = frozenset(eog)

    def _find_newline(self) -> int | None:
        if self.kind == "spm":
            try:
                return self._byte_to_token(0x0A)
            except ModelError:
                return self.pad_id
        ids = self.encode("\n", add_special=False)
        return ids[0] if ids else self.pad_id

    # ---------------------------------------------------------------- properties

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def is_eog(self, token_id: int) -> bool:
        """True for tokens that end generation (EOS, EOT, EOM and e.g. ``<|im_end|>``)."""
        return token_id in self.eog_ids

    def is_control(self, token_id: int) -> bool:
        return bool(self.attrs[token_id] & ATTR_CONTROL)

    # ---------------------------------------------------------------- encode

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids for ``text``, as ``llama_tokenize(vocab, text, add_special, parse_special)``.

        ``add_special`` adds BOS / EOS only where the model asks for them (``add_bos`` / ``add_eos``);
        ``parse_special`` lets control tokens written in the text (e.g. ``<|im_start|>``) become
        their ids instead of being tokenized as plain text."""
        fragments = self._partition(text, parse_special)
        out: list[int] = []
        if self.kind == "spm":
            is_prev_special = True
            if add_special and self.add_bos:
                out.append(self._require(self.bos_id, "bos"))
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    is_prev_special = True
                    continue
                piece = text[frag[0] : frag[1]]
                if self.add_space_prefix and is_prev_special:
                    piece = " " + piece
                self._spm_tokenize(piece.replace(" ", "\u2581"), out)
                is_prev_special = False
            if add_special and self.add_eos:
                out.append(self._require(self.eos_id, "eos"))
            return out

        if add_special and self.add_bos:
            out.append(self._require(self.bos_id, "bos"))
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
            else:
                self._bpe_tokenize(text[frag[0] : frag[1]], out)
        if add_special and self.add_eos:
            out.append(self._require(self.eos_id, "eos"))
        return out

    @staticmethod
    def _require(token_id: int | None, name: str) -> int:
        if token_id is None:
            raise ModelError(f"tokenizer: the model asks for a {name} token but has none")
        return token_id

    def _partition(self, text: str, parse_special: bool) -> list[int | tuple[int, int]]:
        """tokenizer_st_partition: split ``text`` around whole special tokens, longest first."""
        frags: list[int | tuple[int, int]] = [(0, len(text))] if text else []
        for sid in self.special_ids:
            attr = self.attrs[sid]
            if not parse_special and attr & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue
            stext = self.tokens[sid]
            if not any(not isinstance(f, int) and text.find(stext, f[0], f[1]) >= 0 for f in frags):
                continue
            new: list[int | tuple[int, int]] = []
            for f in frags:
                if isinstance(f, int):
                    new.append(f)
                    continue
                start, end = f
                while True:
                    m = text.find(stext, start, end)
                    if m < 0:
                        if start < end:
                            new.append((start, end))
                        break
                    left_end = m
                    if attr & ATTR_LSTRIP:
                        while left_end > start and text[left_end - 1] in _C_ISSPACE:
                            left_end -= 1
                    if left_end > start:
                        new.append((start, left_end))
                    new.append(sid)
                    start = m + len(stext)
                    if attr & ATTR_RSTRIP:
                        while start < end and text[start] in _C_ISSPACE:
                            start += 1
                    if start >= end:
                        break
            frags = new
        return frags

    # ---- BPE

    def _bpe_tokenize(self, text: str, out: list[int]) -> None:
        cache = self._word_cache
        for word in split_words(text, self._regexes):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe_word(word.encode("utf-8").decode("latin-1").translate(BYTE_ENCODE_TABLE))
                if len(cache) < 1_000_000:
                    cache[word] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> tuple[int, ...]:
        """llm_tokenizer_bpe_session::tokenize for one byte-encoded word."""
        t2i = self.token_to_id
        if self.ignore_merges and word in t2i:
            return (t2i[word],)
        syms = list(word)
        n = len(syms)
        if n > 1:
            ranks = self._ranks
            nxt = list(range(1, n)) + [-1]
            prv = list(range(-1, n - 1))
            heap: list[tuple[int, int, int, str]] = []
            for i in range(n - 1):
                r = ranks.get((syms[i], syms[i + 1]))
                if r is not None:
                    heap.append((r, i, i + 1, syms[i] + syms[i + 1]))
            heapq.heapify(heap)
            while heap:
                _, left, right, merged = heapq.heappop(heap)
                a, b = syms[left], syms[right]
                if not a or not b or a + b != merged:
                    continue
                syms[left] = merged
                syms[right] = ""
                nr = nxt[right]
                nxt[left] = nr
                if nr >= 0:
                    prv[nr] = left
                pl = prv[left]
                if pl >= 0:
                    r = ranks.get((syms[pl], merged))
                    if r is not None:
                        heapq.heappush(heap, (r, pl, left, syms[pl] + merged))
                if nr >= 0:
                    r = ranks.get((merged, syms[nr]))
                    if r is not None:
                        heapq.heappush(heap, (r, left, nr, merged + syms[nr]))
        ids: list[int] = []
        for s in syms:
            if not s:
                continue
            tid = t2i.get(s)
            if tid is not None:
                ids.append(tid)
                continue
            for byte in s.encode("utf-8"):  # llama.cpp looks each byte up as a one-byte token
                if byte < 0x80:
                    tid = t2i.get(chr(byte))
                    if tid is not None:
                        ids.append(tid)
        return tuple(ids)

    # ---- SPM

    def _spm_tokenize(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm_session::tokenize (text already has spaces escaped)."""
        if not text:
            return
        t2i = self.token_to_id
        scores = self.scores
        syms = list(text)
        n = len(syms)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []

        def try_add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            merged = syms[left] + syms[right]
            tid = t2i.get(merged)
            if tid is None:
                return
            # max score first, then the leftmost; size identifies stale entries
            heapq.heappush(heap, (-scores[tid], left, right, len(merged)))

        for i in range(1, n):
            try_add(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or len(a) + len(b) != size:
                continue
            syms[left] = a + b
            syms[right] = ""
            nr = nxt[right]
            nxt[left] = nr
            if nr >= 0:
                prv[nr] = left
            try_add(prv[left], left)
            try_add(left, nr)

        i = 0
        while i != -1:
            s = syms[i]
            tid = t2i.get(s)
            if tid is not None:
                out.append(tid)
            else:
                for byte in s.encode("utf-8"):
                    out.append(self._byte_to_token(byte))
            i = nxt[i]

    def _byte_to_token(self, byte: int) -> int:
        t2i = self.token_to_id
        if self.kind == "spm":
            tid = t2i.get(f"<0x{byte:02X}>")
            if tid is None and byte < 0x80:
                tid = t2i.get(chr(byte))
        else:
            tid = t2i.get(BYTE_TO_UNICODE[byte])
        if tid is None:
            raise ModelError(f"tokenizer: vocabulary has no token for byte 0x{byte:02X}")
        return tid

    # ---------------------------------------------------------------- decode

    def _piece(self, token_id: int) -> bytes:
        """token_to_piece(special=True) without lstrip, cached (token_to_piece_for_cache)."""
        p = self._pieces[token_id]
        if p is not None:
            return p
        attr = self.attrs[token_id]
        text = self.tokens[token_id]
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            p = text.encode("utf-8")
        elif attr & ATTR_NORMAL:
            if self.kind == "spm":
                p = text.replace("\u2581", " ").encode("utf-8")
            else:
                p = decode_gpt2_text(text)
        elif attr & ATTR_BYTE:
            p = bytes([int(text[3:5], 16)])
        else:
            p = b""
        self._pieces[token_id] = p
        return p

    def token_to_piece(self, token_id: int, special: bool = True, lstrip: int = 0) -> bytes:
        """The bytes of one token, as ``llama_token_to_piece(vocab, id, buf, n, lstrip, special)``.

        With ``special=False`` control and unknown tokens give ``b""``. A piece can end inside a
        UTF-8 character: join pieces before decoding, or use :class:`StreamDecoder`."""
        if not 0 <= token_id < len(self.tokens):
            raise ModelError(f"tokenizer: token id {token_id} out of range [0, {len(self.tokens)})")
        if not special and self.attrs[token_id] & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        p = self._piece(token_id)
        while lstrip > 0 and p[:1] == b" ":
            p = p[1:]
            lstrip -= 1
        return p

    def detokenize(self, ids: Sequence[int], remove_special: bool = False, unparse_special: bool = False) -> bytes:
        """``llama_detokenize``: pieces joined, the SPM leading space removed, then ``clean_spaces``."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        for tid in ids:
            parts.append(self.token_to_piece(tid, special=unparse_special, lstrip=int(remove_space)))
            remove_space = False
        text = bytearray(b"".join(parts))
        if self.clean_spaces:
            text = clean_spaces(text)
        return bytes(text)

    def decode(self, ids: Sequence[int], special: bool = False) -> str:
        """Text of ``ids`` (llama_detokenize with ``unparse_special=special``); invalid UTF-8 -> U+FFFD."""
        return self.detokenize(ids, unparse_special=special).decode("utf-8", errors="replace")

    def stream(self, special: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, special=special)
