"""``quantkit convert HF_DIR``: a Hugging Face safetensors checkpoint to GGUF, as convert_hf_to_gguf.py."""

from __future__ import annotations

import sys

import click

from quantkit.cli import main


@main.command()
@click.argument("hf_dir", metavar="HF_DIR", type=click.Path(file_okay=False))
@click.option("-o", "--outfile", type=click.Path(dir_okay=False), default=None,
              help="Output GGUF (default: llama.cpp's name for it, e.g. Model-1.2B-BF16.gguf, inside HF_DIR).")
@click.option("--outtype", type=click.Choice(["f32", "f16", "bf16", "q8_0", "auto"]), default="auto",
              show_default=True,
              help="Type of the matrices: f32, f16, bf16, q8_0, or auto (bf16 or f16 as the checkpoint's "
                   "first matrix is stored); 1-D tensors, norms and MoE routers stay f32.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary line.")
def convert(hf_dir, outfile, outtype, quiet):
    """Convert a Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json) to GGUF.

    \b
    Writes what llama.cpp's convert_hf_to_gguf.py writes for the same folder: the same tensor names,
    shapes, types and bytes and the same metadata, for LlamaForCausalLM (Mixtral-style experts too),
    MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM and Gemma3ForCausalLM
    with a BPE tokenizer.json. Tensors are
    streamed one at a time into a temporary file renamed into place at the end: a refused or failed run
    writes nothing. Needs the `convert` extra (safetensors, ml_dtypes, tokenizers).
    """
    from quantkit.pipelines.convert import convert as run_convert

    def bar(**kw):
        from tqdm import tqdm

        return tqdm(file=sys.stderr, **kw)

    log = (lambda s: None) if quiet else (lambda s: click.echo(s, err=True))
    path = run_convert(hf_dir, outfile, outtype, log=log,
                       progress=bar if not quiet and sys.stderr.isatty() else None)
    if not quiet:
        click.echo(f"wrote {path}", err=True)
