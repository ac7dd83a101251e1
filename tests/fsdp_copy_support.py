"""Workers for ``tests/test_fsdp_copies.py`` and ``tests/test_fsdp_fp8_gather.py``: FSDP2 with
torchtitan's mixed precision (bf16 parameters, fp32 reduction) on two gloo CPU ranks, its copy ops
counted by ``meshplan verify comm``'s dispatch mode, its all-gather buffers and its Float8 gathers
recorded. One pair of spawned ranks runs them all, once a session, each worker in a process group
of its own: starting a rank (importing torch) is most of a worker's time."""

from __future__ import annotations

import functools
import importlib.util


def on_two_ranks(worker) -> list:
    """What ``worker(rank, 2, port, out)`` puts on ``out`` on each of two spawned gloo ranks, in rank order."""
    return _two_rank_results()[worker.__name__]


def _workers() -> list:
    names = ["copy_records", "gather_buffer_events"]
    if importlib.util.find_spec("torchao") is not None:
        names.append("fp8_gather_records")
    return names


@functools.cache
def _two_rank_results() -> dict[str, list]:
    """Every worker of :func:`_workers` run in turn on the same two spawned ranks: per worker, what
    each rank put on ``out``, in rank order. A rank killed by a signal (the machine's out-of-memory
    killer) starts both again once; a rank's own error (exit code 1) fails at once."""
    import warnings

    try:
        return _run_two_ranks()
    except _RankKilled as lost:
        warnings.warn(f"{lost}: starting both ranks again", RuntimeWarning, stacklevel=2)
        return _run_two_ranks()


class _RankKilled(RuntimeError):
    pass


def _run_two_ranks() -> dict[str, list]:
    import multiprocessing as mp
    import queue
    import time

    import torch.distributed as dist

    names = _workers()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)  # held here: no port to race for
    procs = [ctx.Process(target=_run_workers, args=(r, 2, names, store.port, out), daemon=True) for r in range(2)]
    for proc in procs:
        proc.start()
    got: dict[str, list] = {name: [None, None] for name in names}
    pending, deadline = len(names) * len(procs), time.monotonic() + 240
    try:
        while pending:
            try:
                name, rank, value = out.get(timeout=1.0)
            except queue.Empty:
                codes = [proc.exitcode for proc in procs]
                if any(code is not None and code < 0 for code in codes):
                    raise _RankKilled(f"two-rank workers: exit codes {codes}") from None
                if any(code not in (None, 0) for code in codes) or time.monotonic() > deadline:
                    raise RuntimeError(f"two-rank workers failed or hung (exit codes {codes}); their stderr says why") from None
                continue
            got[name][rank] = value
            pending -= 1
        return got
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


class _Tagged:
    """An ``out`` for one worker on one rank: what it puts, tagged with the worker's name and the rank."""

    def __init__(self, out, name: str, rank: int):
        self.out, self.name, self.rank = out, name, rank

    def put(self, value) -> None:
        self.out.put((self.name, self.rank, value))


def _run_workers(rank: int, world: int, names: list[str], port: int, out) -> None:
    for name in names:
        globals()[name](rank, world, port, _Tagged(out, name, rank))


def _join(rank: int, world: int, port: int, name: str) -> None:
    """This rank's gloo process group for worker ``name``, met through the parent's store under the
    worker's own prefix (each worker starts a fresh group on the same store)."""
    import torch.distributed as dist

    store = dist.PrefixStore(name, dist.TCPStore("127.0.0.1", port, world, is_master=False))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)


#: two bias-free linears (64 → 128 → 64): units of 8,192 parameters each
WIDTHS = (64, 128, 64)


def copy_records(rank: int, world: int, port: int, out) -> None:
    """One warm-up step, one counted step; put this rank's copy records (kind, phase, bytes) on ``out``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from meshplan.verify.comm import COPY_KIND, make_counter

    _join(rank, world, port, "copy_records")
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        mod = torch.nn.Sequential(*(torch.nn.Linear(a, b, bias=False) for a, b in zip(WIDTHS, WIDTHS[1:])))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in mod:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(mod, mesh=mesh, mp_policy=policy)
        x = torch.randn(4, WIDTHS[0])
        mod(x).sum().backward()
        counter = make_counter({})
        with counter:
            mod(x).sum().backward()
        out.put([(r["kind"], r["phase"], r["bytes"]) for r in counter.records if r["op"] in COPY_KIND])
    finally:
        dist.destroy_process_group()


#: a smaller first unit (1024 x 640: 655,360 parameters, 1.25 MiB in bf16) before four equal blocks
#: (640 x 2048: 1,310,720 each, 2.5 MiB), all beyond the allocator's 1 MiB small-pool limit
POOL_UNITS = (655_360, 1_310_720, 1_310_720, 1_310_720, 1_310_720)


def gather_buffer_events(rank: int, world: int, port: int, out) -> None:
    """The flat all-gather buffers FSDP2 allocates in one forward (torchtitan's mixed precision, each
    unit resharded after forward), as ("alloc", bytes, i) and ("free", bytes, i) in program order,
    the frees seen by a finalizer on each buffer; put them on ``out``."""
    import weakref

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group_mod

    _join(rank, world, port, "gather_buffer_events")
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        # 1024 -> 640, then 640 -> 2048 and 2048 -> 640 in turn (POOL_UNITS)
        mod = torch.nn.Sequential(torch.nn.Linear(1024, 640, bias=False),
                                  *(torch.nn.Linear(640, 2048, bias=False) if j % 2 == 0 else torch.nn.Linear(2048, 640, bias=False)
                                    for j in range(4)))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in mod:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(mod, mesh=mesh, mp_policy=policy)
        x = torch.randn(4, 1024)
        mod(x).sum().backward()  # warm-up: lazy init
        events: list = []
        original = group_mod.foreach_all_gather

        def recording(*args, **kwargs):
            result = original(*args, **kwargs)
            buf = result.all_gather_output
            i, nbytes = sum(e[0] == "alloc" for e in events), buf.numel() * buf.element_size()
            events.append(("alloc", nbytes, i))
            weakref.finalize(buf, events.append, ("free", nbytes, i))
            return result

        group_mod.foreach_all_gather = recording
        try:
            y = mod(x)  # the forward whose all-gathers are recorded
            forward = list(events)
            y.sum().backward()
        finally:
            group_mod.foreach_all_gather = original
        out.put(forward)
    finally:
        dist.destroy_process_group()


#: a Llama block small enough for CPU, every linear's sides multiples of 16 (torchao's rule):
#: hidden, heads, K/V heads, MLP width
FP8_BLOCK = (256, 4, 2, 512)


def fp8_gather_records(rank: int, world: int, port: int, out) -> None:
    """One Llama block under torchao's Float8 training (tensorwise, ``emulate`` for the CPU) as one
    FSDP2 unit with torchtitan's mixed precision, FP8 all-gather off and on (with the scales
    precomputed, as torchtitan runs it): per setting, the bytes of the unit's all-gather and of
    each unsharded parameter (a Float8 weight's FP8 data) after one step, and the amax reductions
    (``aten.max`` of a whole tensor) of one forward and its backward; put them on ``out``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils._python_dispatch import TorchDispatchMode
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp

    class AmaxCount(TorchDispatchMode):
        """Counts torchao's ``tensor_to_amax`` reductions: ``max`` over a whole tensor."""

        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func is torch.ops.aten.max.default
            return func(*args, **(kwargs or {}))

    from meshplan.verify.llama_block import Block, precompute_freqs_cis

    _join(rank, world, port, "fp8_gather_records")
    try:
        mesh = init_device_mesh("cpu", (world,))
        h, a, g, f = FP8_BLOCK
        freqs = precompute_freqs_cis(h // a, 32)
        result = {}
        for fp8_gather in (False, True):
            torch.manual_seed(0)
            block = Block(h, a, g, f)
            convert_to_float8_training(block, config=Float8LinearConfig(enable_fsdp_float8_all_gather=fp8_gather, emulate=True))
            fully_shard(block, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
            block(torch.randn(2, 32, h), freqs).float().sum().backward()  # one step: the block runs either way
            gathers: list[int] = []
            original = dist.all_gather_single

            def counting(output, *args, **kwargs):
                gathers.append(output.numel() * output.element_size())
                return original(output, *args, **kwargs)

            dist.all_gather_single = counting
            try:
                block.unshard()
            finally:
                dist.all_gather_single = original
            params = {}
            for name, p in block.named_parameters():
                data = getattr(p.data, "_data", p.data)  # a Float8 tensor's FP8 payload
                params[name] = (data.numel() * data.element_size(), str(data.dtype).removeprefix("torch."))
            block.reshard()
            if fp8_gather:
                precompute_float8_dynamic_scale_for_fsdp(block)
            with AmaxCount() as forward:
                y = block(torch.randn(2, 32, h), freqs)
            with AmaxCount() as backward:
                y.float().sum().backward()
            result[fp8_gather] = {"all_gather": gathers, "params": params, "amax": (forward.n, backward.n)}
        out.put(result)
    finally:
        dist.destroy_process_group()
