"""The dashboard's frames as rich draws them: a frame laid out once (`Frame`) and
re-emitted as it is when output is printed above the live display (`FrameRender`)."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live_render import LiveRender
from rich.segment import Segment


class Frame:
    """The last drawn frame as segments: cheap to re-emit when output is printed above it."""

    def __init__(self) -> None:
        self.lines: list[list[Segment]] = []
        self.width = 0

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        new_line = Segment.line()
        for line in self.lines:
            yield from line
            yield new_line


class FrameRender(LiveRender):
    """Live's renderer, emitting a ready `Frame` without laying it out again."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        frame = self.renderable
        if isinstance(frame, Group) and len(frame.renderables) == 1:
            frame = frame.renderables[0]
        if not isinstance(frame, Frame) or not frame.lines:
            yield from super().__rich_console__(console, options)
            return
        lines = frame.lines
        if len(lines) > options.size.height or frame.width > options.max_width:
            yield from super().__rich_console__(console, options)
            return
        self._shape = (frame.width, len(lines))
        new_line = Segment.line()
        yield from lines[0]
        for line in lines[1:]:
            yield new_line
            yield from line
