"""Fencing of lifecycle commands by the reconciler leader's epoch (planner/leader.py, docs/operations.md: Leader
election). A reconciler that lost its lease, paused past it and woke up, may still send a command it decided on
while it led; a newer leader's commands have a larger epoch, so a worker that has seen one refuses the older term's
commands. Epoch 0 is an unelected sender (a test, a tool): accepted until a worker has seen an elected one."""
from __future__ import annotations

from contracts import ErrorCode, ErrorInfo


class EpochFence:
    def __init__(self) -> None:
        self.newest_epoch = 0

    def admit(self, epoch: int, issued_by: str = "") -> ErrorInfo | None:
        """None when the command may run (and its epoch is now the newest seen, if it is newer); else why not."""
        if epoch < self.newest_epoch:
            who = f" from {issued_by}" if issued_by else ""
            return ErrorInfo(code=ErrorCode.STALE_EPOCH, retryable=False,
                             message=f"command{who} of epoch {epoch} refused: a reconciler of epoch "
                                     f"{self.newest_epoch} leads now",
                             detail={"epoch": str(epoch), "newest_epoch": str(self.newest_epoch)})
        self.newest_epoch = epoch
        return None
