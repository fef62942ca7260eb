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
from support.episodes import make_episodes, make_pictured_episodes

from roll_lightning.callbacks.trajectories import TrajectoryDump, viewer_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def in_node(tmp_path: Path, dump: Path, expression: str, prelude: str = "") -> Any:
    """The viewer's own script run in node with ``dump``'s episodes as ``eps``: ``expression``'s value, as JSON."""
    script = re.search(r"<script>(.*?)</script>", viewer_html(), re.DOTALL).group(1)  # type: ignore[union-attr]
    harness = tmp_path / "harness.js"
    harness.write_text(
        f"{script}\nconst eps = parseJsonl(require('fs').readFileSync(process.argv[2], 'utf8'));\n{prelude}\n"
        f"console.log(JSON.stringify({expression}));\n"
    )
    result = subprocess.run(["node", str(harness), str(dump)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_viewer_is_self_contained() -> None:
    html = viewer_html()
    script = re.search(r"<script>(.*?)</script>", html, re.DOTALL)
    assert script is not None
    # The page's one src: renderPictures' <img>, whose url is pictureUrl's checked data: URL (the node test
    # below checks what it refuses); nothing else may load anything.
    pictures = re.search(r"function renderPictures\(images\) \{(.*?)\n\}", script.group(1), re.DOTALL)
    picture_url = re.search(r"function pictureUrl\(image\) \{(.*?)\n\}", script.group(1), re.DOTALL)
    assert pictures and "const url = pictureUrl(image);" in pictures.group(1) and 'src="${url}"' in pictures.group(1)
    assert picture_url and "return `data:${type};base64,${data}`;" in picture_url.group(1)
    assert len(re.findall(r"\bsrc\s*=", html, re.IGNORECASE)) == 1
    rest = html.replace('src="${url}"', "")
    assert not re.search(r"https?://|//cdn|\bsrc\s*=|<link\b|@import", rest, re.IGNORECASE)
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
    out = in_node(
        tmp_path,
        path,
        "{list: renderList(eps, 0), turns: eps.flatMap((ep) => ep.turns.map((_, k) => renderTurn(ep, k))),"
        " summary: renderSummary(eps), group: renderGroup(eps, 0, 0),"
        " invalid: eps.filter(FILTERS.invalid).map((ep) => ep.traj)}",
    )
    html = out["list"] + "".join(out["turns"])
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;|im_start|&gt;" in html  # the prompt's chat template, escaped
    # Turns in file order: g0m0 (two turns), g0m1 (one, invalid), g1m0 (frozenlake), ...
    sokoban, frozen = out["turns"][0], out["turns"][3]
    assert 'class="c sokoban-wall"' in sokoban and 'class="c sokoban-target"' in sokoban
    assert 'class="c frozenlake-hole"' in frozen and 'class="c frozenlake-goal"' in frozen
    assert '<div class="note">moved</div>' in out["turns"][1]  # text under the board stays text
    # a reply continued across a weight sync (on_suspend: keep) says where its weights changed
    assert "weights v1 (tokens 0-0), v2 (from token 1)" in out["turns"][1] and "weights v1)" in out["turns"][0]
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


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_viewer_renders_pictures(tmp_path: Path, tokenizer: Any) -> None:
    """A pictured dump in node: each turn shows its own picture beside its text (markers become labels), the
    board after the move shows the next turn's or the final picture, and pictures that are not plain PNG/JPEG
    base64 never become a URL."""
    path = TrajectoryDump(every_n_steps=1, dirpath=str(tmp_path)).dump(make_pictured_episodes(tokenizer, 1), 1)
    bad = [
        {"media_type": "image/svg+xml", "data": "PHN2Zz4="},
        {"media_type": "text/html", "data": "PHNjcmlwdD4="},
        {"media_type": "image/png;charset=x", "data": "AAAA"},
        {"media_type": "image/png", "data": 'AAAA" onerror="alert(1)'},
        {"media_type": "image/png", "data": ""},
        {"media_type": "image/png", "data": ["AAAA"]},
        {"data": "AAAA"},
        None,
    ]
    out = in_node(
        tmp_path,
        path,
        "{turns: eps[0].turns.map((_, k) => renderTurn(eps[0], k)), group: renderGroup(eps, 0, 0),"
        " urls: bad.map(pictureUrl), bad: renderPictures(bad),"
        " jpeg: pictureUrl({media_type: 'image/jpeg', data: 'AAAA'})}",
        prelude=f"const bad = {json.dumps(bad)};",
    )
    ep = json.loads(path.read_text().splitlines()[0])
    url = [f"data:image/png;base64,{t['images'][0]['data']}" for t in ep["turns"]]
    final = f"data:image/png;base64,{ep['final_images'][0]['data']}"
    first, second = out["turns"]
    saw, after = first.split("after the move")
    # what the agent saw at turn 1: its own picture, beside the board; after the move: turn 2's
    assert f'src="{url[0]}"' in saw and url[1] not in saw and f'src="{url[1]}"' in after
    assert re.search(r'<div class="seen"><div class="board">.*?</div><div class="pics"><img [^>]*>', saw)
    # the marker is a label, not text (and never markup)
    assert '<span class="picmark">picture 1</span>' in saw and "&lt;image&gt;" not in first + second
    saw, end = second.split("the end")
    assert f'src="{url[1]}"' in saw and f'src="{final}"' in end and '<div class="note">moved</div>' in saw
    assert out["group"].count("<img ") == 2  # both members' turn-1 pictures
    # bad pictures: no URL, a note instead (the media type escaped)
    assert out["urls"] == [None] * len(bad) and "<img" not in out["bad"]
    assert out["bad"].count("not shown") == len(bad) and "image/svg+xml" in out["bad"]
    assert out["jpeg"] == "data:image/jpeg;base64,AAAA"


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


# A page beside the viewer that opens it in a frame (same origin) and reports what its pictures decoded to:
# --dump-dom shows attributes, not whether an image loaded.
PICTURE_PROBE = """<!doctype html><html><body><iframe id="f" src="index.html" width="1024" height="800"></iframe>
<pre id="out">waiting</pre><script>
function check() {
  const doc = document.getElementById("f").contentDocument;
  if (!doc || !doc.body || doc.body.dataset.ready !== "1") return setTimeout(check, 50);
  const imgs = Array.from(doc.querySelectorAll("#replay img"));
  if (imgs.some((i) => !i.complete)) return setTimeout(check, 50);
  document.getElementById("out").textContent = JSON.stringify({
    imgs: imgs.map((i) => ({ alt: i.alt, width: i.naturalWidth, src: i.getAttribute("src").slice(0, 22) })),
    labels: Array.from(doc.querySelectorAll("#replay .picmark")).map((m) => m.textContent),
    titles: Array.from(doc.querySelectorAll("#replay .boards > div > .muted")).map((m) => m.textContent),
  });
}
check();
</script></body></html>
"""


@pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="needs a headless browser: apt-get install chromium (.ci/run installs it; under CI it must be there)",
)
def test_pictures_in_a_real_browser(served: tuple[str, Path], tokenizer: Any) -> None:
    """A pictured dump in a real browser: the open turn's picture and the one after the move load (decoded
    PNGs have a width), each beside its board, and the markers show as labels."""
    url, folder = served
    TrajectoryDump(every_n_steps=1, dirpath=str(folder)).dump(make_pictured_episodes(tokenizer, 1), 1)
    (folder / "probe.html").write_text(PICTURE_PROBE)
    dom, log = browse(f"{url}/probe.html")
    assert "Uncaught" not in log, log[-3000:]
    probe = re.search(r'<pre id="out">(.*?)</pre>', dom, re.DOTALL)
    assert probe is not None and probe.group(1) != "waiting", dom[-3000:]
    report = json.loads(probe.group(1).replace("&quot;", '"'))
    assert report["imgs"] == [
        {"alt": "picture 1", "width": 2, "src": "data:image/png;base64,"},  # what the agent saw
        {"alt": "picture 1", "width": 2, "src": "data:image/png;base64,"},  # after the move
    ]
    assert report["labels"] == ["picture 1", "picture 1"]
    assert report["titles"] == ["what the agent saw", "after the move"]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_tool_results_show_under_the_reply_escaped(tmp_path: Path) -> None:
    """A tool env's turn in node: each call's result under the reply, its content escaped, a refused call marked."""
    turn = {
        "turn": 0, "observation": "What is 2 + 3?", "images": [],
        "reply": '<tool_call>{"name": "calculate"}</tool_call>', "reply_prefix": "", "reward": -0.1,
        "action_valid": False, "metrics": {}, "response_tokens": 9, "finish_reason": "stop", "policy_version": 0,
        "advantage": None,
        "tool_results": [
            {"call_id": "call_0_0", "name": "calculate", "content": "<b>5</b>", "is_error": False},
            {"call_id": "call_0_1", "name": "sqrt", "content": "unknown tool 'sqrt'", "is_error": True},
        ],
    }  # fmt: skip
    episode = {"traj": "calculator/g0/s1/m0", "env_id": "calculator", "seed": 1, "step": 1, "end_reason": "truncated",
               "score": -0.1, "final_observation": "", "final_images": [], "turns": [turn]}  # fmt: skip
    (tmp_path / "step_000001.jsonl").write_text(json.dumps(episode) + "\n")
    html = in_node(tmp_path, tmp_path / "step_000001.jsonl", "renderTurn(eps[0], 0)")
    assert "tool results" in html and "&lt;b&gt;5&lt;/b&gt;" in html and "<b>5</b>" not in html
    assert html.count('badge bad">error') == 1 and "call_0_1" in html


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_viewer_shows_a_branching_group_as_a_tree(tmp_path: Path, tokenizer: Any) -> None:
    """A fork (``data.rollout.branch``) is drawn under the member it was copied from; side by side at a turn
    before its fork, it says so, and its turns are numbered as the whole episode's."""
    from roll_lightning.rollout.episodes.episode import BranchPoint

    spine, fork = make_episodes(tokenizer, 1)[:2]
    fork.branch = BranchPoint(f"{spine.traj_key}#1", turn=1, prefix_return=0.5)
    path = TrajectoryDump(every_n_steps=1, dirpath=str(tmp_path)).dump([spine, fork], 1, tokenizer)
    assert [t["turn"] for t in json.loads(path.read_text().splitlines()[1])["turns"]] == [1]
    out = in_node(
        tmp_path, path, "{at0: renderGroup(eps, 1, 0), at1: renderGroup(eps, 1, 1), fork: renderTurn(eps[1], 0)}"
    )
    tree = re.search(r'<div class="tree">(.*?)</div><div class="group">', out["at0"])
    assert tree and re.search(r"member 0.*&#x2514; member 1 <span class=\"muted\">forked before turn 2", tree.group(1))
    assert "before its fork: its parent's turns" in out["at0"]
    assert "forked at turn 2" in out["at1"] and "turn 2: " in out["at1"]
    assert f"forked from {spine.traj_key}#1 before turn 2" in out["fork"]
