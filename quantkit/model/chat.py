"""Which chat template ``run --chat`` renders, and llama.cpp's built-in formats written as jinja.

llama.cpp renders the GGUF's ``tokenizer.chat_template`` and, for a model without one, ChatML
(``llama_chat_apply_template`` with a null template, and ``common_chat_templates_init``). It also
knows formats by name (``--chat-template gemma``), rendered by ``llm_chat_apply_template`` in
``src/llama-chat.cpp``. The two named here are written as jinja so that one renderer
(:func:`render_chat`) serves both cases; tests/test_chat.py checks their
output against llama.cpp's for the same messages. No heavy imports: the CLI lists the names.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from quantkit.errors import ModelError

KEY_CHAT_TEMPLATE = "tokenizer.chat_template"

# C isspace, which llama.cpp's trim() uses (jinja's plain trim would also strip Unicode spaces)
_TRIM = "' \\t\\n\\v\\f\\r'"

BUILTIN_TEMPLATES: dict[str, str] = {
    # LLM_CHAT_TEMPLATE_CHATML
    "chatml": (
        "{%- for m in messages -%}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    ),
    # LLM_CHAT_TEMPLATE_GEMMA: system text (trimmed) goes in front of the next non-model turn,
    # "assistant" is called "model", every content is trimmed
    "gemma": (
        "{%- set ns = namespace(system='') -%}"
        "{%- for m in messages -%}"
        "{%- if m.role == 'system' -%}"
        "{%- set ns.system = ns.system + (m.content | trim(" + _TRIM + ")) -%}"
        "{%- else -%}"
        "{%- set role = 'model' if m.role == 'assistant' else m.role -%}"
        "{{- '<start_of_turn>' + role + '\\n' -}}"
        "{%- if ns.system and role != 'model' -%}{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}{%- endif -%}"
        "{{- (m.content | trim(" + _TRIM + ")) + '<end_of_turn>\\n' -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
    ),
}
DEFAULT_TEMPLATE = "chatml"  # what llama.cpp uses when the model has no tokenizer.chat_template


def chat_template(metadata: Mapping[str, Any], name: str | None = None) -> str:
    """The jinja source to render: the built-in ``name`` if given, else the model's
    ``tokenizer.chat_template``, else ChatML (llama.cpp's fallback)."""
    if name is not None:
        if name not in BUILTIN_TEMPLATES:
            raise ModelError(f"unknown chat template {name!r} (built-in: {', '.join(sorted(BUILTIN_TEMPLATES))})")
        return BUILTIN_TEMPLATES[name]
    template = metadata.get(KEY_CHAT_TEMPLATE)
    return str(template) if template else BUILTIN_TEMPLATES[DEFAULT_TEMPLATE]


def render_chat(template: str, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "") -> str:
    """Render a chat template (jinja source) for ``messages`` (dicts with ``role`` and ``content``).

    A sandboxed jinja2 environment (templates come from model files) with what Hugging Face templates
    expect: ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``strftime_now`` and ``tojson``."""
    import datetime
    import json

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ModelError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda v, indent=None, **_: json.dumps(v, ensure_ascii=False, indent=indent)
    try:
        tpl = env.from_string(template)
        return tpl.render(messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                          bos_token=bos_token, eos_token=eos_token)
    except jinja2.TemplateError as e:
        raise ModelError(f"chat template: {type(e).__name__}: {e}") from None
