"""An env server's limits under load (issue 50): a Stream client that stops reading its answers cannot make the
server read (and hold the answers of) its requests without bound; the load benchmark's `--quick` run holds its
sessions, refuses past the cap with RESOURCE_EXHAUSTED, reaps what was never closed and loses no step."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
from support.servers import start_server

from roll_lightning.protocol.v1 import env_pb2 as pb
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]


def test_a_stream_client_that_never_reads_stops_being_read_and_every_request_is_answered_once_it_reads():
    server = start_server(env_ids=("frozenlake",))
    service = server.server.service
    service.stream_backlog_limit = 64
    sent, total = [0], 5000
    try:
        # A small receive window (no BDP probing), so that the client's own buffer for unread answers is small too
        with grpc.insecure_channel(server.address, options=[("grpc.http2.bdp_probe", 0)]) as channel:
            stub = pb_grpc.EnvServiceStub(channel)
            sid = stub.CreateSession(
                pb.CreateSessionRequest(env_id="frozenlake", request_id="c"), timeout=10
            ).session_id
            stub.Reset(pb.ResetRequest(session_id=sid, seed=1, request_id="r"), timeout=10)

            filler = "x" * 1000  # requests larger than answers: the server's window fills with few of them

            def requests():
                for tag in range(total):  # a wrong episode: each is answered FAILED_PRECONDITION
                    sent[0] += 1
                    step = pb.StepRequest(session_id=sid, episode_id="e", request_id="x", action=pb.Action(text=filler))
                    yield pb.StreamRequest(tag=tag, step=step)

            answers = stub.Stream(requests(), timeout=600)
            peak, still, last = 0, 0, -1
            for _ in range(3000):  # until the client cannot push more (a bound on the wait, not a timing)
                peak = max(peak, service.stream_backlog)
                still = still + 1 if sent[0] == last else 0
                last = sent[0]
                if still >= 50 or sent[0] >= total:
                    break
                time.sleep(0.01)
            assert 0 < peak <= 64, "the server read ahead of the answers it sent, up to its bound"
            assert sent[0] < total, "the server stopped reading: the client could not push every request"
            tags = set()
            for answer in answers:
                assert answer.step.status.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
                tags.add(answer.tag)
                if len(tags) == total:
                    break
            assert tags == set(range(total)), "every request answered, once it read"
            answers.cancel()
        for _ in range(500):
            if service.stream_backlog == 0:
                break
            time.sleep(0.01)
        assert service.stream_backlog == 0
    finally:
        server.stop()


def test_the_load_benchmark_quick_run_holds_refuses_named_reaps_and_loses_nothing(tmp_path: Path):
    out = tmp_path / "load.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "env_load.py"), "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["ok"] and done.returncode == 0, (res["verdict"], done.stdout[-3000:])
    assert res["held_by_server"] == res["settings"]["sessions"] == 300
    assert res["lost_steps"] == 0 and res["replay"]["steps"] == res["steps_ok"] > 0
    assert "is full (300 sessions)" in res["cap_when_full"]["messages"]["RESOURCE_EXHAUSTED"]
    assert res["active_at_end"] == 0
