"""TP-invariant linear layers for the tree contract (issue 25, item 3): logits whose bits do not
depend on the TP size, the batch or the request's place in it.

    import exactcoll.torch, exactcoll.linear as xl
    comm = exactcoll.torch.Communicator(group, contract="tree")          # TP > 1
    o_proj = xl.TreeRowParallelLinear.from_full(w_o, tp_rank, tp_size, leaves=8, comm=comm)
    qkv = xl.TreeColumnParallelLinear.from_full([w_q, w_k, w_v], tp_rank, tp_size)
    y = o_proj(x)                       # the tree over all 8 leaves, on every TP size
    partial = o_proj(x, reduce=False)   # this rank's subtree, for comm.fused_add_rms_norm

The pieces:
- invariant_matmul(a, b): C = A @ B (bf16/fp16, fp32 accumulation, one rounding) by
  exactcoll_invariant_matmul: exactcoll's own tensor-core kernel (cuda_backend/linear/
  tile_matmul.h), whose every output element is the same sequence of MMAs over K whatever M, N,
  the batch count or where the operands sit, so its bits depend only on its row of A, its column
  of B and K (python/tests/gpu_invariant_matmul_check.py checks it on a GPU).
  EXACTCOLL_INVARIANT_MATMUL=cublaslt runs a pinned cuBLASLt configuration instead (an
  experiment: invariant_matmul.h). config(k) names the kernel or configuration.
- TreeColumnParallelLinear: no K split; rank r computes its N/T output columns with the whole K, so
  its columns are bit for bit the TP = 1 layer's.
- TreeRowParallelLinear: K splits into L leaves (L a power of two, default 8); rank r holds leaves
  r L/T .. (r+1) L/T - 1. Each leaf's product x_leaf @ W_leaf^T is rounded to storage, the rank sums
  its leaves as the balanced binary tree (torch's bf16/fp16 `a + b` on CUDA is float(a) + float(b)
  rounded once: contract::tree_node), and the tree communicator's all-reduce adds the tree's levels
  above the ranks. The result is the tree over all L leaves whatever T is. With 2 or more leaves
  on the rank and _PAIR_MIN_ROWS (256) rows or more the tree's first level is fused into the
  product (exactcoll_invariant_matmul_pairs: each block computes two leaves' products in turn and
  stores their node, so the leaf products are never written), then tree_sum adds the levels
  above; the same bits as the batched leaf products (leaf_products) followed by tree_sum.
- row_parallel_shard / column_parallel_shard: a full torch-layout weight [out, in] to a rank's
  shard, so that TP = 1, 2, 4, 8 load the same parameters.
Autograd: the backward passes are plain torch products (not invariant; they need not be).
Modules keep W^T ([in, out], `weight_t`), the layout the row-major product takes without a copy.
"""

import ctypes

import torch

from . import _lib

__all__ = ["invariant_matmul", "config", "tree_sum", "tree_all_reduce_gathered", "row_parallel_shard",
           "column_parallel_shard", "TreeRowParallelLinear", "TreeColumnParallelLinear"]

_DTYPE_CODES = {torch.bfloat16: _lib.DTYPES["bf16"], torch.float16: _lib.DTYPES["fp16"]}
_CURRENT_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_I64 = ctypes.c_int64
_MATMUL_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p] + [_I64] * 10 + [ctypes.c_int, ctypes.c_int,
                                                                                      ctypes.c_void_p]
_functions = None


def _bound():
    """(matmul, config, pairs): the C functions, bound on first use. The products only enqueue work
    and go through a PyDLL handle (keep the GIL, like exactcoll.torch's ops); config may run
    cuBLASLt's heuristic and goes through the CDLL handle (releases it)."""
    global _functions
    if _functions is None:
        path = _lib.lib._name
        try:
            matmul = ctypes.PyDLL(path).exactcoll_invariant_matmul
            pairs = ctypes.PyDLL(path).exactcoll_invariant_matmul_pairs
            config_fn = ctypes.CDLL(path).exactcoll_invariant_matmul_config
        except AttributeError as e:
            raise _lib.UnavailableError(_lib.ERROR_UNAVAILABLE, f"{path} lacks exactcoll_invariant_matmul or "
                                        f"exactcoll_invariant_matmul_pairs: the library predates this exactcoll.linear "
                                        f"(rebuild the wheel)") from e
        for fn in (matmul, pairs):  # the same argument list: pointers, 10 int64s, dtype, device, stream
            fn.argtypes, fn.restype = _MATMUL_ARGTYPES, ctypes.c_int
        config_fn.argtypes = [ctypes.c_int, _I64, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        config_fn.restype = ctypes.c_int
        _functions = (matmul, config_fn, pairs)
    return _functions


def config(k, dtype=torch.bfloat16, device=None):
    """The cuBLASLt configuration invariant_matmul pins for (dtype, k) on device (an index, a
    torch.device or None for the current one), as text: runs whose bits are compared must show the
    same text for each K."""
    if dtype not in _DTYPE_CODES:
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    if device is None:
        index = torch.cuda.current_device()
    elif isinstance(device, int):
        index = device
    else:
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
    text = ctypes.create_string_buffer(512)
    _lib.check(_bound()[1](_DTYPE_CODES[dtype], _lib.int_option("k", k, _I64, 1), index, text, len(text)))
    return text.value.decode()


# ---- the product ------------------------------------------------------------------------------------

def _aligned(t):
    return t.data_ptr() % 16 == 0


def _operand(t, what):
    """t ([..., rows, cols], last dim unit-stride, 16-byte aligned rows), copied into fresh memory
    where its layout is not one the product takes (the copy holds the same values, so the same
    bits come out)."""
    rows, cols = t.shape[-2], t.shape[-1]
    ok = t.stride(-1) == 1 or cols == 1
    # Rows that do not overlap (an expanded tensor's stride 0 or a stride below the row length is
    # copied) at multiples of 8 elements; batch entries likewise.
    ok = ok and _aligned(t) and (rows == 1 or (t.stride(-2) % 8 == 0 and t.stride(-2) >= cols))
    ok = ok and (t.dim() == 2 or t.shape[0] == 1 or (t.stride(0) % 8 == 0 and t.stride(0) >= rows * max(cols, 1)))
    if not ok:
        t = t.clone(memory_format=torch.contiguous_format)
    if cols % 8 != 0 and (rows > 1 or t.dim() == 3):
        raise ValueError(f"{what}'s last dimension ({cols}) must be a multiple of 8 (16-byte rows)")
    return t


def _ld(t):
    rows, cols = t.shape[-2], t.shape[-1]
    return t.stride(-2) if rows > 1 else (cols + 7) // 8 * 8


def _matmul_into(a, b, out, batch):
    """out [batch, m, n] (or [m, n]) = a @ b through the C function; a [.., m, k], b [.., k, n];
    a 2-D operand of a batched product is shared by every batch (stride 0)."""
    matmul = _bound()[0]
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    device = a.get_device()
    stream = _CURRENT_STREAM(device) if _CURRENT_STREAM else torch.cuda.current_stream(device).cuda_stream
    status = matmul(a.data_ptr(), b.data_ptr(), out.data_ptr(), m, k, n, batch, _ld(a), _ld(b), _ld(out),
                    a.stride(0) if a.dim() == 3 and a.shape[0] > 1 else 0,
                    b.stride(0) if b.dim() == 3 and b.shape[0] > 1 else 0,
                    out.stride(0) if out.dim() == 3 and batch > 1 else 0,
                    _DTYPE_CODES[a.dtype], device, stream)
    if status:
        _lib.check(status)
    return out


def _invariant_matmul(a, b, out=None):
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        raise ValueError("a and b must be torch.Tensors")
    if a.dtype not in _DTYPE_CODES or b.dtype != a.dtype:
        raise ValueError(f"a and b must both be torch.bfloat16 or both torch.float16, got {a.dtype} and {b.dtype}")
    if not a.is_cuda or b.device != a.device:
        raise ValueError(f"a and b must be on one CUDA device, got {a.device} and {b.device}")
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise ValueError(f"a [m, k] or [batch, m, k] and b [k, n] or [batch, k, n], got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a's k ({a.shape[-1]}) differs from b's ({b.shape[-2]})")
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    for t, what in ((a, "a"), (b, "b")):
        if t.dim() == 3 and t.shape[0] not in (1, batch):
            raise ValueError(f"{what}'s batch ({t.shape[0]}) differs from the other operand's ({batch})")
    m, n = a.shape[-2], b.shape[-1]
    shape = (batch, m, n) if a.dim() == 3 or b.dim() == 3 else (m, n)
    if out is None:
        out = torch.empty(shape, dtype=a.dtype, device=a.device)
    elif (tuple(out.shape) != shape or out.dtype != a.dtype or out.device != a.device or out.stride(-1) != 1
          or not _aligned(out)):
        raise ValueError(f"out must be a {shape} {a.dtype} tensor on {a.device} with unit-stride, 16-byte aligned rows")
    if m == 0 or n == 0 or batch == 0:
        return out
    if a.shape[-1] == 0:
        return out.zero_()
    a, b = _operand(a, "a"), _operand(b, "b")
    return _matmul_into(a, b, out, batch)


class _InvariantMatmulFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _invariant_matmul(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = torch.matmul(grad, b.transpose(-1, -2))
            if a.dim() == 2 and grad_a.dim() == 3:
                grad_a = grad_a.sum(0)
            elif a.dim() == 3 and a.shape[0] == 1 and grad_a.shape[0] != 1:
                grad_a = grad_a.sum(0, keepdim=True)
        if ctx.needs_input_grad[1]:
            grad_b = torch.matmul(a.transpose(-1, -2), grad)
            if b.dim() == 2 and grad_b.dim() == 3:
                grad_b = grad_b.sum(0)
            elif b.dim() == 3 and b.shape[0] == 1 and grad_b.shape[0] != 1:
                grad_b = grad_b.sum(0, keepdim=True)
        return grad_a, grad_b


def invariant_matmul(a, b, *, out=None):
    """a @ b for CUDA bf16/fp16 tensors, every output element's bits a function of its row of a,
    its column of b and K only (not of M, N, the batch or the layout). a [m, k] or [batch, m, k],
    b [k, n] or [batch, k, n] (a 2-D operand is shared by every batch); returns [m, n] or
    [batch, m, n] in a's dtype, on the current stream. Rows must be unit-stride and K, N multiples
    of 8 (16-byte rows); other layouts are copied first. Differentiable (a plain torch backward).
    out= (no autograd) writes into a given tensor."""
    if out is None and torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _InvariantMatmulFn.apply(a, b)
    return _invariant_matmul(a, b, out)


# ---- the tree ---------------------------------------------------------------------------------------

def tree_sum(stacked, *, out=None):
    """The balanced binary tree over stacked[0 .. n-1] (n a power of two): each node is torch's
    `left + right`, one float add rounded once to the storage type (contract::tree_node for bf16 and
    fp16 on CUDA). tree_sum([x0, x1, x2, x3]) = (x0 + x1) + (x2 + x3). out= (shape stacked[0]'s)
    receives the root instead of a new tensor; with one leaf the leaf is copied there."""
    n = stacked.shape[0]
    if n < 1 or n & (n - 1):
        raise ValueError(f"tree_sum needs a power-of-two count of leaves, got {n}")
    while n > 2 or (n == 2 and out is None):
        pairs = stacked.reshape(n // 2, 2, *stacked.shape[1:])
        stacked = pairs[:, 0] + pairs[:, 1]
        n //= 2
    if out is None:
        return stacked[0]
    if n == 2:
        return torch.add(stacked[0], stacked[1], out=out)
    return out.copy_(stacked[0])


def tree_all_reduce_gathered(partial, group=None):
    """The tree contract's all-reduce the slow way (SGLang's): every rank's partial gathered, then
    the tree of them in rank order with torch adds. The same bits as a tree-contract communicator's
    all_reduce for a power-of-two world; a reference to check it against, and a stand-in where no
    such communicator exists. Uses NCCL when the group's backend is NCCL, else gathers through the
    CPU (gloo)."""
    import torch.distributed as dist
    world = dist.get_world_size(group)
    if world == 1:
        return partial
    partial = partial.contiguous()
    try:
        nccl = dist.get_backend(group) == "nccl"
    except (RuntimeError, ValueError):
        nccl = False
    if nccl:
        gathered = torch.empty((world,) + tuple(partial.shape), dtype=partial.dtype, device=partial.device)
        dist.all_gather_into_tensor(gathered, partial, group=group)
    else:
        host = partial.cpu()
        pieces = [torch.empty_like(host) for _ in range(world)]
        dist.all_gather(pieces, host, group=group)
        gathered = torch.stack(pieces).to(partial.device)
    return tree_sum(gathered)


class _TreeAllReduce(torch.autograd.Function):
    """comm.all_reduce forward; the identity backward (the reduced output is replicated, so each
    rank's partial gets the output's gradient)."""

    @staticmethod
    def forward(ctx, partial, comm):
        return comm.all_reduce(partial.contiguous())

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _CopyToTensorParallel(torch.autograd.Function):
    """The identity forward; the backward all-reduces the input's gradient over the ranks (a
    column-parallel layer's input feeds every rank's columns). Not invariant (it need not be)."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_reduce(grad.contiguous()), None


class _GatherColumns(torch.autograd.Function):
    """[M, N/T] per rank -> [M, N] on every rank (comm.all_gather: a bit copy); backward: this
    rank's columns of the gradient."""

    @staticmethod
    def forward(ctx, y, comm, rank, size):
        ctx.rank, ctx.size = rank, size
        gathered = comm.all_gather(y.contiguous())  # [T * M, N/T], rank-major
        m, cols = y.shape
        return gathered.view(size, m, cols).permute(1, 0, 2).reshape(m, size * cols)

    @staticmethod
    def backward(ctx, grad):
        cols = grad.shape[1] // ctx.size
        return grad[:, ctx.rank * cols:(ctx.rank + 1) * cols].contiguous(), None, None, None


def _leaves_call(which, x, weight_t, leaves, count, out, ldc, stride_c):
    """One call of the C product `which` (0: exactcoll_invariant_matmul, batch = count leaves; 2:
    exactcoll_invariant_matmul_pairs, count pairs) over x [M, leaves * Kl] and W^T [leaves * Kl, N]:
    leaf l's A is x's columns l Kl.. (Kl elements apart in each row), its B W^T's rows l Kl.. (Kl
    rows apart); C entries stride_c apart with rows ldc apart. No autograd."""
    m, n = x.shape[0], weight_t.shape[1]
    kl = x.shape[1] // leaves
    if m == 0:
        return out
    x = _operand(x, "x")
    weight_t = _operand(weight_t, "weight_t")
    device = x.get_device()
    stream = _CURRENT_STREAM(device) if _CURRENT_STREAM else torch.cuda.current_stream(device).cuda_stream
    status = _bound()[which](x.data_ptr(), weight_t.data_ptr(), out.data_ptr(), m, kl, n, count, _ld(x),
                             weight_t.stride(0), ldc, kl, kl * weight_t.stride(0), stride_c, _DTYPE_CODES[x.dtype],
                             device, stream)
    if status:
        _lib.check(status)
    return out


def _leaf_products_into(x, weight_t, leaves, out):
    """out [leaves, M, N] (contiguous) = each leaf's product x[:, l Kl:(l+1) Kl] @ W^T[l Kl:(l+1) Kl],
    rounded to storage: one batched invariant product (batch = leaves, A's leaves Kl apart in each
    row, B's leaves Kl rows apart). No autograd."""
    return _leaves_call(0, x, weight_t, leaves, leaves, out, weight_t.shape[1], x.shape[0] * weight_t.shape[1])


def _pair_products_into(x, weight_t, pairs, out):
    """out [pairs, M, N] = for each pair p the tree node of leaves 2p and 2p+1: round(float(P_2p) +
    float(P_2p+1)), P_l = x[:, l Kl:(l+1) Kl] @ W^T[l Kl:(l+1) Kl] rounded to storage (the leaf
    product _leaf_products_into computes, bit for bit): one exactcoll_invariant_matmul_pairs call,
    the leaf products never written to memory. out's rows unit-stride and 16-byte aligned, its rows
    and pair entries at multiples of 8 elements (a view of a larger buffer is fine: its strides are
    passed). No autograd."""
    return _leaves_call(2, x, weight_t, 2 * pairs, pairs, out, _ld(out), out.stride(0) if pairs > 1 else 0)


def _leaf_grads(ctx, grad):
    """The backward of x [M, Lr * Kl], W^T [Lr * Kl, N] -> leaves [Lr, M, N], given each leaf's
    gradient grad [Lr, M, N]: plain torch products (not invariant; they need not be)."""
    x, weight_t = ctx.saved_tensors
    leaves = ctx.leaves
    m, n = x.shape[0], weight_t.shape[1]
    kl = x.shape[1] // leaves
    w = weight_t.reshape(leaves, kl, n)
    grad_x = grad_w = None
    if ctx.needs_input_grad[0]:
        grad_x = torch.bmm(grad, w.transpose(1, 2)).permute(1, 0, 2).reshape(m, leaves * kl)
    if ctx.needs_input_grad[1]:
        grad_w = torch.bmm(x.reshape(m, leaves, kl).permute(1, 2, 0), grad).reshape(leaves * kl, n)
    return grad_x, grad_w


class _LeafProducts(torch.autograd.Function):
    """x [M, Lr * Kl] and W^T [Lr * Kl, N] -> [Lr, M, N]: leaf l's product x[:, l Kl:(l+1) Kl] @
    W^T[l Kl:(l+1) Kl], each rounded to storage: one batched invariant product (batch = leaves,
    A's leaves Kl apart in each row, B's leaves Kl rows apart)."""

    @staticmethod
    def forward(ctx, x, weight_t, leaves):
        ctx.save_for_backward(x, weight_t)
        ctx.leaves = leaves
        out = torch.empty((leaves, x.shape[0], weight_t.shape[1]), dtype=x.dtype, device=x.device)
        return _leaf_products_into(x, weight_t, leaves, out)

    @staticmethod
    def backward(ctx, grad):
        return _leaf_grads(ctx, grad) + (None,)


class _PairProducts(torch.autograd.Function):
    """x [M, Lr * Kl] and W^T [Lr * Kl, N] -> [Lr / 2, M, N]: the tree's first level over the leaves,
    pair p = node(leaf 2p, leaf 2p+1), each leaf's product rounded to storage, in one
    exactcoll_invariant_matmul_pairs call (the bits of _LeafProducts followed by torch's `+` of each
    pair). Backward: a node is the sum of its two leaves, so each leaf gets the node's gradient."""

    @staticmethod
    def forward(ctx, x, weight_t, pairs):
        ctx.save_for_backward(x, weight_t)
        ctx.leaves = 2 * pairs
        out = torch.empty((pairs, x.shape[0], weight_t.shape[1]), dtype=x.dtype, device=x.device)
        return _pair_products_into(x, weight_t, pairs, out)

    @staticmethod
    def backward(ctx, grad):
        return _leaf_grads(ctx, grad.repeat_interleave(2, dim=0)) + (None,)


# ---- sharding -----------------------------------------------------------------------------------------

def _check_tp(tp_rank, tp_size):
    if not (isinstance(tp_size, int) and tp_size >= 1 and isinstance(tp_rank, int) and 0 <= tp_rank < tp_size):
        raise ValueError(f"tp_rank must be 0..tp_size-1 and tp_size >= 1, got {tp_rank} of {tp_size}")


def _check_leaves(in_features, tp_size, leaves):
    if not (isinstance(leaves, int) and leaves >= 1 and leaves & (leaves - 1) == 0):
        raise ValueError(f"leaves must be a power of two, got {leaves!r}")
    if leaves % tp_size:
        raise ValueError(f"tp_size ({tp_size}) must divide leaves ({leaves})")
    if in_features % leaves or (in_features // leaves) % 8:
        raise ValueError(f"in_features ({in_features}) must be leaves ({leaves}) x a multiple of 8")


def row_parallel_shard(weight, tp_rank, tp_size, leaves=8):
    """Rank tp_rank's W^T shard [in / T, out] of a full torch-layout weight [out, in]: its leaves
    tp_rank L/T .. (tp_rank+1) L/T - 1 of K (contiguous), transposed and contiguous."""
    _check_tp(tp_rank, tp_size)
    _check_leaves(weight.shape[1], tp_size, leaves)
    local = weight.shape[1] // tp_size
    return weight[:, tp_rank * local:(tp_rank + 1) * local].t().contiguous()


def column_parallel_shard(weights, tp_rank, tp_size):
    """Rank tp_rank's W^T shard [in, sum(out_i / T)] of one full torch-layout weight [out, in], or of
    several sharing the input (fused Q/K/V or gate/up: each split over the ranks on its own, then
    concatenated, so rank r holds its heads of Q, of K and of V)."""
    _check_tp(tp_rank, tp_size)
    weights = [weights] if isinstance(weights, torch.Tensor) else list(weights)
    shards = []
    for w in weights:
        if w.shape[0] % tp_size:
            raise ValueError(f"out_features ({w.shape[0]}) must be a multiple of tp_size ({tp_size})")
        local = w.shape[0] // tp_size
        shards.append(w[tp_rank * local:(tp_rank + 1) * local])
    return torch.cat(shards, 0).t().contiguous()


# ---- modules ------------------------------------------------------------------------------------------

_SIDE_STREAMS = {}

# The rows from which TreeRowParallelLinear takes the pair product: its fused kernels serve M >= 256
# (cuda_backend/linear/tile_matmul.h); below, a pair runs as two plain products (half the blocks
# each) and an add, slower at decode than the batched leaf products and tree_sum (measured 4 x H100,
# docs/benchmarks.md), with the same bits either way.
_PAIR_MIN_ROWS = 256


def _side_stream(device):
    """The process's high-priority stream on `device` for the all-reduces that overlap the next
    rows' products (high priority: its kernels take SMs as the product's blocks retire, so the
    all-reduce, which paces the pipeline, is not queued behind a whole product). torch hands it
    out from its pool of high-priority streams, which other code may use too: that can only add
    false dependencies, and where it is the caller's own stream _overlapped runs inline."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _SIDE_STREAMS.get(index)
    if stream is None:
        # A priority below the device's range maps to its highest (torch.cuda.Stream's contract).
        stream = _SIDE_STREAMS[index] = torch.cuda.Stream(device=index, priority=-64)
    return stream


class TreeRowParallelLinear(torch.nn.Module):
    """y = x @ W^T with K split into `leaves` leaves over tp_size ranks, summed as the tree contract's
    balanced binary tree (module docstring). x [..., in_features / tp_size] (this rank's K
    columns); forward(x) returns the full sum [..., out_features] (all-reduced through comm, a
    tree-contract Communicator, when tp_size > 1), forward(x, reduce=False) this rank's partial
    (the tree over its own leaves), for comm.fused_add_rms_norm. Bias-free (Llama's projections).

    Overlap (prefill). With more than chunk_rows rows (default 1024; 0 turns it off) and no autograd
    recording, forward(x) runs the rows in chunks of chunk_rows: chunk i's all-reduce runs on a
    side stream while chunk i+1's products run on the caller's stream, and the caller's stream
    waits for the last all-reduce before the result is used. Those all-reduces launch at most
    overlap_blocks blocks (default 64; 0: leave the communicator's cap as it is, by default the
    tuned grid, which takes every SM and leaves the product none): comm.set_max_blocks. The bits
    are those of the unchunked call: each element's leaf products depend only on its row
    (invariant_matmul), the local tree and the all-reduce's tree contract work element by element
    on any size, algorithm and grid. Every rank must use the same chunk_rows and overlap_blocks
    (the chunks are collectives). docs/benchmarks.md has the measurements behind both defaults
    (4 x H100)."""

    def __init__(self, in_features, out_features, tp_rank=0, tp_size=1, leaves=8, comm=None, *,
                 dtype=torch.bfloat16, device=None, chunk_rows=1024, overlap_blocks=64):
        super().__init__()
        _check_tp(tp_rank, tp_size)
        _check_leaves(in_features, tp_size, leaves)
        for name, value in (("chunk_rows", chunk_rows), ("overlap_blocks", overlap_blocks)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
                zero = "no overlap" if name == "chunk_rows" else "the tuned grid"
                raise ValueError(f"{name} must be an int >= 0 (0: {zero}), got {value!r}")
        self.chunk_rows, self.overlap_blocks = chunk_rows, overlap_blocks
        if out_features % 8:
            raise ValueError(f"out_features ({out_features}) must be a multiple of 8")
        if dtype not in _DTYPE_CODES:
            raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
        if tp_size > 1 and comm is not None and getattr(comm, "world_size", tp_size) != tp_size:
            raise ValueError(f"comm has {comm.world_size} ranks, tp_size is {tp_size}")
        self.in_features, self.out_features = in_features, out_features
        self.tp_rank, self.tp_size, self.leaves, self.comm = tp_rank, tp_size, leaves, comm
        self.local_leaves = leaves // tp_size
        self.leaf_features = in_features // leaves
        self.local_in_features = in_features // tp_size
        self.weight_t = torch.nn.Parameter(torch.empty(self.local_in_features, out_features, dtype=dtype,
                                                       device=device))

    @classmethod
    def from_full(cls, weight, tp_rank=0, tp_size=1, leaves=8, comm=None, *, chunk_rows=1024, overlap_blocks=64):
        """The module holding rank tp_rank's shard of a full torch-layout weight [out, in], on its device."""
        module = cls(weight.shape[1], weight.shape[0], tp_rank, tp_size, leaves, comm, dtype=weight.dtype,
                     device=weight.device, chunk_rows=chunk_rows, overlap_blocks=overlap_blocks)
        with torch.no_grad():
            module.weight_t.copy_(row_parallel_shard(weight, tp_rank, tp_size, leaves))
        return module

    def leaf_products(self, x):
        """[local_leaves, M, out_features]: each of this rank's leaves' products, rounded to storage
        (x [M, in_features / tp_size])."""
        return _LeafProducts.apply(x, self.weight_t, self.local_leaves)

    def pair_products(self, x):
        """[local_leaves / 2, M, out_features]: the first level of this rank's leaf tree, pair p =
        round(float(leaf 2p) + float(leaf 2p+1)) of leaf_products(x)'s leaves, bit for bit, in one
        product that never writes the leaves (local_leaves >= 2; x [M, in_features / tp_size])."""
        if self.local_leaves < 2:
            raise ValueError(f"pair_products needs at least 2 leaves on this rank, it has {self.local_leaves}")
        return _PairProducts.apply(x, self.weight_t, self.local_leaves // 2)

    def _local_tree(self, x2):
        """This rank's partial: the tree over its leaves (the pair products' tree from 2 leaves and
        _PAIR_MIN_ROWS rows on)."""
        if self.local_leaves == 1 or x2.shape[0] < _PAIR_MIN_ROWS:
            return tree_sum(self.leaf_products(x2))
        return tree_sum(self.pair_products(x2))

    def forward(self, x, reduce=True):
        if x.shape[-1] != self.local_in_features:
            raise ValueError(f"x's last dimension must be this rank's {self.local_in_features} features, got "
                             f"{x.shape[-1]}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.local_in_features)
        reducing = reduce and self.tp_size > 1
        if reducing and self.comm is None:
            raise ValueError("tp_size > 1 needs comm (a tree-contract Communicator) to reduce; or pass reduce=False")
        recording = torch.is_grad_enabled() and (x.requires_grad or self.weight_t.requires_grad)
        if reducing and 0 < self.chunk_rows < x2.shape[0] and not recording:
            return self._overlapped(x2).view(*lead, self.out_features)
        partial = self._local_tree(x2).view(*lead, self.out_features)
        if not reducing:
            return partial
        return _TreeAllReduce.apply(partial, self.comm)

    def _overlapped(self, x2):
        """forward(x2) in chunks of chunk_rows rows, each chunk's all-reduce beside the next chunk's
        products (class docstring). The partials and the result are allocated here on the caller's
        stream, which waits for the side stream before returning: later work on the caller's stream,
        the reuse of these blocks by the caching allocator included, is ordered after the side
        stream's reads and writes (no record_stream is needed, and CUDA-graph capture records the
        fork and the join as graph edges)."""
        m, rows = x2.shape[0], self.chunk_rows
        out = torch.empty((m, self.out_features), dtype=x2.dtype, device=x2.device)
        partial = torch.empty_like(out)
        # 1 or 2 leaves here: the leaf's product, or the pair's node, is the partial (written there directly).
        pairs = self.local_leaves // 2
        leaves = None if pairs < 2 else torch.empty((pairs, min(rows, m), self.out_features), dtype=x2.dtype,
                                                    device=x2.device)
        main = torch.cuda.current_stream(x2.device) if x2.device.type == "cuda" else None
        side = _side_stream(x2.device) if main is not None else None
        if side == main:
            side = None  # no second stream to overlap on: the chunks run inline
        capped = self.overlap_blocks > 0  # 0: whatever cap the caller set stays
        previous_cap = self.comm.set_max_blocks(self.overlap_blocks) if capped else None
        try:
            self._chunks(x2, out, partial, leaves, main, side)
        finally:
            try:
                if side is not None:
                    main.wait_stream(side)  # first: nothing later on main may touch these rows before
            finally:
                if capped:
                    self.comm.set_max_blocks(previous_cap)
        return out

    def _chunks(self, x2, out, partial, leaves, main, side):
        """Each chunk's local tree into partial's rows on main (_local_tree_into), then its
        all-reduce into out's rows on side after main's work so far (host stand-ins: inline)."""
        m, rows = x2.shape[0], self.chunk_rows
        for first in range(0, m, rows):
            last = min(m, first + rows)
            self._local_tree_into(x2[first:last], partial[first:last], leaves)
            if side is None:  # inline (host stand-ins in the CPU tests, or no second stream)
                self.comm.all_reduce(partial[first:last], out=out[first:last])
                continue
            side.wait_stream(main)  # this chunk's partial (and, the first time, x2 and everything before)
            with torch.cuda.stream(side):
                self.comm.all_reduce(partial[first:last], out=out[first:last])

    def _local_tree_into(self, x_rows, dest, pair_buffer):
        """dest [rows, N] = this rank's tree over its leaves of x_rows (no autograd), as _local_tree:
        one leaf's product written into dest; below _PAIR_MIN_ROWS rows the batched leaf products
        and tree_sum; else the pair products, into dest with 2 leaves, into pair_buffer's first rows
        ([pairs, chunk_rows, N], a view: pair entries chunk_rows rows apart, no copy) and tree_sum
        with more."""
        if self.local_leaves == 1:
            _leaf_products_into(x_rows, self.weight_t, 1, dest.unsqueeze(0))
        elif x_rows.shape[0] < _PAIR_MIN_ROWS:
            products = torch.empty((self.local_leaves,) + tuple(dest.shape), dtype=dest.dtype, device=dest.device)
            tree_sum(_leaf_products_into(x_rows, self.weight_t, self.local_leaves, products), out=dest)
        elif pair_buffer is None:  # 2 leaves: their node is the partial
            _pair_products_into(x_rows, self.weight_t, 1, dest.unsqueeze(0))
        else:
            products = pair_buffer[:, :x_rows.shape[0]]
            tree_sum(_pair_products_into(x_rows, self.weight_t, pair_buffer.shape[0], products), out=dest)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, tp={self.tp_rank}/{self.tp_size}, "
                f"leaves={self.leaves} ({self.local_leaves} here, {self.leaf_features} features each)")


class TreeColumnParallelLinear(torch.nn.Module):
    """y = x @ W^T for this rank's out_features / tp_size output columns, with the whole K in one
    invariant product (so each column's bits are the TP = 1 layer's). x [..., in_features];
    returns [..., out_features / tp_size], or [..., out_features] with gather_output (comm.all_gather,
    a bit copy). comm is also what the backward all-reduces the input's gradient through. out_features
    may be a list (fused projections: column_parallel_shard's layout; split_sizes gives each part's
    local width)."""

    def __init__(self, in_features, out_features, tp_rank=0, tp_size=1, comm=None, *, gather_output=False,
                 dtype=torch.bfloat16, device=None):
        super().__init__()
        _check_tp(tp_rank, tp_size)
        parts = [out_features] if isinstance(out_features, int) else list(out_features)
        if any(p % tp_size for p in parts):
            raise ValueError(f"every out_features ({parts}) must be a multiple of tp_size ({tp_size})")
        if in_features % 8:
            raise ValueError(f"in_features ({in_features}) must be a multiple of 8")
        if dtype not in _DTYPE_CODES:
            raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
        self.in_features, self.out_features = in_features, sum(parts)
        self.split_sizes = [p // tp_size for p in parts]
        self.local_out_features = sum(self.split_sizes)
        if self.local_out_features % 8:
            raise ValueError(f"this rank's out_features ({self.local_out_features}) must be a multiple of 8")
        self.tp_rank, self.tp_size, self.comm, self.gather_output = tp_rank, tp_size, comm, gather_output
        if gather_output and len(parts) > 1:
            raise ValueError("gather_output is for one projection (the gathered columns would interleave the parts)")
        self.weight_t = torch.nn.Parameter(torch.empty(in_features, self.local_out_features, dtype=dtype,
                                                       device=device))

    @classmethod
    def from_full(cls, weights, tp_rank=0, tp_size=1, comm=None, *, gather_output=False):
        """The module holding rank tp_rank's columns of one full torch-layout weight [out, in] or of
        several sharing the input (column_parallel_shard)."""
        ws = [weights] if isinstance(weights, torch.Tensor) else list(weights)
        module = cls(ws[0].shape[1], [w.shape[0] for w in ws], tp_rank, tp_size, comm, gather_output=gather_output,
                     dtype=ws[0].dtype, device=ws[0].device)
        with torch.no_grad():
            module.weight_t.copy_(column_parallel_shard(ws, tp_rank, tp_size))
        return module

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x's last dimension must be {self.in_features}, got {x.shape[-1]}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.tp_size > 1 and self.comm is not None and torch.is_grad_enabled() and x.requires_grad:
            x2 = _CopyToTensorParallel.apply(x2, self.comm)
        y = invariant_matmul(x2, self.weight_t)
        if self.gather_output and self.tp_size > 1:
            if self.comm is None:
                raise ValueError("gather_output with tp_size > 1 needs comm")
            y = _GatherColumns.apply(y, self.comm, self.tp_rank, self.tp_size)
            return y.view(*lead, self.out_features)
        return y.view(*lead, self.local_out_features)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} ({self.split_sizes} here), "
                f"tp={self.tp_rank}/{self.tp_size}, gather_output={self.gather_output}")
