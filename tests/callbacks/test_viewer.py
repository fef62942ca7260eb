"""The trajectory viewer (`viewer.html`): self-contained, its render functions in node on a real dump, and the
whole page in a real headless browser (Debian's ``chromium``) served over HTTP as a user opens it."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.episodes import make_episodes

from roll_lightning.callbacks.trajectories import TrajectoryDump, viewer_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_viewer_is_self_contained() -> None:
    html = viewer_html()
    assert not re.search(r"https?://|//cdn|\bsrc\s*=|<link\b|@import", html, re.IGNORECASE)
    script = re.search(r"<script>(.*?)</script>", html, re.DOTALL)
    assert script is not None
    # Every untrusted field goes through esc() (the node test below checks the output where node exists).
    for field in ("t.observation", "ep.prompt", "ep.traj", "ep.env_id"):
        assert re.search(rf"esc\({re.escape(field)}\)|renderBoard\({re.escape(field)}", script.group(1)), field
    reply = re.search(r"function replyHtml\(t\) \{(.*?)\n\}", script.group(1), re.DOTALL)  # every reply goes here
    assert reply and "t.reply" not in script.group(1).replace(reply.group(0), "").replace("t.reply_prefix", "")
    assert "esc(reply)" in reply.group(1) and "esc(prefix)" in reply.group(1)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_viewer_renders_a_dump_escaped(tmp_path: Path, tokenizer: Any) -> None:
    """The viewer's own functions (run in node) on a real dump: markup in replies/prompts comes out as text,
    boards get per-env cells."""
    path = TrajectoryDump(every_n_steps=1, dirpath=str(tmp_path)).dump(make_episodes(tokenizer, 1), 1, tokenizer)
    script = re.search(r"<script>(.*?)</script>", viewer_html(), re.DOTALL).group(1)  # type: ignore[union-attr]
    harness = tmp_path / "harness.js"
    harness.write_text(
        script
        + "\nconst eps = parseJsonl(require('fs').readFileSync(process.argv[2], 'utf8'));\n"
        + "console.log(JSON.stringify({list: renderList(eps, 0), turns: eps.flatMap((ep) =>"
        + " ep.turns.map((_, k) => renderTurn(ep, k))), summary: renderSummary(eps), group: renderGroup(eps, 0, 0),"
        + " invalid: eps.filter(FILTERS.invalid).map((ep) => ep.traj)}));\n"
    )
    result = subprocess.run(["node", str(harness), str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    html = out["list"] + "".join(out["turns"])
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;|im_start|&gt;" in html  # the prompt's chat template, escaped
    # Turns in file order: g0m0 (two turns), g0m1 (one, invalid), g1m0 (frozenlake), ...
    sokoban, frozen = out["turns"][0], out["turns"][3]
    assert 'class="c sokoban-wall"' in sokoban and 'class="c sokoban-target"' in sokoban
    assert 'class="c frozenlake-hole"' in frozen and 'class="c frozenlake-goal"' in frozen
    assert '<div class="note">moved</div>' in out["turns"][1]  # text under the board stays text
    # the reply prefix (a prompt part, never sampled) is greyed, the sampled rest is not
    assert re.search(r'<span class="prefix"[^>]*>&lt;answer&gt;</span>Right&lt;/answer&gt;', out["turns"][1])
    assert 'class="prefix"' not in out["turns"][0]
    assert "return so far <b>1.5</b>" in out["turns"][1] and "badge bad" in out["turns"][2]
    # the board after each move: the next turn's, and after the last one the episode's final board
    assert out["turns"][0].count('class="board"') == 2 and "the end" in out["turns"][1]
    assert '<div class="note">solved</div>' in out["turns"][1]
    # success, return and turns come before the long episode id in every row
    header = re.search(r"<thead>(.*?)</thead>", out["list"]).group(1)  # type: ignore[union-attr]
    assert re.findall(r"<th>(\w+)</th>", header) == ["success", "return", "turns", "end", "episode"]
    # 6 episodes, half of them successes, 3 of 9 replies invalid (the one-turn members)
    assert "<b>6</b> episodes" in out["summary"] and "success <b>50%</b>" in out["summary"]
    assert "invalid replies <b>33.3%</b>" in out["summary"] and "groups <b>3</b>" in out["summary"]
    assert out["invalid"] == ["sokoban/g0/s1000/m1", "frozenlake/g1/s1001/m1", "sokoban/g2/s1002/m1"]
    # the group view: both members of group 0 side by side, each with its turn-1 reply escaped
    assert (
        out["group"].count('class="member') == 2 and "&lt;script&gt;" in out["group"] and "<script>" not in out["group"]
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A real HTTP server on 127.0.0.1 (a free port) over a dump folder, as ``python -m http.server`` serves it."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", tmp_path
    finally:
        server.shutdown()
        server.server_close()


def browse(url: str, width: int = 1024) -> tuple[str, str]:
    """The page's DOM after its scripts ran (virtual time: the fetches finish, nothing waits on the clock), and
    the browser's log with the page's console messages."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--enable-logging=stderr", "--v=0", f"--window-size={width},800", "--virtual-time-budget=5000",
         "--dump-dom", url],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": os.environ.get("HOME", "/tmp")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


@pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="needs a headless browser: apt-get install chromium (.ci/run installs it; under CI it must be there)",
)
def test_the_viewer_in_a_real_browser(served: tuple[str, Path], tokenizer: Any) -> None:
    url, folder = served
    dump = TrajectoryDump(every_n_steps=1, dirpath=str(folder))
    dump.dump(make_episodes(tokenizer, 1), 1, tokenizer)
    dump.dump(make_episodes(tokenizer, 2), 2, tokenizer)
    dom, log = browse(f"{url}/index.html")
    assert 'data-ready="1"' in dom, dom[-3000:]  # the first load finished
    status = re.search(r'<span id="status"[^>]*>(.*?)</span>', dom)
    assert status is not None and "error" not in status.group(1), status
    assert "Uncaught" not in log, log[-3000:]  # the page's console: no script error
    # it opened the newest dump by itself, and lists both
    assert re.search(r'<option value="step_000002.jsonl"[^>]*>', dom) and "step_000001.jsonl" in dom
    assert "step_000002.jsonl: 6 episodes" in dom
    assert "step 2: <b>6</b> episodes" in dom and "success <b>50%</b>" in dom
    rows = re.findall(r'<tr class="ep[^"]*" data-i="\d+">(.*?)</tr>', dom)
    assert len(rows) == 6 and all(row.startswith('<td><span class="badge') for row in rows)
    # the first episode is open: its board, the board after the move, the reply escaped as text
    replay = re.search(r'<section id="replay">(.*?)</section>', dom, re.DOTALL).group(1)  # type: ignore[union-attr]
    assert replay.count('class="board"') == 2 and "what the agent saw" in replay and "after the move" in replay
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in replay and "advantage" in replay
    assert "<script>alert(1)</script>" not in dom  # never markup: the only script is the viewer's own
