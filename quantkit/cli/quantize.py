"""``quantkit quantize``: llama-quantize's command line, byte for byte, plus a few safety nets."""

from __future__ import annotations

import sys

import click

from quantkit.cli import main
from quantkit.cli.options import split_max_size_option, split_max_tensors_option, threads_option

def _epilog() -> str:
    """The positional arguments, and the file types as llama-quantize --help lists them (the type table's)."""
    from quantkit.formats.ggml_types import FILE_TYPE_BY_NAME, FTYPE_ALIASES, QUANT_OPTIONS

    lines = []
    for name in QUANT_OPTIONS:
        f = FILE_TYPE_BY_NAME[FTYPE_ALIASES.get(name, name)]
        num = f"{f.id:4d}  or  " if name != "COPY" else " " * 10
        lines.append(f"{num}{name:<7s} : {f'alias for {f.name}' if name in FTYPE_ALIASES else f.help}")
    return ("\b\nPositional arguments follow llama-quantize: INPUT [OUTPUT] TYPE [NTHREADS].\n"
            "OUTPUT defaults to ggml-model-<TYPE>.gguf beside INPUT; TYPE is a file type name (case-insensitive)\n"
            "or llama.cpp's integer id; NTHREADS <= 0 means all cores.\n\n\b\nFile types (llama-quantize's list; "
            "Q2_0 is refused: gguf-py 0.19.0 cannot write its type):\n" + "\n".join(lines) + "\n")


EPILOG = _epilog()


def _split_positionals(args: tuple[str, ...], dry_run: bool):
    from quantkit.errors import PolicyError
    from quantkit.typenames import parse_ftype

    def as_ftype(s):
        try:
            return parse_ftype(s)
        except PolicyError:
            return None

    def as_threads(s):
        try:
            return int(s)
        except ValueError:
            raise click.UsageError(f"NTHREADS must be an integer, got {s!r}") from None

    if len(args) < 2:
        raise click.UsageError("expected INPUT [OUTPUT] TYPE [NTHREADS]")
    inp = args[0]
    ft = as_ftype(args[1])
    if ft is not None:
        if len(args) > 3:
            raise click.UsageError(f"unexpected extra argument {args[3]!r}")
        return inp, None, args[1], (as_threads(args[2]) if len(args) > 2 else None)
    if len(args) < 3:
        if dry_run:
            raise click.UsageError(f"unknown file type {args[1]!r}")
        raise click.UsageError(f"{args[1]!r} is not a file type, and no TYPE follows it")
    if as_ftype(args[2]) is None:
        try:
            parse_ftype(args[2])
        except PolicyError as e:
            raise click.UsageError(str(e)) from None
    if len(args) > 4:
        raise click.UsageError(f"unexpected extra argument {args[4]!r}")
    return inp, args[1], args[2], (as_threads(args[3]) if len(args) > 3 else None)


def _check_target(target_bpw, target_size, imatrix_path, target_types) -> int | None:
    """The --target-size in bytes; usage errors for a target without an imatrix or with both forms."""
    from quantkit.allocation import AllocationError, parse_size

    if target_bpw is None and target_size is None:
        if target_types:
            raise click.UsageError("--target-types needs --target-bpw or --target-size")
        return None
    if target_bpw is not None and target_size is not None:
        raise click.UsageError("give --target-bpw or --target-size, not both")
    if imatrix_path is None:
        raise click.UsageError("--target-bpw/--target-size need --imatrix FILE (each tensor's error is weighted by it)")
    if target_bpw is not None:
        if not 0 < target_bpw < 64:
            raise click.UsageError(f"--target-bpw must be between 0 and 64, got {target_bpw}")
        return None
    try:
        return parse_size(target_size)
    except AllocationError as e:
        raise click.UsageError(f"--target-size: {e}") from None


def _ftype_label(text: str) -> str:
    from quantkit.typenames import FTYPE_ALIASES, parse_ftype

    up = text.strip().upper()
    if up in FTYPE_ALIASES:
        return up
    return parse_ftype(text).name


@main.command(epilog=EPILOG, context_settings={"ignore_unknown_options": False})
@click.argument("args", nargs=-1, required=True, metavar="INPUT [OUTPUT] TYPE [NTHREADS]")
@click.option("--allow-requantize", is_flag=True,
              help="Allow requantizing tensors that are already quantized (quality may suffer).")
@click.option("--leave-output-tensor", is_flag=True, help="Leave output.weight in its source type.")
@click.option("--pure", is_flag=True,
              help="Disable the k-quant mixtures: every eligible tensor gets the file type's default type.")
@click.option("--imatrix", "imatrix_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Importance matrix (GGUF or legacy .dat) to weight the quantization.")
@click.option("--include-weights", multiple=True, metavar="NAME",
              help="Use the imatrix only for tensors whose name contains NAME (repeatable).")
@click.option("--exclude-weights", multiple=True, metavar="NAME",
              help="Do not use the imatrix for tensors whose name contains NAME (repeatable).")
@click.option("--output-tensor-type", default=None, metavar="TYPE", help="Type of output.weight (e.g. q8_0).")
@click.option("--token-embedding-type", default=None, metavar="TYPE", help="Type of token_embd.weight.")
@click.option("--tensor-type", "tensor_type", multiple=True, metavar="PATTERN=TYPE",
              help="Type for tensors whose name matches the regex PATTERN (repeatable; first match wins).")
@click.option("--tensor-type-file", type=click.Path(exists=True, dir_okay=False), default=None, metavar="FILE",
              help="File of PATTERN=TYPE entries separated by whitespace, appended to --tensor-type.")
@click.option("--prune-layers", default=None, metavar="L0,L1,...",
              help="Remove these layers (comma-separated ids) and renumber the rest.")
@click.option("--override-kv", multiple=True, metavar="KEY=TYPE:VALUE",
              help="Set a metadata value in the output; TYPE is int, float, bool or str (repeatable).")
@click.option("--keep-split", is_flag=True,
              help="Write the quantized model in the same parts as the input (a split model given by its "
                   "first part): OUTPUT without .gguf becomes the prefix of OUTPUT-00001-of-0000N.gguf, ... "
                   "(a single-file input gives OUTPUT-00001-of-00001.gguf).")
@split_max_tensors_option(help="quantkit's: write the output in parts of at most N tensors, the files `quantkit "
                               "gguf-split --split-max-tensors N` (llama-gguf-split) would make of the one output "
                               "file; named as with --keep-split.")
@split_max_size_option(help="quantkit's: as --split-max-tensors, for at most N megabytes (M) or gigabytes (G) of "
                            "tensor data per part.")
@click.option("--dry-run", is_flag=True, help="Print the per-tensor plan with sizes; write nothing.")
@click.option("--plan-out", type=click.Path(dir_okay=False), default=None, metavar="FILE.json",
              help="Also write the per-tensor plan as JSON.")
@click.option("--target-bpw", type=float, default=None, metavar="BPW",
              help="Choose every tensor's type so the file is at most BPW bits per weight (as the summary "
                   "line counts them) with the least expected loss; needs --imatrix. TYPE still names the "
                   "file type in the metadata.")
@click.option("--target-size", default=None, metavar="SIZE",
              help="As --target-bpw, for a size of the tensor data, e.g. 4.2GiB or 90MB.")
@click.option("--target-types", default=None, metavar="T1,T2,...",
              help="With a target: choose only among these ggml types (default: every type quantkit writes "
                   "that the tensor's row length allows).")
@click.option("--tensor-type-out", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="With a target: write the chosen types as a --tensor-type-file (plain quantize or "
                   "llama-quantize with it and the same options makes the same file). Default: "
                   "OUTPUT.tensor-types.txt.")
@click.option("--optimize", is_flag=True,
              help="quantkit's: the same types and sizes, better values inside the blocks: each matrix's "
                   "rounding error is compensated through the Gram matrix of its inputs on calibration text "
                   "(GPTQ's sweep around llama.cpp's own search; per row the better of it and llama.cpp's "
                   "rounding is kept; docs/optimize.md). Applies to blk.* matrices of types Q4_0, Q4_1, Q5_0, "
                   "Q5_1, Q8_0, IQ4_NL, Q2_K..Q6_K and IQ4_XS; every other tensor (token_embd, IQ1/IQ2/IQ3 "
                   "types, 3D experts) is written as llama-quantize writes it. Needs a model quantkit can run.")
@click.option("--optimize-text", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="With --optimize: UTF-8 calibration text (default: the built-in calibration half).")
@click.option("--optimize-chunks", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --optimize: chunks of calibration text the Gram matrices are measured on (default 20).")
@click.option("--optimize-ctx", type=click.IntRange(min=16), default=None, metavar="N",
              help="With --optimize: tokens per calibration chunk (default 512).")
@click.option("--optimize-stats", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="With --optimize: keep the statistics in directory DIR, each layer's Gram matrices saved as "
                   "soon as they are complete: a later run (or an interrupted one started again, made from a "
                   "model of the same size with the same text, chunks and context) reads the layers saved and "
                   "goes on from the last.")
@click.option("--no-fallback", is_flag=True,
              help="Fail before computing anything if a tensor would need a fallback type.")
@threads_option(apply=False, help="Threads (default: all cores).")
@click.option("--verify", "verify_after", is_flag=True,
              help="Re-read the written file and check every tensor (as `quantkit verify`).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no per-tensor lines.")
def quantize(args, allow_requantize, leave_output_tensor, pure, imatrix_path, include_weights,
             exclude_weights, output_tensor_type, token_embedding_type, tensor_type, tensor_type_file,
             prune_layers, override_kv, keep_split, split_max_tensors, split_max_bytes, dry_run, plan_out, target_bpw, target_size, target_types, tensor_type_out,
             optimize, optimize_text, optimize_chunks, optimize_ctx, optimize_stats, no_fallback,
             verify_after, threads, quiet):
    """Quantize a GGUF model like llama-quantize (same flags, same output bytes).

    The output is written to a temporary file and renamed into place when complete; an interrupted or
    failed run leaves nothing at OUTPUT.
    """
    from quantkit.pipelines.quantize import (QuantizeError, QuantizeOptions, default_output_path, output_paths,
                                             parse_override_kv, quantize_file)
    from quantkit.typenames import parse_ggml_type, parse_tensor_type_arg

    if include_weights and exclude_weights:
        raise click.UsageError("--include-weights and --exclude-weights cannot be used together")
    target_bytes = _check_target(target_bpw, target_size, imatrix_path, target_types)
    inp, out, ftype_text, nthreads = _split_positionals(args, dry_run)
    if threads is None and nthreads is not None:
        threads = nthreads if nthreads > 0 else None
    from quantkit.errors import PolicyError

    try:
        if output_tensor_type:
            parse_ggml_type(output_tensor_type)
        if token_embedding_type:
            parse_ggml_type(token_embedding_type)
        patterns = [parse_tensor_type_arg(a) for a in tensor_type]
        if tensor_type_file:
            with open(tensor_type_file, encoding="utf-8") as f:
                patterns += [parse_tensor_type_arg(tok) for tok in f.read().split()]
        kv_overrides = tuple(parse_override_kv(a) for a in override_kv)
        only = tuple(parse_ggml_type(t) for t in (target_types or "").split(",") if t.strip())
    except (PolicyError, QuantizeError) as e:
        raise click.UsageError(str(e)) from None
    if not optimize and (optimize_text, optimize_chunks, optimize_ctx, optimize_stats) != (None,) * 4:
        raise click.UsageError("--optimize-text/--optimize-chunks/--optimize-ctx/--optimize-stats need --optimize")
    if split_max_tensors is not None and split_max_bytes is not None:
        raise click.UsageError("either --split-max-tensors or --split-max-size can be given, but not both")
    if keep_split and (split_max_tensors is not None or split_max_bytes is not None):
        raise click.UsageError("--keep-split keeps the input's parts: it cannot be combined with "
                               "--split-max-tensors / --split-max-size")
    prune = ()
    if prune_layers:
        try:
            prune = tuple(sorted({int(x) for x in prune_layers.split(",") if x.strip()}))
        except ValueError:
            raise click.UsageError(f"--prune-layers takes comma-separated integers, got {prune_layers!r}") from None
    if out is None and not dry_run:
        out = str(default_output_path(inp, _ftype_label(ftype_text)))

    has_target = target_bpw is not None or target_bytes is not None
    opts = QuantizeOptions(
        ftype=ftype_text, threads=threads, allow_requantize=allow_requantize,
        leave_output_tensor=leave_output_tensor, pure=pure, imatrix=imatrix_path,
        include_weights=tuple(include_weights), exclude_weights=tuple(exclude_weights),
        output_tensor_type=output_tensor_type, token_embedding_type=token_embedding_type,
        tensor_types=tuple(patterns), prune_layers=prune,
        override_kv=kv_overrides, no_fallback=no_fallback, target_bpw=target_bpw, target_size=target_bytes,
        target_types=only, keep_split=keep_split, split_max_tensors=split_max_tensors,
        split_max_bytes=split_max_bytes, optimize=optimize, optimize_text=optimize_text,
        optimize_chunks=optimize_chunks or 20, optimize_ctx=optimize_ctx or 512, optimize_stats=optimize_stats,
        tensor_type_out=tensor_type_out or (f"{out}.tensor-types.txt" if has_target and not dry_run else None),
    )

    from tqdm import tqdm

    show_bar = not quiet and not dry_run and sys.stderr.isatty()
    state = {"bar": None}

    def progress(**kw):
        state["bar"] = tqdm(file=sys.stderr, **kw)
        return state["bar"]

    def log(line: str) -> None:
        if quiet and line.startswith("["):
            return
        if state["bar"] is not None:
            state["bar"].write(line, file=sys.stderr)
        else:
            click.echo(line, err=True)

    plan, seconds = quantize_file(inp, out, opts, dry_run=dry_run, plan_out=plan_out, log=log,
                                  progress=progress if show_bar else None)
    if dry_run and any(t.quantize and t.imatrix is None for t in plan.jobs
                       if t.name in {p.name for p in plan.type_plan.imatrix_required_by}):
        click.echo("WARNING: dry run completed successfully, but actually completing this quantization "
                   "will require an imatrix!", err=True)
    click.echo(f"llama_quantize: quantize time = {seconds * 1000:10.2f} ms", err=True)
    written = output_paths(plan, out) if not dry_run else []
    if not dry_run:
        shown = ", ".join(written) if len(written) <= 3 else f"{written[0]} ... {written[-1]}"
        click.echo(f"wrote {shown}" + (f" ({len(written)} parts)" if len(written) > 1 else ""), err=True)
    if verify_after and not dry_run:
        from quantkit.cli.verify import report_verify
        from quantkit.pipelines.verify import verify_file

        report = verify_file(written[0])
        report_verify(report, lambda line: click.echo(line, err=True), verbose=False)
        if not report.ok:
            raise click.exceptions.Exit(1)
