"""The facts of a llama.cpp vocabulary that are not code: token types and attributes
(``llama_token_attr``), the GGUF tokenizer keys, and the token texts ``llama_vocab::impl::load``
recognises as end-of-turn, end-of-message, fill-in-the-middle and end-of-generation tokens when the file
does not name them (src/llama-vocab.cpp). The tokenizer that uses them is ``tokenizer.py``."""

from __future__ import annotations

# --------------------------------------------------------------------------------------------------
# token types (GGUF tokenizer.ggml.token_type) and attributes (llama_token_attr)
# --------------------------------------------------------------------------------------------------

TYPE_UNDEFINED, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = range(7)

ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_NORMALIZED = 1 << 6
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
ATTR_SINGLE_WORD = 1 << 9

TYPE_TO_ATTR = {
    TYPE_UNKNOWN: ATTR_UNKNOWN,
    TYPE_UNUSED: ATTR_UNUSED,
    TYPE_NORMAL: ATTR_NORMAL,
    TYPE_CONTROL: ATTR_CONTROL,
    TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TYPE_BYTE: ATTR_BYTE,
    TYPE_UNDEFINED: ATTR_UNDEFINED,
}

# --------------------------------------------------------------------------------------------------
# GGUF keys
# --------------------------------------------------------------------------------------------------

KEY_MODEL = "tokenizer.ggml.model"
KEY_PRE = "tokenizer.ggml.pre"
KEY_TOKENS = "tokenizer.ggml.tokens"
KEY_SCORES = "tokenizer.ggml.scores"
KEY_TOKEN_TYPE = "tokenizer.ggml.token_type"
KEY_MERGES = "tokenizer.ggml.merges"
KEY_ADD_PREFIX = "tokenizer.ggml.add_space_prefix"
KEY_ADD_BOS = "tokenizer.ggml.add_bos_token"
KEY_ADD_EOS = "tokenizer.ggml.add_eos_token"
KEY_ADD_SEP = "tokenizer.ggml.add_sep_token"

# (attribute name, GGUF key), in llama.cpp's order; the deprecated prefix/suffix/middle keys come last
# and override the fim_* ones, as there.
SPECIAL_KEYS = (
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("eot", "tokenizer.ggml.eot_token_id"),
    ("eom", "tokenizer.ggml.eom_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    ("sep", "tokenizer.ggml.seperator_token_id"),
    ("pad", "tokenizer.ggml.padding_token_id"),
    ("mask", "tokenizer.ggml.mask_token_id"),
    ("fim_pre", "tokenizer.ggml.fim_pre_token_id"),
    ("fim_suf", "tokenizer.ggml.fim_suf_token_id"),
    ("fim_mid", "tokenizer.ggml.fim_mid_token_id"),
    ("fim_pad", "tokenizer.ggml.fim_pad_token_id"),
    ("fim_rep", "tokenizer.ggml.fim_rep_token_id"),
    ("fim_sep", "tokenizer.ggml.fim_sep_token_id"),
    ("fim_pre", "tokenizer.ggml.prefix_token_id"),
    ("fim_suf", "tokenizer.ggml.suffix_token_id"),
    ("fim_mid", "tokenizer.ggml.middle_token_id"),
)

# Token texts llama.cpp recognises when the GGUF does not name the token (llama_vocab::impl::load).
EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)
EOM_TEXTS = ("<|eom_id|>",)
FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
))
ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss hack
