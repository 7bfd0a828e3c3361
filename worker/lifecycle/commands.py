"""Lifecycle commands are idempotent by `command_id`: the first delivery runs, every repeat (a retry after a lost
reply, a duplicate) waits for or gets the same answer and changes nothing."""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Awaitable, Callable

from contracts import LifecycleCommand, LifecycleReply

log = logging.getLogger("janus.worker.commands")


class CommandBook:
    """command_id -> the task that answers it. Remembers the last `max_num_remembered` commands."""

    def __init__(self, max_num_remembered: int = 4096) -> None:
        self._tasks: OrderedDict[str, asyncio.Task[LifecycleReply]] = OrderedDict()
        self._commands: dict[str, LifecycleCommand] = {}
        self.max_num_remembered = max_num_remembered
        self.num_repeats = 0

    def submit(self, cmd: LifecycleCommand,
               run: Callable[[LifecycleCommand], Awaitable[LifecycleReply]]) -> asyncio.Task[LifecycleReply]:
        """The task answering `cmd`: a new one on first sight of its id, the same one for a repeat."""
        task = self._tasks.get(cmd.command_id)
        if task is not None:
            self.num_repeats += 1
            if self._commands.get(cmd.command_id) != cmd:
                log.warning("command %s repeated with different content: answering as the first one was",
                            cmd.command_id)
            self._tasks.move_to_end(cmd.command_id)
            return task
        task = asyncio.create_task(run(cmd), name=f"lifecycle {cmd.action.value} {cmd.instance_id}")
        self._tasks[cmd.command_id] = task
        self._commands[cmd.command_id] = cmd
        while len(self._tasks) > self.max_num_remembered:
            old_id, old = next(iter(self._tasks.items()))
            if not old.done():
                break  # never forget a command still running
            del self._tasks[old_id]
            self._commands.pop(old_id, None)
        return task

    def __contains__(self, command_id: str) -> bool:
        return command_id in self._tasks
