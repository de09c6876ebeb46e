"""The flow the streaming benchmark's workers run (``RUNNER_FLOW_MODULES``)."""

from __future__ import annotations

import time

from runner import Flow, FlowState, start


class StreamState(FlowState):
    chunks: int = 200
    interval: float = 0.02


class StreamBench(Flow[StreamState]):
    """``talk`` streams ``chunks`` chunks ``interval`` seconds apart, each carrying the wall
    clock time it was written (the reader's latency is its arrival minus that)."""

    @start()
    def talk(self) -> int:
        for i in range(self.state.chunks):
            self.stream_chunk({"i": i, "t": time.time()})
            time.sleep(self.state.interval)
        return self.state.chunks
