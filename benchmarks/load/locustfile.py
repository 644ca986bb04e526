"""Locust users for benchmarks/load_test.py: each streams native /generate requests in a
loop; one user in five hangs up after the first event, mid-stream. 429 and 503 are clean
refusals (the server at its limits), counted apart; anything else is a failure."""

from __future__ import annotations

import json
import os

from locust import HttpUser, constant, task

MAX_NEW_TOKENS = int(os.environ.get("LOAD_MAX_NEW_TOKENS", "32"))
HANG_UP_EVERY = 5


class StreamingClient(HttpUser):
    wait_time = constant(0.1)
    counter = 0

    def on_start(self) -> None:
        StreamingClient.counter += 1
        self.hangs_up = StreamingClient.counter % HANG_UP_EVERY == 0

    @task
    def stream(self) -> None:
        body = {
            "text": "load test prompt",
            "stream": True,
            "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True},
        }
        name = "hang-up" if self.hangs_up else "stream"
        with self.client.post("/generate", json=body, stream=True, catch_response=True, name=name) as r:
            if r.status_code in (429, 503):
                r.success()
                self.environment.events.request.fire(
                    request_type="REFUSED", name=str(r.status_code), response_time=0, response_length=0, exception=None
                )
                return
            if r.status_code != 200:
                r.failure(f"status {r.status_code}: {r.text[:200]}")
                return
            events = 0
            for line in r.iter_lines():
                if not line:
                    continue
                if line == b"data: [DONE]":
                    break
                event = json.loads(line[len(b"data: ") :])
                if "error" in event:
                    r.failure(event["error"]["message"])
                    return
                events += 1
                if self.hangs_up:
                    r.close()  # mid-stream disconnect: the server must abort and free the request
                    return
            if events == 0:
                r.failure("a stream with no events")
