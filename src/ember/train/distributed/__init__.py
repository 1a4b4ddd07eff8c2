"""Several devices: one process per device on torch.distributed.

`devices([d0, d1, ...])` with several devices makes the process that calls `fit` rank
0; it starts one more process per extra device by running the same command again
(`sys.orig_argv`) with the usual torch.distributed variables set, so a user changes
neither the script nor the launcher. Under `torchrun` (one node or several) the
variables are already there and every process simply joins the group.

Rank 0 alone writes the artifact directory, renders and checkpoints. The other
ranks' standard error is copied into rank 0's standard error and `experiment.log`
(with a `[rank N]` prefix). How the processes share the model (DDP replicas or FSDP
shards) is `ember.train.parallel`'s business.

When something goes wrong the ranks tell each other through the group's key-value
store (the c10d TCPStore), which a watchdog thread in every process reads:

- A rank whose run raises publishes a failure record (rank, position, traceback)
  before it leaves the group, and waits a moment for the others to take note. Rank 0
  logs the record; the other ranks, whose collectives then fail with "connection
  closed", report it in one line instead of their own traceback.
- A rank that has waited in a collective for `timeout` seconds asks the others where
  they are and publishes which ranks did not arrive and where they were; those ranks
  stop at once, which ends the others' wait.
- A rank whose main thread cannot end after another rank failed (it waits in a
  collective that does not fail) is ended by its watchdog.
- The processes ember starts die with the process that started them (on Linux through
  a parent-death signal set before the command runs, elsewhere by the watchdog).

The package's modules: `joining` (joining the group, the device of each process),
`meeting` (the store the processes meet at, within the timeout, each group's keys
apart), `group` (the `Distributed` object: collectives, a failure's account, leaving
the group), `launch` (starting the ranks and copying their output), `watchdog` (the thread
that watches the board and the waits, and the `Health` it shares with the training
thread), `failures` (failure records, the board in the store, the reports and the
output of the ranks) and `where` (where a rank is: what it waits in, at which line and
which epoch).
"""

from ember.train.distributed.failures import Failure
from ember.train.distributed.group import Distributed
from ember.train.distributed.joining import process_device, setup, world_size
from ember.train.distributed.launch import Child
from ember.train.distributed.where import name_wait

__all__ = [
    "Child",
    "Distributed",
    "Failure",
    "name_wait",
    "process_device",
    "setup",
    "world_size",
]
