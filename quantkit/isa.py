"""CPU levels: which instruction sets the kernels are built for, chosen once per process.

ggml fills its ``type_traits_cpu`` per architecture (``ggml/src/ggml-cpu/arch/x86``, ``arch/arm``) and
picks the best build the CPU can run; quantkit does the same with named levels, best first:

=============  =====================================================================================
``avx512vnni`` 512-bit AVX-512 with VNNI (Ice Lake and later Xeons, Zen 4/5): ``vpdpbusd``, the
               8-row interleaved decode layout and the integer GEMM tiles
``avxvnni``    256-bit VEX ``vpdpbusd`` without AVX-512 (Intel 12th-14th gen, Core Ultra)
``avx2``       ``vpmaddubsw`` + ``vpmaddwd`` (Haswell and later, AMD Zen 1-3)
``i8mm``       AArch64 with the dot product and the int8 matrix multiply (``smmla``, Armv8.6 FEAT_I8MM:
               Graviton 3/4, Apple M2 and later, Neoverse N2/V1/V2): neon's kernels, the GEMM on ``smmla``
``neon``       AArch64 with the dot-product extension (``sdot``/``udot``)
``generic``    portable LLVM IR, any CPU
=============  =====================================================================================

The level in force is the best one the host runs, unless ``QUANTKIT_KERNELS=<level>`` forces one it
can run (``plain`` forces the numba-only reference path, not a CPU level). A forced level also
restricts what LLVM may emit for every kernel of the process (numba's ``NUMBA_CPU_FEATURES``), so
that ``QUANTKIT_KERNELS=avx2`` on an AVX-512 machine measures and tests what an AVX2-only CPU
runs. That restriction must be in place before numba is imported: ``quantkit/cache.py`` applies it.

No numba here, only llvmlite's view of the host (the same one numba compiles for).
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

from quantkit import config
from quantkit.errors import QuantkitError


@dataclass(frozen=True)
class Level:
    name: str
    arch: str                    # "x86", "arm" or "" (any)
    requires: frozenset[str]     # LLVM feature names the CPU must have
    #: the LLVM features turned off when this level is forced on a CPU that has more, by name or
    #: name prefix (``avx512`` covers every AVX-512 subset); LLVM also drops what depends on them
    above: tuple[str, ...]
    #: the IR flavour of the integer dots built for it (kernels/ir.py's ``_dot``)
    variant: str
    summary: str


_X86_BASE = frozenset({"avx2", "fma", "f16c", "bmi2"})
_NOT_AVX512 = ("avx512", "avx10", "amx", "evex512")
_NOT_AVXVNNI = _NOT_AVX512 + ("avxvnni", "avxifma", "avxneconvert")

#: best first; the order is the fallback order
LEVELS: tuple[Level, ...] = (
    Level("avx512vnni", "x86", _X86_BASE | {"avx512f", "avx512bw", "avx512vl", "avx512vnni"}, (), "vnni",
          "AVX-512 VNNI: 512-bit vpdpbusd, 8-row interleaved decode, integer GEMM"),
    Level("avxvnni", "x86", _X86_BASE | {"avxvnni"}, _NOT_AVX512, "vnni", "AVX-VNNI: 256-bit VEX vpdpbusd"),
    Level("avx2", "x86", _X86_BASE, _NOT_AVXVNNI, "avx2", "AVX2: vpmaddubsw + vpmaddwd"),
    Level("i8mm", "arm", frozenset({"neon", "dotprod", "i8mm"}), ("sve",), "neon",
          "ARM NEON with sdot, integer GEMM on smmla (i8mm)"),
    Level("neon", "arm", frozenset({"neon", "dotprod"}), ("i8mm", "sve"), "neon", "ARM NEON with sdot"),
    Level("generic", "", frozenset(), _NOT_AVXVNNI + ("avx", "fma", "f16c", "bmi", "gfni", "vaes",
                                                         "vpclmulqdq", "dotprod", "i8mm", "sve"),
          "generic", "portable LLVM IR"),
)
BY_NAME: dict[str, Level] = {lv.name: lv for lv in LEVELS}
#: ``QUANTKIT_KERNELS=plain``: the numba-only reference kernels (no LLVM IR), for tests and A/B runs
PLAIN = "plain"

ARCH = ("x86" if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
        else "arm" if platform.machine().lower() in ("aarch64", "arm64") else "")


#: the Linux kernel's AArch64 hwcap names (``/proc/cpuinfo``'s Features line) of the features that
#: LLVM's host query leaves out there (lib/TargetParser/Host.cpp maps only fp, asimd, crc32, atomics,
#: aes, sha2, sve, ...), by LLVM's names: without them no ARM host would show the dot product
_ARM_HWCAPS = {"asimddp": "dotprod", "i8mm": "i8mm", "sve": "sve", "sve2": "sve2", "asimdhp": "fullfp16",
               "bf16": "bf16"}


def _cpuinfo_field(name: str, cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The value of the kernel's cpuinfo field ``name`` (its first processor's), None where it has none."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            line = next((ln for ln in f if ln.split(":")[0].strip() == name), None)
    except OSError:
        return None
    return None if line is None else line.split(":", 1)[1].strip()


def _arm_hwcaps(cpuinfo: str = "/proc/cpuinfo") -> dict[str, bool]:
    """{LLVM feature: present} for ``_ARM_HWCAPS`` from the kernel's cpuinfo; {} where it has none."""
    line = _cpuinfo_field("Features", cpuinfo)
    if line is None:
        return {}
    have = set(line.split())
    return {llvm: cap in have for cap, llvm in _ARM_HWCAPS.items()}


@functools.cache
def cpu_vendor() -> str:
    """The x86 CPU's vendor string (cpuinfo's ``vendor_id``: 'GenuineIntel', 'AuthenticAMD'), '' where
    none is reported (ARM, no /proc): where a choice between two kernels of one level depends on the
    microarchitecture rather than on its features (kernels/cpu_traits.float_gemm)."""
    return _cpuinfo_field("vendor_id") or ""


@functools.cache
def _llvm_host_cpu() -> tuple[str, dict[str, bool]]:
    import llvmlite.binding as llvm

    return llvm.get_host_cpu_name(), dict(llvm.get_host_cpu_features())


@functools.cache
def host_cpu() -> tuple[str, dict[str, bool]]:
    """(LLVM's name for this CPU, {feature: present}): numba's view of the host, on ARM completed with
    the features the kernel reports that LLVM's host query does not (``_ARM_HWCAPS``)."""
    name, feats = _llvm_host_cpu()
    if ARCH == "arm":
        feats = {**feats, **{k: v for k, v in _arm_hwcaps().items() if v or k not in feats}}
    return name, feats


@functools.cache
def host_features() -> frozenset[str]:
    """The features the host CPU has, whatever level is in force."""
    return frozenset(k for k, v in host_cpu()[1].items() if v)


def can_run(level: Level) -> bool:
    return level.arch in ("", ARCH) and level.requires <= host_features()


@functools.cache
def runnable() -> tuple[str, ...]:
    """The levels this host can run, best first (always ends with ``generic``)."""
    return tuple(lv.name for lv in LEVELS if can_run(lv))


def best() -> str:
    return runnable()[0]


def forced() -> str:
    """``QUANTKIT_KERNELS`` checked: "" when unset, a runnable level or ``plain``; anything else is a
    QuantkitError naming what this host can run."""
    want = config.kernels_level()
    if not want or want == PLAIN:
        return want
    lv = BY_NAME.get(want)
    if lv is None:
        raise QuantkitError(f"QUANTKIT_KERNELS={want!r} is not a kernel level: choose one of "
                            f"{', '.join([*BY_NAME, PLAIN])}")
    if not can_run(lv):
        missing = sorted(lv.requires - host_features()) or [lv.arch]
        raise QuantkitError(f"QUANTKIT_KERNELS={want}: this CPU ({host_cpu()[0]}) cannot run it "
                            f"(lacks {', '.join(missing)}); it runs {', '.join(runnable())}")
    return want


def selected() -> str:
    """The CPU level the kernels are built for: the forced one (``plain`` builds for the best level),
    else the best the host runs."""
    f = forced()
    return f if f and f != PLAIN else best()


def _off(name: str, above: tuple[str, ...]) -> bool:
    return any(name == a or name.startswith(a) for a in above)


def target_features() -> frozenset[str]:
    """The features the kernels may use: the host's, less those above the level in force."""
    above = BY_NAME[selected()].above
    return frozenset(f for f in host_features() if not _off(f, above))


def numba_cpu_features() -> str | None:
    """The ``NUMBA_CPU_FEATURES`` string that holds LLVM to the forced level, or None (not forced, or
    the level is the host's best: nothing to turn off, and numba's own view of the host is complete;
    on ARM it lacks the dot product, which the string then turns on)."""
    level = selected()
    if level == best() and host_cpu()[1] == _llvm_host_cpu()[1]:
        return None
    above = BY_NAME[level].above
    return ",".join(("+" if v and not _off(k, above) else "-") + k for k, v in sorted(host_cpu()[1].items()))


def variant() -> str:
    """The IR flavour of the integer dots for the level in force (``plain`` when forced)."""
    return PLAIN if forced() == PLAIN else BY_NAME[selected()].variant


def buildable() -> tuple[str, ...]:
    """The levels this process can build kernels for, best first: the runnable ones from the level in
    force down (a forced level holds LLVM to its features for the whole process, so a level above it
    cannot be compiled, even when ``QUANTKIT_KERNELS`` is changed later)."""
    levels = runnable()
    return levels[levels.index(selected()):]


def runnable_variants() -> tuple[str, ...]:
    """The IR flavours of the ``buildable`` levels, best first, then ``plain``: what the tests run every
    kernel in."""
    return tuple(dict.fromkeys([BY_NAME[lv].variant for lv in buildable()] + [PLAIN]))


def describe() -> str:
    """One line for ``quantkit bench`` / ``warmup``: the level, and how it was chosen."""
    lv, how = selected(), ("forced by QUANTKIT_KERNELS" if forced() else "best this CPU runs")
    plain = " (plain numba kernels)" if forced() == PLAIN else ""
    return f"{lv}{plain} ({how}; CPU {host_cpu()[0]} runs {', '.join(runnable())})"
