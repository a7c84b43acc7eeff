"""Data-parallel training through Granary: PyTorch DDP on CPU (gloo), two processes on one host.

Each process is one Granary rank (``granary.torch.IterableDataset`` takes rank and world size from
``torch.distributed``) and trains a tiny click model on the generated dataset (150 dense features and
a 32-wide embedding in, the label out). Every ``--checkpoint-every`` steps rank 0 writes a checkpoint
holding the model, the optimizer and every rank's data state; ``--stop-after N`` ends the run right
after the checkpoint at step N, as a preempted job would, and ``--resume`` continues from the
checkpoint. Because the batch order is a pure function of the job, the resumed run's losses are the
uninterrupted run's, step for step (``python/tests/test_example.py`` checks it).

With ``--global-batch G`` the ranks walk Granary's global plan: each step is the same ``G`` rows on any
number of processes that divides ``G`` (each takes ``G / world_size`` of them), so a job stopped on 4
processes resumes on 2 (``--resume --world-size 2``) from any rank's saved state, and its loss curve is
the uninterrupted run's within float rounding (the mean loss over a step's rows is summed in another
order).

    granary dataset gen --out /tmp/ads --rows 100000
    granary node --config node.toml          # serving /tmp/ads as "ads"
    python examples/ddp_train.py --socket /run/granary/node.sock --losses full.txt
    python examples/ddp_train.py --socket ... --losses cut.txt --checkpoint ck.pt --stop-after 30
    python examples/ddp_train.py --socket ... --losses cut.txt --checkpoint ck.pt --resume
    diff full.txt cut.txt                    # identical
"""

import argparse
import datetime
import faulthandler
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from granary.torch import IterableDataset


def model():
    torch.manual_seed(0)  # the same initial weights in every process and every run
    return nn.Sequential(nn.Linear(150 + 32, 16), nn.ReLU(), nn.Linear(16, 1))


def train(rank, args, store):
    # A process stuck this long prints where every thread is, and exits.
    faulthandler.dump_traceback_later(args.stuck_after, exit=True)
    torch.set_num_threads(1)  # one thread: the same floating-point sums every run
    # The processes meet through a file (one host): no port to pick and lose in a race.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=args.stuck_after))
    if args.global_batch:
        ds = IterableDataset(args.socket, args.dataset, global_batch=args.global_batch, partitions=args.partitions,
                             seed=args.seed)
    else:
        ds = IterableDataset(args.socket, args.dataset, args.batch_size, seed=args.seed)
    net = DDP(model())
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    loss_fn = nn.BCEWithLogitsLoss()
    step, start_epoch, losses = 0, 0, []
    if args.resume:
        ck = torch.load(args.checkpoint)
        net.module.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        # This rank's own state (epoch and next batch); with the global plan any rank's state, whatever
        # the world size it was saved on.
        state = ck["data"][0] if args.global_batch else ck["data"][rank]
        ds.load_state_dict(state)
        step, start_epoch, losses = ck["step"], state["epoch"], ck["losses"]
    for epoch in range(start_epoch, args.epochs):
        ds.set_epoch(epoch)  # a loaded state's epoch continues at its next batch
        for batch in DataLoader(ds, batch_size=None, num_workers=0):
            x = torch.cat([batch["dense"], batch["emb"]], dim=1)
            loss = loss_fn(net(x).squeeze(1), batch["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            # The mean loss over the ranks: the job's loss curve.
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            step += 1
            losses.append(f"{epoch} {step} {mean.item() / args.world_size:.9g}")
            if args.checkpoint and step % args.checkpoint_every == 0:
                states = [None] * args.world_size
                dist.all_gather_object(states, ds.state_dict())
                if rank == 0:
                    ck = {"model": net.module.state_dict(), "optimizer": opt.state_dict(), "data": states,
                          "step": step, "losses": losses}
                    torch.save(ck, args.checkpoint + ".tmp")
                    os.replace(args.checkpoint + ".tmp", args.checkpoint)
                dist.barrier()
                if step == args.stop_after:
                    leave()
    if rank == 0 and args.losses:
        with open(args.losses, "w") as f:
            f.write("\n".join(losses) + "\n")
    leave()


def leave():
    """Ends this rank's process once its work is written.

    torch 1.13's gloo backend can deadlock while a DDP model is destroyed: the main thread joins a gloo
    thread while holding the GIL, and that thread waits for the GIL to free a tensor it still held (seen
    here about once in five runs on a loaded machine). Nothing is left to save, so the process exits
    without tearing anything down.
    """
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="the Granary node's socket")
    p.add_argument("--dataset", default="ads")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--global-batch", type=int, default=0,
                   help="walk the global plan with steps of this many rows (any world size dividing it)")
    p.add_argument("--partitions", type=int, default=4, help="the global plan's canonical partitions")
    p.add_argument("--losses", help="write the loss curve here (epoch, step, mean loss per line)")
    p.add_argument("--checkpoint", help="checkpoint file")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--stop-after", type=int, default=0, help="stop after the checkpoint at this step")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--stuck-after", type=float, default=600, help="seconds after which a process dumps its stacks and exits")
    args = p.parse_args()
    if (args.resume or args.stop_after) and not args.checkpoint:
        p.error("--resume and --stop-after need --checkpoint")
    if args.stop_after and args.stop_after % args.checkpoint_every:
        p.error("--stop-after must be a multiple of --checkpoint-every")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(train, args=(args, os.path.join(tmp, "store")), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
