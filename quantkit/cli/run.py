"""``quantkit run``: generate text from a prompt with a GGUF model (llama.cpp's llama-simple / completion)."""

from __future__ import annotations

import sys
import time

import click

from quantkit.cli import interrupted_exit, main
from quantkit.cli.options import ctx_option, model_option, threads_option
from quantkit.model.chat import BUILTIN_TEMPLATES

DEFAULT_N_PREDICT = 128
DEFAULT_N_CTX = 4096


@main.command()
@model_option()
@click.option("-p", "--prompt", default=None, help="Prompt text.")
@click.option("-f", "--file", "prompt_file", type=click.File("r", encoding="utf-8"), default=None,
              help="Read the prompt from a file ('-' for stdin) instead of -p.")
@click.option("-n", "--n-predict", type=click.IntRange(min=-1), default=DEFAULT_N_PREDICT, show_default=True,
              help="Tokens to generate; -1 = until an end-of-generation token or a full context "
                   "(llama.cpp's default is -1).")
@ctx_option(type=click.IntRange(min=0), default=None,
            help=f"Context size in tokens (default: {DEFAULT_N_CTX} or the model's trained length if "
                   "smaller; 0 = the model's trained length).")
@threads_option
@click.option("--temp", type=click.FloatRange(min=0), default=0.8, show_default=True,
              help="Temperature; 0 = greedy (argmax).")
@click.option("--top-k", type=click.IntRange(min=0), default=40, show_default=True,
              help="Keep the K most likely tokens (0 = off).")
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=0.95, show_default=True,
              help="Nucleus sampling: keep the smallest set reaching this probability (1 = off).")
@click.option("--min-p", type=click.FloatRange(min=0, max=1), default=0.05, show_default=True,
              help="Drop tokens less likely than min-p times the most likely (0 = off).")
@click.option("--repeat-penalty", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Penalize the last --repeat-last-n tokens (1 = off).")
@click.option("--repeat-last-n", type=click.IntRange(min=-1), default=64, show_default=True,
              help="How many recent tokens the repeat penalty looks at (-1 = whole context, 0 = off).")
@click.option("-s", "--seed", type=click.IntRange(min=-1, max=2**32 - 1), default=-1, show_default=True,
              help="Random seed for sampling (-1 = random). numpy's RNG: not llama.cpp's sequence.")
@click.option("--chat", is_flag=True,
              help="Wrap the prompt as one user message with the model's chat template "
                   "(tokenizer.chat_template; ChatML if the model has none, as llama.cpp) and print only the reply.")
@click.option("--chat-template", type=click.Choice(sorted(BUILTIN_TEMPLATES)), default=None,
              help="With --chat: use llama.cpp's built-in format of this name instead of the model's template.")
@click.option("--no-display-prompt", is_flag=True, help="Do not echo the prompt before the generated text.")
def run(model_path, prompt, prompt_file, n_predict, n_ctx, threads, temp, top_k, top_p, min_p, repeat_penalty,
        repeat_last_n, seed, chat, chat_template, no_display_prompt):
    """Generate text from a prompt: the output streams to stdout, timings go to stderr."""
    if prompt is not None and prompt_file is not None:
        raise click.UsageError("give the prompt with -p or -f, not both")
    if prompt_file is not None:
        prompt = prompt_file.read()
    if prompt is None:
        raise click.UsageError("no prompt: give -p PROMPT or -f FILE")
    if chat_template is not None and not chat:
        raise click.UsageError("--chat-template needs --chat")

    t_load = time.perf_counter()
    from quantkit.model.sampling import Sampler, SamplerParams
    from quantkit.pipelines.generate import check_prompt, generate, warm_up
    from quantkit.pipelines.loading import ctx_size, open_model

    params = SamplerParams(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                           repeat_last_n=repeat_last_n, seed=None if seed < 0 else seed).validate()
    om = open_model(model_path)
    model, tok = om.model, om.tok
    n_ctx = ctx_size(n_ctx, model.config.n_ctx_train, DEFAULT_N_CTX)

    if chat:
        from quantkit.model.chat import chat_template as select_template, render_chat

        template = select_template(model.metadata, chat_template)
        piece = lambda i: tok.tokens[i] if i is not None and 0 <= i < tok.n_vocab else ""  # noqa: E731
        bos, eos = piece(tok.bos_id), piece(tok.eos_id)
        text = render_chat(template, [{"role": "user", "content": prompt}], True, bos, eos)
        ids = tok.encode(text, add_special=tok.add_bos and not (bos and text.startswith(bos)), parse_special=True)
    else:
        ids = tok.encode(prompt, add_special=True, parse_special=False)
    check_prompt(len(ids), n_ctx)
    runner = om.runner(n_ctx)
    warm_up(runner, ids)
    sampler = Sampler(params, n_ctx)
    load_s = time.perf_counter() - t_load
    if not sampler.greedy:
        click.echo(f"sampling: seed {sampler.seed}, temp {temp}, top_k {top_k}, top_p {top_p}, min_p {min_p}, "
                   f"repeat_penalty {repeat_penalty} (last {repeat_last_n})", err=True)

    out = sys.stdout
    if not chat and not no_display_prompt:
        out.write(tok.decode(ids))
        out.flush()
    stream = tok.stream(special=False)

    def on_token(t: int) -> None:
        text = stream.push(t)
        if text:
            out.write(text)
            out.flush()

    result = generate(runner, ids, n_predict, sampler, on_token, tok.is_eog, load_s)
    out.write(stream.flush() + "\n")
    out.flush()
    if result.stop == "context":
        click.echo(f"stopped: the context of {n_ctx} tokens is full", err=True)
    tm = result.timings
    speed = tm.n_eval / tm.eval_s if tm.eval_s > 0 else 0.0
    click.echo(f"\nmain: decoded {len(result.tokens)} tokens in {tm.prompt_s + tm.eval_s:.2f} s, "
               f"speed: {speed:.2f} t/s", err=True)
    click.echo(tm.report(), err=True)
    model.close()
    if result.stop == "interrupted":
        interrupted_exit()
