#!/usr/bin/env python3
"""Records what Megatron-LM's own pipeline schedules run, rank by rank, for capscope's unit test.

Megatron's schedule functions (`forward_backward_pipelining_without_interleaving` and
`..._with_interleaving`, schedules.py) run for each rank of a grid of shapes, with no model and no
communication: a process group that only answers rank() and size(), forward_step and backward_step
replaced by recorders, and `_batched_p2p_ops` (the batched sends and receives of the path without
p2p overlap) replaced by a recorder. Everything else is Megatron's: the warmup counts, the schedule
table, which receives and sends each call asks for, and the refusals it raises before anything runs.

One JSON line per case: {"ranks", "chunks", "group" (interleaved; null: Megatron's default, the
ranks), "microbatches", and either "error" (the exception Megatron raised, rank 0) or "programs": a
list per rank of events in issue order: "F<chunk>.<microbatch>", "B<chunk>.<microbatch>", or a group
of sends and receives "G[op,op,...]" (ops sorted; "sa<stage>.<mb>": send the activation that virtual
stage <stage> receives, "sg<stage>.<mb>": send the gradient that stage <stage> receives, "ra" and
"rg": receive an activation, a gradient)}.

Needs torch and a Megatron-LM checkout on PYTHONPATH, and a CUDA device (Megatron's schedules
allocate a token counter and receive buffers there), e.g. the GPU machine with `.megatron/`:

    PYTHONPATH=.megatron python3 tools/conformance/megatron_pipeline_schedules.py > tests/unit/megatron_pipeline_schedules.jsonl
"""
import json
import os
import sys

import torch
import torch.distributed as dist

import megatron.core.pipeline_parallel.p2p_communication as p2p
import megatron.core.pipeline_parallel.schedules as schedules
from megatron.core.process_groups_config import ProcessGroupCollection


class FakeGroup:
    """A process group that only says who it is: the schedules read rank() and size()."""

    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


class Config:
    """The model config the schedules read; an attribute not set here reads as None (and is listed)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        UNSET_READ.add(name)
        return None


UNSET_READ = set()


class Chunk(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model_type = None


class Recorder:
    """Per rank: the events, and which virtual stage and microbatch each tensor carries."""

    def __init__(self, rank, ranks):
        self.rank, self.ranks = rank, ranks
        self.events = []
        self.carries = {}  # id(tensor) -> op text of its send
        self.forward_of = {}  # id(output tensor) -> (chunk, microbatch)
        self.keep = []  # tensors kept alive, so that ids stay unique

    def tensor(self):
        t = torch.zeros(1)
        self.keep.append(t)
        return t

    def forward_step(self, *args, **kwargs):
        chunk = kwargs.get("vp_stage") or 0
        microbatch = kwargs["current_microbatch"]
        self.events.append(f"F{chunk}.{microbatch}")
        out = self.tensor()
        self.forward_of[id(out)] = (chunk, microbatch)
        self.carries[id(out)] = f"sa{chunk * self.ranks + self.rank + 1}.{microbatch}"
        return out, torch.zeros([], dtype=torch.int, device="cuda")

    def backward_step(self, input_tensor, output_tensor, output_tensor_grad, config):
        unwrap = lambda x: x[0] if isinstance(x, list) else x
        chunk, microbatch = self.forward_of[id(unwrap(output_tensor))]
        self.events.append(f"B{chunk}.{microbatch}")
        if unwrap(input_tensor) is None:  # Megatron's backward_step gives no gradient for no input
            return None
        grad = self.tensor()
        self.carries[id(grad)] = f"sg{chunk * self.ranks + self.rank - 1}.{microbatch}"
        return grad

    def batched_p2p_ops(self, *, tensor_send_prev, tensor_recv_prev, tensor_send_next, tensor_recv_next, **_):
        ops = []
        if tensor_send_prev is not None:
            ops.append(self.carries[id(tensor_send_prev)])
        if tensor_recv_prev is not None:
            ops.append("ra")
        if tensor_send_next is not None:
            ops.append(self.carries[id(tensor_send_next)])
        if tensor_recv_next is not None:
            ops.append("rg")
        if ops:
            self.events.append("G[" + ",".join(sorted(ops)) + "]")
        return []


def run_rank(rank, ranks, chunks, group, microbatches):
    rec = Recorder(rank, ranks)
    schedules.forward_step = rec.forward_step
    schedules.backward_step = rec.backward_step
    p2p._batched_p2p_ops = rec.batched_p2p_ops
    config = Config(
        overlap_p2p_comm=False, batch_p2p_comm=True, batch_p2p_sync=False, use_ring_exchange_p2p=False,
        variable_seq_lengths=False, mtp_standalone=False, pipeline_dtype=torch.float32, sequence_parallel=False,
        hidden_size=4, deallocate_pipeline_outputs=False, finalize_model_grads_func=None, timers=None,
        no_sync_func=None, grad_sync_func=None, param_sync_func=None, overlap_moe_expert_parallel_comm=False,
        num_microbatches_with_partial_activation_checkpoints=None, calculate_per_token_loss=False,
        virtual_pipeline_model_parallel_size=chunks if chunks > 1 else None,
        microbatch_group_size_per_vp_stage=group if group is not None else ranks,  # ModelParallelConfig's default
        moe_paged_stash=False, cuda_graph_impl="none",
    )
    pp_group = FakeGroup(rank, ranks)
    communicator = p2p.P2PCommunicator(pp_group=pp_group, config=config)
    collection = ProcessGroupCollection(tp=FakeGroup(0, 1), cp=FakeGroup(0, 1))
    common = dict(forward_step_func=None, num_microbatches=microbatches, seq_length=8, micro_batch_size=1,
                  p2p_communicator=communicator, pg_collection=collection)
    if chunks > 1:
        models = [Chunk(config) for _ in range(chunks)]
        schedules.forward_backward_pipelining_with_interleaving(data_iterator=[None] * chunks, model=models, **common)
    else:
        schedules.forward_backward_pipelining_without_interleaving(data_iterator=None, model=Chunk(config), **common)
    return rec.events


def cases():
    for ranks in (2, 3, 4, 5):
        for microbatches in range(1, 3 * ranks + 3):
            yield ranks, 1, None, microbatches
        for chunks in (2, 3):
            for group in (None, ranks - 1, ranks + 1, ranks + 2, 2 * ranks):
                for microbatches in range(1, 3 * ranks + 3):
                    yield ranks, chunks, group, microbatches


def main():
    torch.cuda.set_device(0)
    # The schedules ask torch.distributed whether it is initialized before they read a group's
    # rank: one process, gloo, no peers.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    p2p.dist.get_global_rank = lambda group, rank: rank
    count = errors = 0
    for ranks, chunks, group, microbatches in cases():
        case = {"ranks": ranks, "chunks": chunks, "group": group if chunks > 1 else None, "microbatches": microbatches}
        try:
            case["programs"] = [run_rank(r, ranks, chunks, group, microbatches) for r in range(ranks)]
        except (ValueError, RuntimeError) as e:
            case.pop("programs", None)
            case["error"] = f"{type(e).__name__}: {e}"
            errors += 1
        print(json.dumps(case))
        count += 1
    dist.destroy_process_group()
    print(f"megatron_pipeline_schedules: {count} cases, {errors} refused; config fields read but not set: "
          f"{sorted(UNSET_READ) or 'none'}", file=sys.stderr)


if __name__ == "__main__":
    main()
