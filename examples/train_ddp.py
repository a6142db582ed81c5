"""A PyTorch DDP job under ``torchrun`` that can be stopped, saved, paused as one run.

    torchrun --nproc-per-node 2 examples/train_ddp.py

then ``jupyter-traincontrol list`` shows the job once (``running (2
processes)``); ``jupyter-traincontrol send ddp save --wait`` answers once
every rank has it (``applied at step S on 2 of 2 ranks``); ``send ddp
stop`` (or Ctrl+C on torchrun, or SIGTERM on any rank) stops every rank at
the same item, with one checkpoint. Run it again to resume from it, with
as many ranks or another number. If a rank dies or hangs, the others end
``failed`` within seconds, the record naming the lost rank.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from jupyter_traincontrol import TrainLoop

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=200)
parser.add_argument("--checkpoint-dir", default="checkpoints/ddp", help="the same folder for every rank")
args = parser.parse_args()

dist.init_process_group("gloo")  # "nccl" on GPUs; torchrun sets the rank, the world size and the store
torch.manual_seed(0)  # the same initial weights on every rank
x = torch.randn(4096, 8, generator=torch.Generator().manual_seed(0))
data = TensorDataset(x, x.sum(dim=1, keepdim=True))
sampler = DistributedSampler(data, seed=0)  # each rank its share; reshuffled each epoch by set_epoch
loader = DataLoader(data, batch_size=64, sampler=sampler)
net = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
optimizer = torch.optim.SGD(net.parameters(), lr=0.01)

with TrainLoop(name="ddp", checkpoint_dir=args.checkpoint_dir, state={"net": net, "optimizer": optimizer},
               resume=True) as loop:
    for epoch in loop.epochs(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loop.batches(loader):
            loss = torch.nn.functional.mse_loss(net(xb), yb)
            optimizer.zero_grad()
            loss.backward()  # DDP's allreduce: every rank takes part in every item
            optimizer.step()
            loop.log(loss=loss.item())
print(f"rank {dist.get_rank()}: {loop.state}")
dist.destroy_process_group()
