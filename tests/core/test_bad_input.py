"""Bad input, table-driven: every entry is (description, program snippet, exception type, regex).

A snippet with ``where="rank"`` runs on every simulated rank (3 by default) after
``init_process_group`` (unless ``init=False``); the error must reach the caller as
``simdist.RankError`` whose ``__cause__`` has the expected type and message. A snippet
with ``where="main"`` runs in the test itself and must raise the exception directly.
Each regex names the argument and the bad value, as DESIGN.md asks of every message.
Names available to snippets: ``dist``, ``torch``, ``np``, ``rank``, ``t`` (a float32
tensor of 2 elements), ``i`` (an int64 tensor of 2 elements), ``noop`` (a rank function
that does nothing) and ``g`` (after ``g = dist.new_group([0, 1])`` in the snippet).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import simdist as dist


@dataclass(frozen=True)
class Bad:
    desc: str
    code: str
    exc: type
    match: str
    where: str = "rank"
    init: bool = True
    world: int = 3


G = "g = dist.new_group([0, 1])\n"
ON0 = "if rank == 0:\n    "

TABLE = [
    # -- ranks out of range or outside the group ------------------------------------------------------
    Bad("broadcast src too big", "dist.broadcast(t, src=3)", ValueError, r"src=3 is out of range.*0\.\.2"),
    Bad("broadcast src negative", "dist.broadcast(t, src=-1)", ValueError, r"src=-1 is out of range"),
    Bad("broadcast src not an int", "dist.broadcast(t, src=1.5)", TypeError, r"src must be an int, got float \(1\.5\)"),
    Bad("broadcast without src", "dist.broadcast(t)", ValueError, r"src=None"),
    Bad("reduce dst too big", "dist.reduce(t, dst=7)", ValueError, r"dst=7 is out of range"),
    Bad("gather dst too big", "dist.gather(t, None, dst=3)", ValueError, r"dst=3 is out of range"),
    Bad("scatter src too big", "dist.scatter(t, None, src=10)", ValueError, r"src=10 is out of range"),
    Bad("send dst too big", "dist.send(t, dst=3)", ValueError, r"dst=3 is out of range"),
    Bad("send without dst", "dist.send(t)", ValueError, r"dst=None"),
    Bad("recv src too big", "dist.recv(t, src=5)", ValueError, r"src=5 is out of range"),
    Bad("irecv src negative", "dist.irecv(t, src=-2)", ValueError, r"src=-2 is out of range"),
    Bad("src and group_src both", "dist.broadcast(t, src=0, group_src=0)", ValueError, r"src=0 or group_src=0"),
    Bad(
        "group_src out of range",
        G + "dist.broadcast(t, group=g, group_src=2)",
        ValueError,
        r"group_src=2 is out of range.*0\.\.1",
    ),
    Bad("group_dst out of range", G + "dist.reduce(t, group=g, group_dst=-1)", ValueError, r"group_dst=-1"),
    Bad(
        "src outside the group",
        G + "dist.broadcast(t, src=2, group=g)",
        ValueError,
        r"src=2 is not a member of the group.*\[0, 1\]",
    ),
    Bad(
        "dst outside the group",
        G + "dist.gather(t, [t, t] if rank == 2 else None, dst=2, group=g)",
        ValueError,
        r"dst=2 is not a member of the group",
    ),
    Bad(
        "send to a rank outside the group",
        G + "dist.send(t, dst=2, group=g)",
        ValueError,
        r"dst=2 is not a member of the group",
    ),
    Bad("group_dst of send out of range", G + "dist.send(t, group=g, group_dst=5)", ValueError, r"group_dst=5"),
    Bad(
        "init rank out of range",
        "dist.init_process_group(rank=5, world_size=3)",
        ValueError,
        r"rank=5 is out of range for world_size=3",
        init=False,
    ),
    Bad(
        "init rank of another rank",
        "dist.init_process_group(rank=(rank + 1) % 3)",
        ValueError,
        r"rank=\d but this simulated rank is rank \d",
        init=False,
    ),
    Bad(
        "init world_size of another world",
        "dist.init_process_group(world_size=4)",
        ValueError,
        r"world_size=4 but this simulation runs 3 ranks",
        init=False,
    ),
    Bad("new_group rank out of range", "dist.new_group([0, 5])", ValueError, r"ranks=\[0, 5\] has ranks \[5\] outside"),
    Bad("new_group rank twice", "dist.new_group([1, 1])", ValueError, r"ranks=\[1, 1\] names a rank more than once"),
    Bad("new_group empty", "dist.new_group([])", ValueError, r"ranks=\[\] is empty"),
    Bad("new_group ranks not a list", "dist.new_group('01')", TypeError, r"ranks must be a list.*str \('01'\)"),
    Bad(
        "new_group rank not an int",
        "dist.new_group([0, 'a'])",
        TypeError,
        r"ranks\[1\] must be an int, got str \('a'\)",
    ),
    Bad(
        "get_global_rank out of range",
        G + "dist.get_global_rank(g, 5) if rank < 2 else None",
        ValueError,
        r"group_rank=5",
    ),
    Bad(
        "get_group_rank out of range",
        G + "dist.get_group_rank(g, 9) if rank < 2 else None",
        ValueError,
        r"global_rank=9 is out of range",
    ),
    Bad(
        "get_group_rank outside the group",
        G + "dist.get_group_rank(g, 2) if rank < 2 else None",
        ValueError,
        r"global_rank=2 is not a member",
    ),
    Bad(
        "get_group_rank on a rank outside the group (NON_GROUP_MEMBER)",
        G + "import warnings\nwith warnings.catch_warnings():\n    warnings.simplefilter('ignore')\n"
        "    dist.get_group_rank(g, 0) if rank == 2 else None",
        ValueError,
        r"group is GroupMember.NON_GROUP_MEMBER .* no group ranks",
    ),
    Bad(
        "destroyed group",
        "g = dist.new_group()\ndist.destroy_process_group(g)\ndist.all_reduce(t, group=g)",
        ValueError,
        r"group=<SimGroup.*> was destroyed by destroy_process_group\(\)",
    ),
    Bad(
        "group of an earlier init",
        "g = dist.new_group()\ndist.destroy_process_group()\ndist.init_process_group()\ndist.barrier(group=g)",
        ValueError,
        r"group=.* was destroyed",
    ),
    Bad("group not a group", "dist.all_reduce(t, group='world')", TypeError, r"group must be a ProcessGroup.*'world'"),
    # -- list lengths ------------------------------------------------------------------------------------
    Bad(
        "all_gather list too short", "dist.all_gather([t, t], t)", ValueError, r"tensor_list has 2 entries, expected 3"
    ),
    Bad(
        "all_gather list not a list",
        "dist.all_gather(torch.zeros(3, 2), t)",
        TypeError,
        r"tensor_list must be a list of tensors, got Tensor",
    ),
    Bad(
        "gather list too long",
        "dist.gather(t, [t] * 4 if rank == 0 else None, dst=0)",
        ValueError,
        r"gather_list has 4 entries, expected 3",
    ),
    Bad(
        "gather list missing on dst",
        ON0 + "dist.gather(t, None, dst=0)",
        ValueError,
        r"gather_list=None on the destination rank dst=0",
    ),
    Bad(
        "gather list on another rank",
        "dist.gather(t, [t] * 3, dst=0)",
        ValueError,
        r"gather_list must be None on rank [12], which is not dst=0",
    ),
    Bad(
        "scatter list too short",
        "dist.scatter(t, [t, t] if rank == 1 else None, src=1)",
        ValueError,
        r"scatter_list has 2 entries, expected 3",
    ),
    Bad(
        "scatter list missing on src",
        "dist.scatter(t, None, src=rank)",
        ValueError,
        r"scatter_list=None on the source rank src=\d",
    ),
    Bad(
        "scatter list on another rank",
        "dist.scatter(t, [t] * 3, src=0)",
        ValueError,
        r"scatter_list must be None on rank [12], which is not src=0",
    ),
    Bad(
        "reduce_scatter list too long",
        "dist.reduce_scatter(t, [t] * 4)",
        ValueError,
        r"input_list has 4 entries, expected 3",
    ),
    Bad(
        "all_to_all output list too short",
        "dist.all_to_all([t], [t, t, t])",
        ValueError,
        r"output_tensor_list has 1 entries, expected 3",
    ),
    Bad(
        "all_to_all input list too long",
        "dist.all_to_all([t] * 3, [t] * 4)",
        ValueError,
        r"input_tensor_list has 4 entries, expected 3",
    ),
    Bad(
        "all_gather_object list too short",
        "dist.all_gather_object([None], rank)",
        ValueError,
        r"object_list has 1 entries, expected 3",
    ),
    Bad(
        "gather_object list too long",
        "dist.gather_object(rank, [None] * 5 if rank == 0 else None, dst=0)",
        ValueError,
        r"object_gather_list has 5 entries, expected 3",
    ),
    Bad(
        "scatter_object_list input too short",
        "dist.scatter_object_list([None], [1] if rank == 0 else None, src=0)",
        ValueError,
        r"scatter_object_input_list has 1 entries, expected 3",
    ),
    Bad(
        "scatter_object_list empty output",
        "dist.scatter_object_list([], [1, 2, 3], src=rank)",
        ValueError,
        r"scatter_object_output_list=\[\] is empty",
    ),
    Bad(
        "broadcast_object_list not a list",
        "dist.broadcast_object_list((1,), src=0)",
        TypeError,
        r"object_list must be a list, got tuple \(\(1,\)\)",
    ),
    # -- shapes and dtypes in output lists ------------------------------------------------------------------
    Bad(
        "all_gather entry of another size",
        "dist.all_gather([t, torch.zeros(3), t], t)",
        ValueError,
        r"tensor_list\[1\] has shape \(3,\) \(3 elements\), expected 2 elements",
    ),
    Bad(
        "all_gather entry of another dtype",
        "dist.all_gather([t, t, t.double()], t)",
        TypeError,
        r"tensor_list\[2\] has dtype float64, expected float32",
    ),
    Bad(
        "gather entry of another dtype",
        "dist.gather(t, [t, i, t] if rank == 0 else None, dst=0)",
        TypeError,
        r"gather_list\[1\] has dtype int64, expected float32",
    ),
    Bad(
        "scatter entry of another size",
        "dist.scatter(t, [t, t, torch.zeros(5)] if rank == 0 else None, src=0)",
        ValueError,
        r"scatter_list\[2\] has shape \(5,\)",
    ),
    Bad(
        "all_gather_into_tensor output too small",
        "dist.all_gather_into_tensor(torch.zeros(5), t)",
        ValueError,
        r"output_tensor has 5 elements, expected 3 x 2",
    ),
    Bad(
        "all_gather_into_tensor output dtype",
        "dist.all_gather_into_tensor(torch.zeros(6, dtype=torch.int64), t)",
        TypeError,
        r"output_tensor has dtype int64, expected float32",
    ),
    Bad(
        "reduce_scatter_tensor input too big",
        "dist.reduce_scatter_tensor(t, torch.zeros(7))",
        ValueError,
        r"input has 7 elements, expected 3 x 2",
    ),
    Bad(
        "reduce_scatter_tensor input dtype",
        "dist.reduce_scatter_tensor(t, torch.zeros(6, dtype=torch.float16))",
        TypeError,
        r"input has dtype float16, expected float32",
    ),
    Bad(
        "reduce_scatter entry of another size",
        "dist.reduce_scatter(t, [torch.zeros(3)] * 3)",
        ValueError,
        r"input_list\[\d\] has 3 elements but output has 2",
    ),
    Bad(
        "reduce_scatter entry of another dtype",
        "dist.reduce_scatter(t, [t, i, t])",
        TypeError,
        r"input_list\[1\] has dtype int64, expected float32",
    ),
    Bad(
        "all_to_all output of another dtype",
        "dist.all_to_all([t, t, i], [t, t, t])",
        TypeError,
        r"output_tensor_list\[2\] has dtype int64, expected float32",
    ),
    Bad(
        "all_to_all_single output dtype",
        "dist.all_to_all_single(torch.zeros(3, dtype=torch.int32), torch.zeros(3))",
        TypeError,
        r"output has dtype int32, expected float32",
    ),
    Bad(
        "expanded output",
        "dist.all_reduce(torch.zeros(1).expand(4))",
        ValueError,
        r"tensor has elements that share memory.*strides \(0,\)",
    ),
    Bad(
        "read-only numpy output",
        "dist.broadcast(np.broadcast_to(np.zeros(1), (3,)), src=0)",
        ValueError,
        r"tensor is a read-only numpy array",
    ),
    Bad(
        "expanded entry of an output list",
        "dist.all_gather([t, torch.zeros(1).expand(2), t], t)",
        ValueError,
        r"tensor_list\[1\] has elements that share memory",
    ),
    # -- non-tensor input -------------------------------------------------------------------------------------
    Bad(
        "all_reduce of a list",
        "dist.all_reduce([1.0, 2.0])",
        TypeError,
        r"tensor must be a torch\.Tensor, numpy\.ndarray or cupy\.ndarray, got list \(\[1\.0, 2\.0\]\)",
    ),
    Bad(
        "broadcast of a number",
        "dist.broadcast(3.0, src=0)",
        TypeError,
        r"tensor must be a torch\.Tensor.*float \(3\.0\)",
    ),
    Bad(
        "send of a string",
        "dist.send('x', dst=(rank + 1) % 3)",
        TypeError,
        r"tensor must be a torch\.Tensor.*str \('x'\)",
    ),
    Bad(
        "all_gather list of numbers",
        "dist.all_gather([1, 2, 3], t)",
        TypeError,
        r"tensor_list\[0\] must be a torch\.Tensor, numpy\.ndarray or cupy\.ndarray, got int \(1\)",
    ),
    Bad(
        "all_to_all_single input not a tensor",
        "dist.all_to_all_single(t, [1, 2])",
        TypeError,
        r"input must be a torch\.Tensor.*list",
    ),
    Bad("numpy object array", "dist.all_reduce(np.array([None, 1]))", TypeError, r"tensor has dtype object"),
    Bad(
        "sparse tensor",
        "dist.all_reduce(torch.zeros(2).to_sparse())",
        TypeError,
        r"tensor must be a dense \(strided\) tensor, got layout torch\.sparse_coo",
    ),
    Bad("meta tensor", "dist.all_reduce(torch.zeros(2, device='meta'))", TypeError, r"tensor is on device 'meta'"),
    # -- reduce ops -------------------------------------------------------------------------------------------------
    Bad(
        "AVG on int64",
        "dist.all_reduce(i, op=dist.ReduceOp.AVG)",
        TypeError,
        r"op=ReduceOp\.AVG needs a floating-point dtype, got int64",
    ),
    Bad(
        "AVG on bool",
        "dist.reduce(torch.ones(2, dtype=torch.bool), dst=0, op=dist.ReduceOp.AVG)",
        TypeError,
        r"op=ReduceOp\.AVG needs a floating-point dtype, got bool",
    ),
    Bad(
        "AVG on numpy uint8",
        "dist.reduce_scatter_tensor(np.zeros(1, np.uint8), np.zeros(3, np.uint8), op='avg')",
        TypeError,
        r"op=ReduceOp\.AVG needs a floating-point dtype, got uint8",
    ),
    Bad(
        "BAND on float32",
        "dist.all_reduce(t, op=dist.ReduceOp.BAND)",
        TypeError,
        r"op=ReduceOp\.BAND needs an integer or bool dtype, got float32",
    ),
    Bad(
        "BXOR on bfloat16",
        "dist.reduce(t.bfloat16(), dst=0, op=dist.ReduceOp.BXOR)",
        TypeError,
        r"op=ReduceOp\.BXOR needs an integer or bool dtype, got bfloat16",
    ),
    Bad(
        "BOR on numpy float64",
        "dist.reduce_scatter(np.zeros(1), [np.zeros(1)] * 3, op=dist.ReduceOp.BOR)",
        TypeError,
        r"op=ReduceOp\.BOR needs an integer or bool dtype, got float64",
    ),
    Bad("unknown reduce op", "dist.all_reduce(t, op='median')", ValueError, r"op='median' is not a reduction"),
    Bad(
        "SUM on uint16",
        "dist.all_reduce(torch.zeros(2, dtype=torch.uint16))",
        TypeError,
        r"op=ReduceOp\.SUM cannot reduce dtype uint16",
    ),
    Bad(
        "MAX on a numpy string",
        "dist.all_reduce(np.array(['a']), op='max')",
        TypeError,
        r"op=ReduceOp\.MAX cannot reduce numpy dtype <U1",
    ),
    # -- algorithms and options --------------------------------------------------------------------------------------
    Bad(
        "unknown all_reduce algorithm",
        "dist.all_reduce(t, algorithm='bogus')",
        ValueError,
        r"algorithm='bogus' is not an all_reduce algorithm; expected one of .*'ring'",
    ),
    Bad(
        "algorithm of another op",
        "dist.broadcast(t, src=0, algorithm='ring')",
        ValueError,
        r"algorithm='ring' is not a broadcast algorithm",
    ),
    Bad(
        "unknown all_gather_into_tensor algorithm",
        "dist.all_gather_into_tensor(torch.zeros(6), t, algorithm='pairwise')",
        ValueError,
        r"algorithm='pairwise' is not an all_gather algorithm",
    ),
    Bad(
        "unknown barrier algorithm",
        "dist.barrier(algorithm='tree')",
        ValueError,
        r"algorithm='tree' is not a barrier algorithm",
    ),
    Bad(
        "algorithm not a str",
        "dist.all_reduce(t, algorithm=3)",
        TypeError,
        r"algorithm must be a str or None, got int \(3\)",
    ),
    Bad(
        "async_op not a bool",
        "dist.all_reduce(t, async_op='yes')",
        TypeError,
        r"async_op must be a bool, got str \('yes'\)",
    ),
    Bad("negative tag", "dist.send(t, dst=(rank + 1) % 3, tag=-1)", ValueError, r"tag=-1 must be at least 0"),
    Bad(
        "tag not an int", "dist.recv(t, src=(rank + 1) % 3, tag='a')", TypeError, r"tag must be an int, got str \('a'\)"
    ),
    Bad("negative compute time", "dist.compute(seconds=-1.0)", ValueError, r"seconds=-1\.0 must be a non-negative"),
    Bad("compute time not a number", "dist.compute('1s')", TypeError, r"seconds must be a number, got str \('1s'\)"),
    # -- split sizes -----------------------------------------------------------------------------------------------------
    Bad(
        "split sizes with a wrong sum",
        "dist.all_to_all_single(torch.zeros(3), torch.zeros(3), None, [1, 1, 2])",
        ValueError,
        r"input_split_sizes=\[1, 1, 2\] sums to 4, expected dim 0 of the tensor \(3\)",
    ),
    Bad(
        "split sizes of a wrong length",
        "dist.all_to_all_single(torch.zeros(3), torch.zeros(3), [1, 2], None)",
        ValueError,
        r"output_split_sizes has 2 entries, expected 3",
    ),
    Bad(
        "negative split size",
        "dist.all_to_all_single(torch.zeros(3), torch.zeros(3), None, [-1, 2, 2])",
        ValueError,
        r"input_split_sizes\[0\]=-1 must be at least 0",
    ),
    Bad(
        "split size not an int",
        "dist.all_to_all_single(torch.zeros(3), torch.zeros(3), [1, 1.0, 1], None)",
        TypeError,
        r"output_split_sizes\[1\] must be an int, got float \(1\.0\)",
    ),
    Bad(
        "split sizes not a list",
        "dist.all_to_all_single(torch.zeros(3), torch.zeros(3), 3, None)",
        TypeError,
        r"output_split_sizes must be a list of ints or None, got int \(3\)",
    ),
    Bad(
        "no split sizes and uneven rows",
        "dist.all_to_all_single(torch.zeros(4), torch.zeros(4))",
        ValueError,
        r"input_split_sizes is None, so dim 0 \(4\) must divide evenly among 3 ranks",
    ),
    # -- point to point ---------------------------------------------------------------------------------------------------
    Bad("send to self", "dist.send(t, dst=rank)", ValueError, r"send: dst=\d is this rank itself"),
    Bad("recv from self", "dist.recv(t, src=rank)", ValueError, r"recv: src=\d is this rank itself"),
    Bad(
        "isend to self by group rank",
        G + "dist.isend(t, group=g, group_dst=rank) if rank < 2 else None",
        ValueError,
        r"isend: dst=\d is this rank itself",
    ),
    Bad(
        "recv into an expanded tensor",
        "dist.recv(torch.zeros(1).expand(2), src=(rank + 1) % 3)",
        ValueError,
        r"tensor has elements that share memory",
    ),
    Bad("P2POp with a blocking op", "dist.P2POp(dist.send, t, 1)", ValueError, r"op=<function send.*isend or.*irecv"),
    Bad("P2POp without a peer", "dist.P2POp(dist.isend, t)", ValueError, r"peer=None and group_peer=None"),
    Bad(
        "batch_isend_irecv of nothing",
        "dist.batch_isend_irecv([])",
        ValueError,
        r"p2p_op_list must be a non-empty.*\[\]",
    ),
    Bad(
        "batch_isend_irecv of a non-op",
        "dist.batch_isend_irecv([3])",
        TypeError,
        r"p2p_op_list\[0\] must be a P2POp, got int \(3\)",
    ),
    # -- init and call order ------------------------------------------------------------------------------------------------
    Bad("double init", "dist.init_process_group('gloo')", ValueError, r"initialize the default process group twice"),
    Bad(
        "world_size zero",
        "dist.init_process_group(world_size=0)",
        ValueError,
        r"world_size=0 must be positive",
        init=False,
    ),
    Bad(
        "world_size negative",
        "dist.init_process_group(world_size=-5)",
        ValueError,
        r"world_size=-5 must be positive",
        init=False,
    ),
    Bad(
        "world_size not an int",
        "dist.init_process_group(world_size='3')",
        TypeError,
        r"world_size must be an int, got str \('3'\)",
        init=False,
    ),
    Bad(
        "unknown backend name",
        "dist.init_process_group('bogus')",
        ValueError,
        r"backend='bogus' is not a known backend",
        init=False,
    ),
    Bad(
        "backend not a str",
        "dist.init_process_group(5)",
        TypeError,
        r"backend must be a str.*got int \(5\)",
        init=False,
    ),
    Bad(
        "collective before init",
        "dist.all_reduce(t)",
        dist.NotInitializedError,
        r"all_reduce\(\) needs the default process group.*init_process_group",
        init=False,
    ),
    Bad("get_rank before init", "dist.get_rank()", dist.NotInitializedError, r"get_rank\(\) needs", init=False),
    Bad("send before init", "dist.send(t, 1)", dist.NotInitializedError, r"send\(\) needs", init=False),
    Bad(
        "object collective before init",
        "dist.all_gather_object([None] * 3, 1)",
        dist.NotInitializedError,
        r"all_gather_object\(\) needs",
        init=False,
    ),
    Bad(
        "collective after destroy",
        "dist.destroy_process_group()\ndist.barrier()",
        dist.NotInitializedError,
        r"barrier\(\) needs",
    ),
    Bad(
        "get_backend outside the group",
        G + "dist.get_backend(g) if rank == 2 else None",
        ValueError,
        r"group=GroupMember\.NON_GROUP_MEMBER",
    ),
    # -- outside any simulation -----------------------------------------------------------------------------------------------
    Bad(
        "get_world_size outside a simulation",
        "dist.get_world_size()",
        dist.NotInitializedError,
        r"get_world_size\(\) needs the default process group",
        where="main",
    ),
    Bad(
        "all_reduce outside a simulation",
        "dist.all_reduce(t)",
        dist.NotInitializedError,
        r"all_reduce\(\) needs",
        where="main",
    ),
    Bad(
        "init_process_group outside a simulation",
        "dist.init_process_group('gloo', rank=0, world_size=1)",
        RuntimeError,
        r"init_process_group\(backend='gloo'\) was called outside a simulation",
        where="main",
    ),
    Bad(
        "init unknown backend outside a simulation",
        "dist.init_process_group('bogus')",
        ValueError,
        r"backend='bogus' is not a known backend",
        where="main",
    ),
    Bad(
        "simulate nprocs=0", "dist.simulate(noop, 0)", ValueError, r"nprocs=0 must be a positive integer", where="main"
    ),
    Bad(
        "simulate nprocs negative", "dist.simulate(noop, -2)", ValueError, r"nprocs=-2 must be a positive", where="main"
    ),
    Bad(
        "simulate nprocs not an int",
        "dist.simulate(noop, 2.0)",
        TypeError,
        r"nprocs=2\.0 must be an int",
        where="main",
    ),
    Bad("spawn nprocs=0", "dist.spawn(noop, nprocs=0)", ValueError, r"nprocs=0 must be a positive", where="main"),
    Bad(
        "spawn unknown backend",
        "dist.spawn(noop, nprocs=2, backend='bogus')",
        ValueError,
        r"backend='bogus' is not a known backend",
        where="main",
    ),
    Bad(
        "simulate detail",
        "dist.simulate(noop, 2, detail='x')",
        ValueError,
        r"detail='x' is not a level of detail",
        where="main",
    ),
    Bad(
        "simulate eager_limit negative",
        "dist.simulate(noop, 2, eager_limit=-1)",
        ValueError,
        r"eager_limit=-1 must be a non-negative number of bytes",
        where="main",
    ),
    Bad(
        "simulate eager_limit not an int",
        "dist.simulate(noop, 2, eager_limit='big')",
        TypeError,
        r"eager_limit='big'",
        where="main",
    ),
    Bad(
        "simulate unknown strategy",
        "dist.simulate(noop, 2, strategy='fifo')",
        ValueError,
        r"strategy='fifo' is not a strategy",
        where="main",
    ),
    Bad(
        "simulate bad schedule token",
        "dist.simulate(noop, 2, schedule='bogus:1')",
        ValueError,
        r"schedule='bogus:1' is not a valid replay token",
        where="main",
    ),
    Bad(
        "simulate bad random token",
        "dist.simulate(noop, 2, schedule='random:x')",
        ValueError,
        r"schedule='random:x' is not a valid replay token",
        where="main",
    ),
    Bad(
        "simulate corrupt choices token",
        "dist.simulate(noop, 2, schedule='choices:!!!')",
        ValueError,
        r"schedule='choices:!!!' is not a valid replay token",
        where="main",
    ),
    Bad(
        "simulate schedule not a token",
        "dist.simulate(noop, 2, schedule=5)",
        TypeError,
        r"schedule must be a replay token \(str\) or a list of ints, got int",
        where="main",
    ),
    Bad(
        "simulate unknown topology",
        "dist.simulate(noop, 2, topology='moebius')",
        ValueError,
        r"topology='moebius' is not a named topology",
        where="main",
    ),
    Bad(
        "simulate topology not a topology",
        "dist.simulate(noop, 2, topology=5)",
        TypeError,
        r"topology must be None, a name, a path, a networkx\.Graph or a Topology, got int",
        where="main",
    ),
    Bad("simulate leaks", "dist.simulate(noop, 2, leaks='sometimes')", ValueError, r"leaks='sometimes'", where="main"),
    Bad(
        "simulate timeout",
        "dist.simulate(noop, 2, timeout=0)",
        ValueError,
        r"timeout=0 must be a positive",
        where="main",
    ),
    Bad("simulate fn not callable", "dist.simulate(3, 2)", TypeError, r"fn must be callable, got int", where="main"),
    Bad(
        "simulate args not a tuple",
        "dist.simulate(noop, 2, args=[1])",
        TypeError,
        r"args must be a tuple, got list",
        where="main",
    ),
]

KNOWN_BUGS: dict[str, str] = {}
TABLE.append(
    Bad(
        "simulate negative schedule choice",
        "dist.simulate(noop, 2, schedule=[0, -1])",
        ValueError,
        r"schedule.*-1",
        where="main",
    )
)


def noop(rank):
    return None


def _namespace(rank: int | None) -> dict:
    return {
        "dist": dist,
        "torch": torch,
        "np": np,
        "rank": rank,
        "noop": noop,
        "t": torch.zeros(2),
        "i": torch.zeros(2, dtype=torch.int64),
    }


def _rank_program(rank: int, bad: Bad) -> None:
    if bad.init:
        dist.init_process_group("gloo")
    exec(bad.code, _namespace(rank))  # noqa: S102 - the table's snippets
    if dist.is_initialized():
        dist.destroy_process_group()


def _params():
    out = []
    for bad in TABLE:
        marks = ()
        if bad.desc in KNOWN_BUGS:
            marks = (pytest.mark.xfail(reason=KNOWN_BUGS[bad.desc], strict=True),)
        details = ("messages", "collectives") if bad.where == "rank" else ("-",)
        for detail in details:
            out.append(pytest.param(bad, detail, marks=marks, id=f"{bad.desc}-{detail}" if detail != "-" else bad.desc))
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("bad", "detail"), _params())
def test_bad_input(bad: Bad, detail: str) -> None:
    if bad.where == "main":
        with pytest.raises(bad.exc) as info:
            exec(bad.code, _namespace(None))  # noqa: S102
        err = info.value
    else:
        with pytest.raises(dist.RankError) as info:
            dist.simulate(_rank_program, bad.world, args=(bad,), detail=detail, leaks="ignore")
        assert 0 <= info.value.rank < bad.world
        assert info.value.schedule and info.value.schedule in str(info.value)
        err = info.value.__cause__
        assert err is not None, "RankError without __cause__"
        assert type(err).__name__ in str(info.value)
    assert isinstance(err, bad.exc), f"{type(err).__name__}: {err}"
    assert re.search(bad.match, str(err), re.DOTALL), f"message {str(err)!r} does not match {bad.match!r}"


def test_table_descriptions_are_unique() -> None:
    descs = [b.desc for b in TABLE]
    assert len(descs) == len(set(descs))


def test_rank_error_keeps_the_original_exception_and_unwinds_the_others() -> None:
    import threading

    def fn(rank):
        dist.init_process_group()
        if rank == 1:
            raise KeyError("boom")
        dist.barrier()  # the others wait here until the run is unwound

    before = threading.active_count()
    with pytest.raises(dist.RankError) as info:
        dist.simulate(fn, 4, leaks="ignore")
    assert info.value.rank == 1
    assert isinstance(info.value.__cause__, KeyError) and info.value.__cause__.args == ("boom",)
    assert isinstance(info.value, dist.DistError)
    assert threading.active_count() == before, "a rank thread was left behind"


def test_bad_input_on_one_rank_does_not_corrupt_the_others() -> None:
    """Rank 2 passes a list of the wrong length; ranks 0 and 1's tensors are never written."""
    seen = {}

    def fn(rank):
        dist.init_process_group()
        mine = torch.full((2,), float(rank))
        seen[rank] = mine
        outs = [torch.zeros(2) for _ in range(3 if rank != 2 else 2)]
        dist.all_gather(outs, mine)

    with pytest.raises(dist.RankError) as info:
        dist.simulate(fn, 3, leaks="ignore")
    assert info.value.rank == 2
    assert 2 in seen
    assert all(seen[r].tolist() == [float(r)] * 2 for r in seen)  # ranks that ran kept their input
