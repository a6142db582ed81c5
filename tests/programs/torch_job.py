"""One rank of a PyTorch DDP job under `TrainLoop`, started by ``torchrun`` (for tests/test_torch_job.py).

    torchrun --nproc-per-node 2 torch_job.py NAME CHECKPOINT_DIR [--epochs N] [--batch-sleep S] [--resume]
                                             [--die RANK:ITEM] [--lost-after S]

Rank 0 prints ``READY NAME FIFO`` once the first item has trained (before
that item's pause). Every rank prints ``RESULT {json}`` after the loop's
``with`` block (its rank, state, how it ended, the items it trained, the
optimizer's step, a digest of the weights) and, after a resume, the line
the resume printed. ``--die RANK:ITEM`` ends that rank abruptly
(``os._exit(3)``) after it trained that many items.
"""

import argparse
import faulthandler
import hashlib
import json
import os
import signal
import sys
import time

faulthandler.register(signal.SIGUSR1, all_threads=True)  # a test that times out dumps every thread's stack


def say(line: str) -> None:
    """Writes `line` to stdout in one write: the ranks share torchrun's pipe, and ``print`` writes the newline apart."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


parser = argparse.ArgumentParser()
parser.add_argument("name")
parser.add_argument("checkpoint_dir")
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--batch-sleep", type=float, default=0.02)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--die", default=None, metavar="RANK:ITEM")
parser.add_argument("--lost-after", type=float, default=3.0)
args = parser.parse_args()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from jupyter_traincontrol import TrainLoop  # noqa: E402
from jupyter_traincontrol.distributed import current_job  # noqa: E402

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # the same initial weights on every rank
net = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
data = torch.randn(64 * world, 8, generator=torch.Generator().manual_seed(0))
x, y = data[rank::world], data[rank::world].sum(dim=1, keepdim=True)  # each rank its shard
die_rank, die_item = map(int, args.die.split(":")) if args.die else (None, None)

job = current_job(lost_after=args.lost_after, heartbeat_seconds=0.5, exit_grace=5)
trained = 0
with TrainLoop(name=args.name, checkpoint_dir=args.checkpoint_dir, resume=args.resume,
               state={"net": net, "optimizer": optimizer}, job=job) as loop:
    for epoch in loop.epochs(args.epochs):
        for index in loop.batches(range(8)):
            xb, yb = x[index * 8:(index + 1) * 8], y[index * 8:(index + 1) * 8]
            loss = torch.nn.functional.mse_loss(net(xb), yb)
            optimizer.zero_grad()
            loss.backward()  # an allreduce: every rank takes part in every item
            optimizer.step()
            loop.log(loss=loss.item())
            trained += 1
            if trained == 1 and rank == 0:
                say(f"READY {loop.name} {loop.fifo}")
            if rank == die_rank and trained == die_item:
                os._exit(3)
            time.sleep(args.batch_sleep)

weights = b"".join(parameter.detach().numpy().tobytes() for parameter in net.parameters())
result = {"rank": rank, "world": world, "state": loop.state, "ended_by": str(loop.ended_by), "trained": trained,
          "epoch": loop.epoch, "step": loop.step, "weights": hashlib.sha256(weights).hexdigest()[:16],
          "checkpoints": [str(path) for path in loop.checkpoints]}
say("RESULT " + json.dumps(result))
dist.destroy_process_group()
sys.exit(0)
