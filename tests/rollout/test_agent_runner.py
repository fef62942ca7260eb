"""Episodes played by the user's own agent program (issue 33): a Python agent on the official `openai` client
becomes an episode of step rows with the exact ids, log-probs and versions the endpoint recorded, and its reward;
an agent that crashes, hangs, makes no call or reports no reward fails its episode with the reason, killed if
it still runs, and the endpoint keeps nothing of it. A command starting with `python` runs the trainer's own
interpreter (issue 47), and a crash's error ends with the last lines of the agent's stderr, on one line."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.endpoints import serving

from roll_lightning.rollout.agents.endpoint import AgentEndpoint, EndpointConfig
from roll_lightning.rollout.agents.runner import AgentCommand, AgentFailed, run_agent_episode
from roll_lightning.rollout.episodes.episode import Episode

AGENT = str(Path(__file__).resolve().parent.parent / "support" / "agents" / "openai_agent.py")


@pytest.fixture
async def endpoint(model_dir: Path, tokenizer: Any) -> AsyncIterator[AgentEndpoint]:
    async with serving(model_dir, tokenizer, EndpointConfig(max_context_tokens=1024, max_tokens=8)) as served:
        yield served


async def test_a_python_agent_on_the_openai_client_becomes_an_episode(endpoint: AgentEndpoint) -> None:
    agent = AgentCommand((sys.executable, AGENT), task={"name": "demo"})
    episode = await run_agent_episode(endpoint, agent, Episode(group_index=3, member=1, seed=7, env_id="agent"))
    one, two = episode.turns
    assert two.prompt_ids[: len(one.prompt_ids) + len(one.response_ids)] == one.prompt_ids + one.response_ids
    assert all(len(t.response_ids) == len(t.logprobs) and 1 <= len(t.response_ids) <= 6 for t in episode.turns)
    assert (one.reward, two.reward, two.metrics, episode.score) == (0.0, 1.0, {"success": 1.0}, 1.0)  # 7 % 3
    assert episode.policy_version == 0 and episode.end_reason == "terminated"
    assert endpoint.episodes == {}  # finished and forgotten
    # What the viewer shows: each call's new messages and the reply as text; no env judged the replies, so the
    # episode has no invalid-reply rate (rather than a made-up 0)
    assert (one.observation, two.observation) == ("[user] Task 7.", "[user] Go on.")
    assert one.reply and one.reply in endpoint.tokenizer.decode(one.response_ids, skip_special_tokens=True)
    assert "invalid_action_rate" not in episode.metrics() and "success" in episode.metrics()
    # GiGPO's state: the prompt. Another member on the same task saw the same first prompt, not the same second
    other = await run_agent_episode(endpoint, agent, Episode(group_index=3, member=2, seed=7, env_id="agent"))
    assert other.turns[0].state == one.state != two.state and one.state.startswith("prompt ")
    assert (other.turns[1].state == two.state) == (other.turns[1].prompt_ids == two.prompt_ids)


@pytest.mark.parametrize(
    ("command", "reason", "words"),
    [
        ((sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"), "crashed", "exit status 3"),
        ((sys.executable, "-c", "import time; time.sleep(600)"), "hung", "still running after 1.0 s"),
        ((sys.executable, "-c", "pass"), "no_calls", "without calling the model"),
        (("no-such-agent-program", "x"), "crashed", "could not start 'no-such-agent-program' in .*: No such file"),
    ],
)
async def test_an_agent_that_fails_fails_its_episode_with_the_reason(
    endpoint: AgentEndpoint, command: tuple[str, ...], reason: str, words: str
) -> None:
    with pytest.raises(AgentFailed, match=words) as failed:
        await run_agent_episode(endpoint, AgentCommand(command, deadline_s=1.0), Episode(0, 0, 1, "agent"))
    assert failed.value.reason == reason and endpoint.episodes == {}
    if words == "exit status 3":
        assert failed.value.detail.endswith("its stderr ends: boom")


async def test_an_agent_that_reports_no_reward_is_a_failure_not_a_zero(endpoint: AgentEndpoint) -> None:
    agent = AgentCommand((sys.executable, AGENT), env={"NO_REWARD": "1"})
    with pytest.raises(AgentFailed, match="without reporting a reward"):
        await run_agent_episode(endpoint, agent, Episode(0, 0, 1, "agent"))


def test_the_command_is_checked() -> None:
    with pytest.raises(ValueError, match="agent.command"):
        AgentCommand(())
    with pytest.raises(ValueError, match="agent.deadline_s"):
        AgentCommand(("x",), deadline_s=0)
    with pytest.raises(ValueError, match="agent.lifetime must be episode or run, got 'forever'"):
        AgentCommand(("x",), lifetime="forever")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="agent.listen='0.0.0.0' is not loopback: set agent.token"):
        AgentCommand(("x",), listen="0.0.0.0")
    assert AgentCommand(("x",), listen="0.0.0.0", advertise="10.0.0.5", token="t").advertise == "10.0.0.5"


async def test_python_is_the_trainers_own_interpreter_and_a_crash_shows_the_stderr_last_lines(
    endpoint: AgentEndpoint,
) -> None:
    """``python`` on PATH may be another install without the trainer's packages: the agent gets
    `sys.executable`. A failed import's traceback comes back as its last lines, on one line."""
    said = "import sys; print(sys.executable, file=sys.stderr); import no_such_agent_library"
    with pytest.raises(AgentFailed) as failed:
        await run_agent_episode(endpoint, AgentCommand(("python", "-c", said)), Episode(0, 0, 1, "agent"))
    detail = failed.value.detail
    assert "\n" not in detail and detail.startswith("exit status 1; its stderr ends: ")
    assert f"{sys.executable} | Traceback" in detail
    assert detail.endswith("ModuleNotFoundError: No module named 'no_such_agent_library'")
    assert AgentCommand(("python3", "x.py")).argv() == (sys.executable, "x.py")
    assert AgentCommand(("/usr/bin/python3", "x.py")).argv() == ("/usr/bin/python3", "x.py")  # a path is kept
