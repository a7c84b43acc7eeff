"""One rank as its own process: writes a line per row it got (user id, item id, the bits of dense[0])."""

import sys

import numpy as np

import granary

socket, rank, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
loader = granary.Loader(socket, "ads", 700, seed=11, rank=rank, world_size=world)
with open(out, "w") as f:
    for batch in loader.epoch(2):
        ids, dense = batch["ids"], batch["dense"]
        bits = dense[:, 0].view(np.uint32)
        for (u, i), b in zip(ids.tolist(), bits.tolist()):
            f.write(f"{u} {i} {b}\n")
