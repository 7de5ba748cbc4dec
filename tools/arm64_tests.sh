#!/usr/bin/env bash
# Run quantkit tests on an x86-64 host as an AArch64 (NEON, dot-product) CPU would, under qemu user
# emulation. CI does not run it; docs/DEVELOPING.md ("NEON under emulation") says when to.
#
#   tools/arm64_tests.sh [pytest arguments...]     (default: tests/test_rowdots.py -x -q)
#   QUANTKIT_KERNELS=neon tools/arm64_tests.sh tests/test_rowdots.py -x -q
#
# What it sets up, once, in a cache folder outside the checkout ($QUANTKIT_ARM64_ROOT, default
# ~/.cache/quantkit/arm64-bookworm):
#   sys/   an arm64 Debian bookworm root with python3 (3.11): `debootstrap --foreign` downloads the
#          packages, which are then unpacked as they are (no maintainer scripts run: nothing in them is
#          needed to run python, and running them would need binfmt_misc, which a container may lack)
#   site/  the Python packages, numba's and numpy's aarch64 wheels from PyPI among them, installed by
#          the host's pip for the aarch64 target (`pip install --target --platform`): no emulated pip
#   cache/ XDG_CACHE_HOME of the emulated runs: quantkit's numba cache for the arm64 levels, kept apart
#          from the host's (both have a `generic` level)
# Then it runs `python3 -m pytest` of the arm64 root under qemu-aarch64-static in the checkout, with
# site/ and the checkout on PYTHONPATH. qemu's `-L sys` sends every absolute path the emulated process
# opens to sys/ when the file exists there (the loader, libc, /usr/lib/python3.11, ...).
#
# The emulated CPU is qemu's Neoverse N1 (Graviton 2 class: NEON with sdot/udot, no i8mm, no SVE), the
# `neon` level; QUANTKIT_ARM64_CPU=max emulates qemu's max CPU, shown as a Neoverse V1 (i8mm, bf16,
# SVE), the `i8mm` level. Other qemu CPUs (qemu-aarch64-static -cpu help lists them) need
# QUANTKIT_ARM64_CPUINFO. qemu 7.2 (bookworm)
# shows the emulated process the host's /proc/cpuinfo, from which LLVM, and so numba and quantkit.isa,
# read the CPU's name and features; the script therefore puts a Neoverse N1 cpuinfo at
# sys/proc/cpuinfo, which `-L` serves in its place. With another CPU, set QUANTKIT_ARM64_CPUINFO to
# a file with that CPU's lines.
#
# Child processes: without binfmt_misc a test that starts `sys.executable` in a subprocess cannot run
# (the kernel does not know the aarch64 binary); choose kernel tests, which do not.
#
# Needs: root or the packages qemu-user-static and debootstrap (installed with apt-get when missing
# and run as root), the network to Debian's packages and PyPI on the first run, ~700 MB of disk.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
root=${QUANTKIT_ARM64_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/quantkit/arm64-bookworm}
cpu=${QUANTKIT_ARM64_CPU:-neoverse-n1}
host_py=${QUANTKIT_HOST_PYTHON:-}
if [ -z "$host_py" ]; then
    if [ -x "$here/.venv/bin/python" ]; then host_py=$here/.venv/bin/python; else host_py=python3; fi
fi
# the root's Debian packages: python3, and libgomp1 for numba's omp threading layer (quantkit.jit asks
# for it)
debs=python3,libgomp1
# the packages the tests import (pyproject.toml's dependencies and test extras, less pytest-xdist:
# emulation is one worker)
packages=(numpy gguf click numba tqdm jinja2 threadpoolctl platformdirs pytest hypothesis)

die() { echo "arm64_tests.sh: $*" >&2; exit 1; }

need_tools() {
    local missing=()
    command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    [ ${#missing[@]} -eq 0 ] && return
    [ "$(id -u)" -eq 0 ] || die "install ${missing[*]} (apt-get install ${missing[*]}) and run again"
    apt-get install -y -q "${missing[@]}" >/dev/null
}

make_root() {
    [ "$(cat "$root/sys/.unpacked" 2>/dev/null)" = "$debs" ] && return
    echo "arm64_tests.sh: arm64 Debian bookworm root in $root/sys (first run: a few minutes)" >&2
    rm -rf "$root/sys"
    mkdir -p "$root/sys"
    # --foreign: download and unpack the essential set only (no arm64 code runs on the host); the
    # packages that --include adds are left as .deb files in var/cache/apt/archives and unpacked below
    debootstrap --arch=arm64 --foreign --variant=minbase --include="$debs" bookworm "$root/sys" >&2 \
        || die "debootstrap failed (see above)"
    local deb
    for deb in "$root"/sys/var/cache/apt/archives/*.deb; do
        dpkg-deb -x "$deb" "$root/sys"
    done
    [ -x "$root/sys/usr/bin/python3" ] || die "no python3 in $root/sys after unpacking"
    echo "$debs" > "$root/sys/.unpacked"
}

write_cpuinfo() {
    mkdir -p "$root/sys/proc"
    if [ -n "${QUANTKIT_ARM64_CPUINFO:-}" ]; then
        cp "$QUANTKIT_ARM64_CPUINFO" "$root/sys/proc/cpuinfo"
        return
    fi
    # the lines LLVM reads (lib/TargetParser/Host.cpp), as the Linux kernel prints them for that core:
    # implementer 0x41 part 0xd0c is Neoverse N1 (asimddp: the dot product); for qemu's `max` CPU,
    # part 0xd40, Neoverse V1 (Graviton 3 class), whose features qemu's max has (i8mm: smmla)
    local n part variant features
    case "$cpu" in
        neoverse-n1)
            part=0xd0c variant=0x3
            features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs" ;;
        max)
            part=0xd40 variant=0x1
            features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng" ;;
        *) die "QUANTKIT_ARM64_CPU=$cpu: give its /proc/cpuinfo in QUANTKIT_ARM64_CPUINFO" ;;
    esac
    : > "$root/sys/proc/cpuinfo"
    for n in $(seq 0 $(($(nproc) - 1))); do
        cat >> "$root/sys/proc/cpuinfo" <<EOF
processor	: $n
BogoMIPS	: 50.00
Features	: $features
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: $variant
CPU part	: $part
CPU revision	: 1

EOF
    done
}

make_site() {
    [ -e "$root/site/.installed" ] && return
    echo "arm64_tests.sh: aarch64 wheels into $root/site" >&2
    rm -rf "$root/site"
    # bookworm's glibc is 2.36: any manylinux wheel up to that runs
    local plats=() v
    for v in 17 28 31 34 35 36; do plats+=(--platform "manylinux_2_${v}_aarch64"); done
    "$host_py" -m pip install -q --target "$root/site" "${plats[@]}" --platform manylinux2014_aarch64 \
        --python-version 3.11 --implementation cp --abi cp311 --only-binary=:all: "${packages[@]}" >&2 \
        || die "pip could not install the aarch64 wheels (see above)"
    touch "$root/site/.installed"
}

need_tools
make_root
write_cpuinfo
make_site
mkdir -p "$root/cache"

[ $# -gt 0 ] || set -- tests/test_rowdots.py -x -q
cd "$here"
# -p no:cacheprovider: leave no .pytest_cache of the emulated run in the checkout
exec env QEMU_CPU="$cpu" PYTHONPATH="$root/site:$here" PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 \
    XDG_CACHE_HOME="$root/cache" QUANTKIT_COMPILE_NOTICE=0 \
    qemu-aarch64-static -L "$root/sys" "$root/sys/usr/bin/python3" -m pytest -p no:cacheprovider "$@"
