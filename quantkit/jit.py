"""The one place that sets numba decorator options, plus tiny bit-level intrinsics.

* ``njit``           -- serial kernel, cached, no fastmath (quantizers must match ggml bit for bit).
* ``njit_parallel``  -- same body rules, ``parallel=True`` so ``prange`` splits work over threads.
* ``njit_fast``      -- serial kernel with fastmath, for dot products and ops tested with tolerances.
* ``njit_fast_parallel``
* ``specialize(fn, tag, ...)`` -- one kernel body, compiled once per binding of the kernels it calls;
  with ``cfunc=`` a C-callable build whose address a compiled caller takes as an int64 argument and
  calls (``call_addr``): the caller is then built once for every such callee.
* ``addr_of(a)`` / ``view_u8_ro`` / ``view_u8`` / ``view_i8`` / ``view_i16`` / ``view_i32`` / ``view_u32`` /
  ``view_f32`` / ``view_i64`` -- an
  array's data address as an int64, and a 1-D array over ``n`` items at an address (no ownership):
  how such a callee gets its arrays, as int64 arguments (a call with array arguments costs ~40 ns
  through a function pointer, one with integers ~3 ns).
* ``ld_f32`` / ``ld_u16`` / ``ld_u32`` / ``ld_f16_hw`` -- little-endian loads at a byte offset of an array.
* ``fetch_add(a, i, v)`` -- atomic ``a[i] += v`` returning the old value: a chunk counter that the
  threads of a ``prange`` share, so each takes the next chunk when it is free (ggml's threadpool
  does the same) instead of the fixed share a ``prange`` alone gives it.

Compiled code is cached in one folder per user, quantkit version and CPU level (``quantkit.cache``,
which this module points numba at before importing it); processes that share it take turns at each
kernel (``_compile_once``), so two never compile the same one at once. ``announce_compiles()`` makes a
cold compile visible: numba raises its ``numba:compile`` event only when a kernel is really compiled,
not when it is loaded from that cache.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import time
import types as pytypes

from quantkit import cache, config, isa

cache.configure()  # before numba reads its environment

import numba  # noqa: E402
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# After a parallel region libgomp's workers spin (GOMP_SPINCOUNT, 300k by default) before sleeping.
# Between our regions OpenBLAS runs its own threads (the prefill's matrix products), and two spinning
# numba workers on a 2-core machine starved them: pp512 at 2 threads was 2.4x slower than at 1.
# A short spin keeps decode's back-to-back regions hot and frees the cores for BLAS (measured on
# SmolLM2 Q4_K_M, 2 threads: pp512 147 -> ~400 t/s, tg128 113 -> ~115-120 t/s). libgomp reads it when
# it is loaded, so it is set before the probe below; a user's own setting wins.
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

# Pin the threading layer: omp launches prange loops in 1-2 us, workqueue in 60-90 us
# (docs/kernels.md). Where numba's omp pool cannot load (no libgomp on the system, as in some
# aarch64 roots), numba's own choice stands: pinning "omp" there fails every parallel kernel.
if "NUMBA_THREADING_LAYER" not in os.environ:
    try:
        from numba.np.ufunc import omppool  # noqa: F401  (loads libgomp)
    except ImportError:
        pass
    else:
        numba.config.THREADING_LAYER = "omp"

_BASE = dict(cache=True, nogil=True, error_model="numpy")


def _load_cached_without_refresh() -> None:
    """Before loading a kernel from its cache, numba refreshes the whole target context: it imports
    ~60 of its modules and installs every typing and lowering registry, which only compiling needs
    (its compiler refreshes the context itself). Loading machine code needs the runtime (NRT) alone,
    so that is all this starts; the refresh then happens at the first real compile, if any (a
    2-chunk perplexity with a warm cache: ~0.1 CPU-s less, docs/performance.md). Left as numba has it
    when its internals are not the ones this was written for (numba 0.60-0.68)."""
    try:
        from numba.core import caching
        from numba.core.runtime import rtsys
    except ImportError:
        return
    cache = getattr(caching, "Cache", None)
    if cache is None or not all(hasattr(cache, a) for a in ("load_overload", "_load_overload",
                                                              "_guard_against_spurious_io_errors")):
        return

    def load_overload(self, sig, target_context):
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    cache.load_overload = load_overload


_load_cached_without_refresh()


def _compile_once() -> None:
    """Take turns at each kernel across processes that share the cache folder.

    numba's on-disk cache is not safe for two processes that compile the same function at once
    (``IndexDataCacheFile.save`` reads the index, picks a free data file name and writes both,
    unlocked: two writers can pick one name, and the index can end up naming the other's code;
    numba issue #10128). So ``Dispatcher.compile`` -- which looks in the cache, compiles on a miss
    and saves -- runs under an exclusive ``flock`` on a lock file beside the function's index: a
    second process waits, then loads what the first saved instead of compiling it again (the test
    suite's two workers, or two commands a user starts at once). The lock is taken inside numba's
    own compiler lock, so within a process only one thread ever holds one, and a kernel whose
    compile compiles its callees takes their locks caller first (calls form no cycles). Left as numba
    has it when its internals are not the ones this was written for (numba 0.60-0.68) or where
    there is no ``fcntl``."""
    try:
        import fcntl

        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.dispatcher import Dispatcher
    except ImportError:
        return
    original = Dispatcher.compile
    held: set[str] = set()

    def index_path(disp) -> str | None:
        cache_file = getattr(getattr(disp, "_cache", None), "_cache_file", None)
        return getattr(cache_file, "_index_path", None)

    @functools.wraps(original)
    def compile(self, sig):
        path = index_path(self)
        if path is None or not self._can_compile:
            return original(self, sig)
        with global_compiler_lock:
            if path in held:                        # this thread already holds it (a recursive compile)
                return original(self, sig)
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:                         # a read-only cache: numba falls back on its own
                return original(self, sig)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held.add(path)
                return original(self, sig)
            finally:
                held.discard(path)
                os.close(fd)                        # closing releases the lock

    Dispatcher.compile = compile
    try:
        from numba.core.ccallback import CFunc
    except ImportError:
        return
    original_c = CFunc.compile

    @functools.wraps(original_c)
    def compile_c(self):
        path = index_path(self)
        if path is None:
            return original_c(self)
        with global_compiler_lock:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                return original_c(self)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                return original_c(self)
            finally:
                os.close(fd)

    CFunc.compile = compile_c


_compile_once()


def _one_build_per_value_kind() -> None:
    """Type the calls between quantkit's kernels by the kind of each argument, not its value.

    numba types a constant argument as a literal (``Literal[int](15)``) and compiles a callee once per
    literal it is called with: ``make_qkx2_quants_lanes`` was built three times for one Q4_K kernel
    (``nmax`` 15, 31 and a variable), a row runner twice for an output offset of ``0`` and ``Q``. Only
    a callee that asks for a literal (``numba.literally``) needs one, and none of quantkit's does; a
    value the callee should see as a constant is bound with ``specialize`` instead. So a call from
    compiled code to a quantkit kernel compiles (or finds) the build for the unliteral argument types;
    the literal call then converts to it. Left as numba has it when its internals are not the ones
    this was written for (numba 0.60-0.68)."""
    try:
        from numba.core.dispatcher import Dispatcher
    except ImportError:
        return
    original = getattr(Dispatcher, "get_call_template", None)
    if original is None:
        return

    @functools.wraps(original)
    def get_call_template(self, args, kws):
        if getattr(self.py_func, "__module__", "").startswith("quantkit."):
            args = tuple(types.unliteral(a) for a in args)
            kws = {k: types.unliteral(v) for k, v in kws.items()}
        return original(self, args, kws)

    Dispatcher.get_call_template = get_call_template


_one_build_per_value_kind()


# fastmath=False is written out, not left unset: numba's CPU target inherits an unset fastmath from the
# caller (CPUTargetOptions.finalize: flags.inherit_if_not_set("fastmath")), so a codec compiled as the
# callee of a fastmath kernel got FMA contraction -- Q8_K activations quantized in the decode step rounded
# ``iscale * x + 1.5 * 2**23`` once instead of twice and differed from ggml's bytes on ties.
_EXACT = dict(_BASE, fastmath=False)


def njit(fn=None, **kw):
    opts = {**_EXACT, **kw}
    return numba.njit(**opts)(fn) if fn is not None else numba.njit(**opts)


def njit_parallel(fn=None, **kw):
    opts = {**_EXACT, "parallel": True, **kw}
    return numba.njit(**opts)(fn) if fn is not None else numba.njit(**opts)


def njit_fast(fn=None, **kw):
    opts = {**_BASE, "fastmath": True, **kw}
    return numba.njit(**opts)(fn) if fn is not None else numba.njit(**opts)


def njit_fast_parallel(fn=None, **kw):
    opts = {**_BASE, "fastmath": True, "parallel": True, **kw}
    return numba.njit(**opts)(fn) if fn is not None else numba.njit(**opts)


prange = numba.prange


def frozen(a: np.ndarray) -> np.ndarray:
    """``a`` as a read-only array (a view when it is writable). numba compiles a kernel once per argument
    type, and a read-only array is another type than a writable one: weights come read-only from the
    file's map, so the entry points that take weights pass every weight array this way -- a copy made
    with ``QUANTKIT_COPY_WEIGHTS`` or bytes a test made reuse the kernels the map's bytes compiled instead
    of compiling them again (a second decode-step build cost ~20 s on 2 cores)."""
    if not a.flags.writeable:
        return a
    v = a.view()
    v.flags.writeable = False
    return v


def source_digest(*paths: str) -> str:
    """A short digest of source files (for names that must change when those files do)."""
    h = hashlib.sha1()
    for p in paths:
        h.update(_file_hash(p).encode())
    return h.hexdigest()[:10]


@functools.cache
def _file_hash(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha1(fh.read()).hexdigest()


_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CONSTANTS = (bool, int, float, complex, str, bytes, type(None))
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class _Deps:
    """What a kernel is built from: the package's source files its body, the kernels and intrinsics it
    binds, and everything they reach (through the names their code uses, closures and nested functions)
    are defined in, and the values of the constants they read (sizes, tables, switches). An object's
    answer is remembered (with the object, so its ``id`` is not reused) unless its walk was cut short by
    a cycle through an object still being walked: then the answer depends on where the walk began."""

    def __init__(self):
        self.done: dict[int, tuple[object, frozenset[str], str]] = {}
        self.open: set[int] = set()
        self.root = None

    def of(self, obj) -> tuple[frozenset[str], str]:
        """(source files, fingerprint of constant values) of ``obj``: a kernel body is walked wherever it
        is defined, what it reaches only inside this package."""
        self.root = obj
        files, consts, _ = self._walk(obj)
        return files, consts

    def _walk(self, obj) -> tuple[frozenset[str], str, frozenset[int]]:
        if isinstance(obj, _CONSTANTS):
            return frozenset(), repr(obj), frozenset()
        hit = self.done.get(id(obj))
        if hit is not None:
            return hit[1], hit[2], frozenset()
        if id(obj) in self.open:                                       # a cycle: cut here
            return frozenset(), "", frozenset({id(obj)})
        self.open.add(id(obj))
        files: set[str] = set()
        parts: list[str] = []
        cut: set[int] = set()

        def add(x, label=""):
            f, c, o = self._walk(x)
            files.update(f)
            cut.update(o)
            if c:
                parts.append(f"{label}={c}" if label else c)

        try:
            self._parts(obj, files, parts, add)
        finally:
            self.open.discard(id(obj))
        text = _ADDRESS.sub("", "|".join(parts))                     # no object addresses: the same in every run
        out = (frozenset(files), hashlib.sha1(text.encode()).hexdigest()[:12] if parts else "")
        cut.discard(id(obj))
        if not cut:
            self.done[id(obj)] = (obj, *out)
        return (*out, frozenset(cut))

    def _parts(self, obj, files, parts, add):
        import numpy as np

        if isinstance(obj, np.ndarray):
            parts.append(f"{obj.dtype}{obj.shape}:{hashlib.sha1(np.ascontiguousarray(obj).tobytes()).hexdigest()}")
        elif isinstance(obj, np.generic):
            parts.append(repr(obj))
        elif isinstance(obj, (tuple, list)):
            for x in obj:
                add(x)
        elif isinstance(obj, (set, frozenset)):
            for x in sorted(obj, key=repr):
                add(x)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                add(v, repr(k))
        elif isinstance(obj, pytypes.ModuleType):
            f = getattr(obj, "__file__", None) or ""
            if f.startswith(_PKG_DIR):
                files.add(f)
        elif isinstance(obj, pytypes.FunctionType):
            self._function(obj, obj.__code__, files, add)
        elif hasattr(obj, "py_func"):                                  # a numba dispatcher
            add(obj.py_func)
        elif hasattr(obj, "_defn"):                                    # a numba intrinsic
            add(obj._defn)
        elif isinstance(obj, type):
            mod = sys.modules.get(obj.__module__)
            f = getattr(mod, "__file__", None) or ""
            if f.startswith(_PKG_DIR):
                files.add(f)
            parts.append(f"{obj.__module__}.{obj.__qualname__}")
        else:                                                          # LLVM / numba types, dataclasses
            mod = type(obj).__module__
            if mod.startswith("quantkit") and hasattr(obj, "__dict__"):
                add(vars(obj))
            else:
                parts.append(f"{type(obj).__qualname__}:{obj}" if mod.startswith(("llvmlite", "numba"))
                             else type(obj).__qualname__)

    def _function(self, fn, code, files, add):
        f = code.co_filename
        if f.startswith(_PKG_DIR):
            files.add(f)
        elif fn is not self.root:
            return
        g = fn.__globals__
        for name in code.co_names:
            if name in g:
                add(g[name], name)
        for cell_name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                add(cell.cell_contents, cell_name)
            except ValueError:                                         # an empty cell
                pass
        for const in code.co_consts:
            if isinstance(const, pytypes.CodeType):
                self._function(fn, const, files, add)
        for d in fn.__defaults__ or ():
            add(d)


_DEPS = _Deps()


def build_digest(fn) -> str:
    """A digest of what the kernel ``fn`` (a plain function, its globals bound) is built from: it goes
    into the kernel's name, because numba's on-disk cache only watches the file a function is defined in.
    Editing one codec thus recompiles the kernels that reach it, and only those."""
    files, consts = _DEPS.of(fn)
    return source_digest(*sorted(files)) + (consts[:6] if consts else "")


_SPECIALIZED: dict[tuple, object] = {}


def specialize(fn, tag: str, *, parallel: bool = False, fast: bool = False, cfunc=None, cache: bool = True,
               **names):
    """Compile a copy of the plain Python function ``fn`` whose globals ``names`` are replaced.

    This is how a kernel body written once is bound to what it calls -- a type's row decoder, a row
    dot, an IR variant -- and compiled per binding (the umap habit: one body, several builds): the
    body names a placeholder global (``ROW``, ``DEQ``, ... marked ``noqa: F821``) and each
    specialization supplies it. ``tag`` makes the copy's name, and so numba's on-disk cache entry,
    unique per binding (numba caches by function name and file, and cannot cache closures); the name
    also carries ``build_digest`` of what the copy reaches, so an edit anywhere in it is a new entry.
    ``fast`` compiles with fastmath (dots, not codecs). ``cfunc``, a numba signature: a C-callable
    build (``numba.cfunc``, cached as the others), whose ``.address`` compiled code receives as an
    int64 and calls with ``call_addr`` (its arguments integers: ``addr_of`` / ``view_*``). ``cache=False``:
    not read from or written to the disk cache (a test that reads the build's machine code, which numba
    does not keep for cached code)."""
    key = (fn.__module__, fn.__qualname__, tag, parallel, fast, str(cfunc), cache)
    if key in _SPECIALIZED:
        return _SPECIALIZED[key]
    g = dict(fn.__globals__)
    g.update(names)
    new = pytypes.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    suffix = f"__{tag}_{build_digest(new)}_{'cfn' if cfunc is not None else 'par' if parallel else 'ser'}"
    new.__name__ = fn.__name__ + suffix
    new.__qualname__ = fn.__qualname__ + suffix
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    if cfunc is not None:
        deco = numba.cfunc(cfunc, **{**(_BASE if fast else _EXACT), "fastmath": fast, "cache": cache})
    else:
        deco = (njit_fast_parallel if parallel else njit_fast) if fast else (njit_parallel if parallel else njit)
        if not cache:
            deco = functools.partial(deco, cache=False)
    out = _SPECIALIZED[key] = deco(new)
    return out


def set_threads(n: int | None) -> int:
    """Set numba's worker count (<=0 or None: all cores). Returns the count in force."""
    top = numba.config.NUMBA_NUM_THREADS
    n = top if n is None or n <= 0 else min(int(n), top)
    numba.set_num_threads(n)
    return n


def get_threads() -> int:
    return numba.get_num_threads()


_BLAS = None


def _blas():
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS


def blas_one_thread():
    """Context manager: BLAS on one thread, for callers that run independent BLAS products on their own
    threads (one product per thread: no OpenBLAS barriers between threads that the OS may deschedule)."""
    return _blas().limit(limits=1, user_api="blas")


#: rows per chunk at least, and chunks per thread, of ``over_rows``
ROWS_MIN, CHUNKS_PER_THREAD = 16, 4
_ROW_POOL: dict[int, object] = {}


def over_rows(kernel, n: int, *args) -> None:
    """``kernel(*args, r0, r1)`` over the rows 0..n-1 in contiguous chunks, on ``get_threads()`` threads.

    For a kernel that treats each row alone (a codec over a tensor's rows): the result is the same for
    any split. A serial row loop called on Python threads (each call releases the GIL, ``nogil``)
    compiles in a quarter of the time of the same loop as a ``prange`` (0.8 vs 3.0 s for Q4_K's, which
    a first quantize to Q4_K_M paid four times), and runs as fast: a chunk is thousands of values."""
    threads = min(get_threads(), max(1, n // ROWS_MIN))
    if threads <= 1:
        if n:
            kernel(*args, 0, n)
        return
    pool = row_pool(threads)
    step = max(ROWS_MIN, -(-n // (threads * CHUNKS_PER_THREAD)))
    for f in [pool.submit(kernel, *args, r0, min(n, r0 + step)) for r0 in range(0, n, step)]:
        f.result()


def over_chunks(fn, n: int, step: int, *args) -> None:
    """``fn(*args, r0, r1)`` over the rows 0..n-1 in chunks of ``step`` (a split that does not depend on
    the thread count, so a chunk's BLAS products are the same calls for any), on ``get_threads()``
    Python threads, each product on one-thread BLAS (``blas_one_thread``)."""
    with blas_one_thread():
        run_tasks([functools.partial(fn, *args, r0, min(n, r0 + step)) for r0 in range(0, n, step)])


def run_tasks(tasks) -> None:
    """Run the zero-argument callables ``tasks`` on ``get_threads()`` Python threads (in order on one);
    the split into tasks is the caller's, so results that do not depend on the thread running a task do
    not depend on the thread count."""
    threads = min(get_threads(), len(tasks))
    if threads <= 1:
        for t in tasks:
            t()
        return
    for f in [row_pool(threads).submit(t) for t in tasks]:
        f.result()


def row_pool(threads: int):
    """The process's pool of ``threads`` Python threads for row work (made once per count)."""
    pool = _ROW_POOL.get(threads)
    if pool is None:
        from concurrent.futures import ThreadPoolExecutor

        pool = _ROW_POOL[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="quantkit-rows")
    return pool


def _resize(builder, v, width: int, ty, bits: int):
    """An integer of ``width`` bits truncated or zero-extended to ``bits`` (LLVM type ``ty``)."""
    if width > bits:
        return builder.trunc(v, ty)
    return builder.zext(v, ty) if width < bits else v


def _convert(name: str, accepts, ret, emit):
    """An intrinsic ``(x) -> ret`` for an ``x`` whose numba type ``accepts(x)``: the LLVM value
    ``emit(context, builder, x_type, value)``."""
    def impl(typingctx, x):
        if not accepts(x):
            return None

        def codegen(context, builder, signature, args):
            return emit(context, builder, x, args[0])

        return ret(x), codegen

    impl.__name__ = name
    return intrinsic(impl)


def _is_f32(x) -> bool:
    return x == types.float32


def _is_int(x) -> bool:
    return isinstance(x, types.Integer)


#: a float32's uint32 bit pattern (C's memcpy trick)
f32_to_bits = _convert("f32_to_bits", _is_f32, types.uint32,
                       lambda c, b, xt, v: b.bitcast(v, ir.IntType(32)))
#: the low 32 bits of an integer as a float32
bits_to_f32 = _convert("bits_to_f32", _is_int, types.float32, lambda c, b, xt, v: b.bitcast(
    _resize(b, v, xt.bitwidth, ir.IntType(32), 32), ir.FloatType()))


def byte_ptr(context, builder, aty, aval, off, oty):
    """Codegen helper: i8* to byte ``off`` of array ``aval`` (any dtype, contiguous)."""
    ary = context.make_array(aty)(context, builder, aval)
    off = context.cast(builder, off, oty, types.intp)
    base = builder.bitcast(ary.data, ir.IntType(8).as_pointer())
    return builder.gep(base, [off])


def _load_at(name, ret, llvm_type, widen=None):
    """An intrinsic ``(a, off) -> ret``: the little-endian ``llvm_type`` at byte ``off`` of array ``a``
    (unaligned), widened by ``widen(builder, value)``."""
    def impl(typingctx, a, off):
        sig = ret(a, off)

        def codegen(context, builder, signature, args):
            p = byte_ptr(context, builder, signature.args[0], args[0], args[1], signature.args[1])
            v = builder.load(builder.bitcast(p, llvm_type.as_pointer()), align=1)
            return widen(builder, v) if widen else v

        return sig, codegen

    impl.__name__ = name
    return intrinsic(impl)


#: the float32 at byte ``off`` of array ``a``
ld_f32 = _load_at("ld_f32", types.float32, ir.FloatType())
#: the uint16 at byte ``off`` of array ``a``, as uint32
ld_u16 = _load_at("ld_u16", types.uint32, ir.IntType(16), lambda b, v: b.zext(v, ir.IntType(32)))
#: the uint32 at byte ``off`` of array ``a``
ld_u32 = _load_at("ld_u32", types.uint32, ir.IntType(32))
#: the fp16 at byte ``off`` of array ``a`` as float32, exact, with ``fpext half`` (F16C on x86)
ld_f16_hw = _load_at("ld_f16_hw", types.float32, ir.HalfType(), lambda b, v: b.fpext(v, ir.FloatType()))


@intrinsic
def fetch_add(typingctx, a, i, v):
    """Atomically add ``v`` to ``a[i]`` (a C-contiguous int64 array) and return its previous value."""
    if not (isinstance(a, types.Array) and a.dtype == types.int64 and _is_int(i) and _is_int(v)):
        return None
    sig = types.int64(a, i, v)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        val = context.cast(builder, args[2], signature.args[2], types.int64)
        ptr = builder.gep(ary.data, [idx])
        return builder.atomic_rmw("add", ptr, val, "seq_cst")

    return sig, codegen


@intrinsic
def call_addr(typingctx, fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9):
    """Call the C function at address ``fn`` (an int64: a ``specialize(..., cfunc=...)`` build's
    ``.address``) with ten int64 arguments, returning nothing. Compiled callers take such functions as
    integers: passed from Python as first-class function objects, numba typed each on every call (7-9 us
    a function, ~140 us a token for the decode step's two tables of eight)."""
    args = (fn, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9)
    if not all(_is_int(t) for t in args):
        return None

    def codegen(context, builder, signature, values):
        i64 = ir.IntType(64)
        vals = [context.cast(builder, v, t, types.int64) for v, t in zip(values, signature.args)]
        ptr = builder.inttoptr(vals[0], ir.FunctionType(ir.VoidType(), [i64] * 10).as_pointer())
        builder.call(ptr, vals[1:])
        return context.get_dummy_value()

    return types.void(*args), codegen


@intrinsic
def addr_of(typingctx, a):
    """The address of array ``a``'s first element, as an int64."""
    if not isinstance(a, types.Array):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.ptrtoint(ary.data, ir.IntType(64))

    return types.int64(a), codegen


def _view(name: str, dtype, readonly: bool = False):
    """An intrinsic ``(addr, n) -> array``: the C-contiguous 1-D array of ``n`` ``dtype`` items at
    ``addr``, owning nothing (no reference count: whoever passed the address keeps the memory alive)."""
    aty = types.Array(dtype, 1, "C", readonly=readonly)

    def impl(typingctx, addr, n):
        if not (_is_int(addr) and _is_int(n)):
            return None

        def codegen(context, builder, signature, args):
            from numba.np.arrayobj import populate_array

            ary = context.make_array(aty)(context, builder)
            size = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(dtype)))
            data = builder.inttoptr(context.cast(builder, args[0], signature.args[0], types.int64), ary.data.type)
            n = context.cast(builder, args[1], signature.args[1], types.intp)
            populate_array(ary, data=data, shape=[n], strides=[size], itemsize=size, meminfo=None)
            return ary._getvalue()

        return aty(addr, n), codegen

    impl.__name__ = name
    return intrinsic(impl)


#: read-only bytes (as the weights are: ``frozen``), and writable uint8 / int8 / int16 / int32 / uint32 /
#: float32 / int64 items
view_u8_ro = _view("view_u8_ro", types.uint8, readonly=True)
view_u8 = _view("view_u8", types.uint8)
view_i8 = _view("view_i8", types.int8)
view_i16 = _view("view_i16", types.int16)
view_i32 = _view("view_i32", types.int32)
view_u32 = _view("view_u32", types.uint32)
view_f32 = _view("view_f32", types.float32)
view_i64 = _view("view_i64", types.int64)
#: the view function for arrays of a numpy dtype (writable)
VIEWS = {np.dtype(np.uint8): view_u8, np.dtype(np.int8): view_i8, np.dtype(np.int16): view_i16,
         np.dtype(np.int32): view_i32, np.dtype(np.uint32): view_u32, np.dtype(np.float32): view_f32,
         np.dtype(np.int64): view_i64}


def host_features() -> frozenset[str]:
    """CPU features the kernels may use, e.g. {'avx512vnni', 'f16c', ...}: the host's, less those above
    a forced CPU level (quantkit/isa.py); kernels/ir.py derives the kernels' flags (HAS_VNNI, ...) from it."""
    return isa.target_features()


IS_X86 = isa.ARCH == "x86"
HAS_F16C = "f16c" in host_features()


#: IEEE half bits (an unsigned 16-bit integer) -> float32 with LLVM's ``fpext half`` (F16C)
half_bits_to_f32 = _convert("half_bits_to_f32", _is_int, types.float32, lambda c, b, xt, v: b.fpext(
    b.bitcast(_resize(b, v, xt.bitwidth, ir.IntType(16), 16), ir.HalfType()), ir.FloatType()))
#: float32 -> IEEE half bits (uint16), round to nearest even, with LLVM's ``fptrunc`` (F16C)
f32_to_half_bits = _convert("f32_to_half_bits", _is_f32, types.uint16,
                            lambda c, b, xt, v: b.bitcast(b.fptrunc(v, ir.HalfType()), ir.IntType(16)))


# -- the first compile, made visible ----------------------------------------------------------------

#: ggml type names inside a kernel's name (``rowdot_q__Q4_K_vnni_ser_...``, ``quantize_rows_q6_k``)
_TYPE_IN_NAME = re.compile(r"(?<![a-z0-9])(i?q\d_(?:k|0|1|nl|xxs|xs|s|m)|tq\d_0|mxfp4|nvfp4|bf16|f16)(?![a-z0-9])",
                           re.IGNORECASE)


class CompileNotice:
    """Says on stderr that kernels are being compiled (first run only) and for which types.

    On a terminal one status line is rewritten in place (kernels compiled so far, the types they are
    for, seconds); elsewhere one line when the first compile starts and one summary at ``done()``.
    The command line turns it on (``QUANTKIT_COMPILE_NOTICE=1`` unless set); ``0`` silences it (the
    test suite does, so command output stays exact); the library alone stays quiet."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.depth = 0
        self.count = 0
        self.types: list[str] = []
        self.t0 = 0.0
        self.shown = 0.0

    def _status(self) -> str:
        kinds = f" for {', '.join(self.types)}" if self.types else ""
        return (f"compiling kernels{kinds} (first run only, cached for later runs): "
                f"{self.count} done, {time.perf_counter() - self.t0:.0f} s")

    def on_start(self, name: str) -> None:
        if self.depth == 0 and self.count == 0:
            self.t0 = time.perf_counter()
            if not self.tty:
                print("compiling kernels (first run only, cached for later runs) ...", file=self.stream, flush=True)
        self.depth += 1
        for m in _TYPE_IN_NAME.findall(name):
            t = m.upper()
            if t not in self.types:
                self.types.append(t)

    def on_end(self) -> None:
        self.depth -= 1
        self.count += 1
        now = time.perf_counter()
        if self.tty and now - self.shown > 0.25:
            self.shown = now
            print("\r\033[K" + self._status(), end="", file=self.stream, flush=True)

    def done(self) -> None:
        """The summary line, once the command's compiles are over (nothing if nothing compiled)."""
        if self.count:
            print(("\r\033[K" if self.tty else "") + self._status().replace(": ", " -- ", 1),
                  file=self.stream, flush=True)
            self.count = 0
            self.types = []


_NOTICE: CompileNotice | None = None
_LISTENER = None


def announce_compiles(stream=None) -> CompileNotice | None:
    """Install (once) the listener that reports cold compiles; returns it (None when silenced)."""
    global _NOTICE, _LISTENER
    if _NOTICE is not None or not config.compile_notice():
        return _NOTICE
    from numba.core import event

    notice = CompileNotice(stream)

    class _Listener(event.Listener):
        def on_start(self, ev):
            d = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
            notice.on_start(getattr(getattr(d, "py_func", None), "__name__", ""))

        def on_end(self, ev):
            notice.on_end()

    _LISTENER = _Listener()
    event.register("numba:compile", _LISTENER)
    _NOTICE = notice
    return notice


def compiles_done() -> None:
    """End of a command: print the compile summary if anything was compiled."""
    if _NOTICE is not None:
        _NOTICE.done()


announce_compiles()  # when the command line asked for it (QUANTKIT_COMPILE_NOTICE=1)
