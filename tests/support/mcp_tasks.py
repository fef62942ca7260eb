"""Tasks for the `mcp:` env tests, served with the MCP server of `support.mcp_servers`.

``mcp:support.mcp_tasks:CapitalTask``: "What is the capital of X?" for a country drawn from the seed. The agent
looks it up with the server's ``lookup`` tool and answers with ``answer(city)``, a tool of the task's own (the
MCP server has none): reward 1 and the end for the right city, 0 and the end for a wrong one. An
``<answer>City</answer>`` in the reply's text counts too, when no ``answer`` call was made.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from env_servers.api import Tool, ToolCall, ToolResult
from env_servers.envs.answer import extract_answer
from support.mcp_servers import CAPITALS


class CapitalTask:
    # The default server: `python -m support.mcp_servers` run from tests/ (a config's server_command overrides).
    server_command = (sys.executable, "-m", "support.mcp_servers")
    server_cwd = str(Path(__file__).parent.parent)
    tools = (
        Tool(
            "answer",
            "Give your final answer: the capital city.",
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        ),
    )
    example_action = 'lookup({"key": "France"})'

    def __init__(self, countries: list[str] | None = None) -> None:
        self.countries = sorted(countries or CAPITALS)
        self.country = ""

    def instruction(self) -> str:
        return "Find the capital city of the country you are asked about with lookup, then call answer(city)."

    def start(self, seed: int, tools: tuple[Tool, ...]) -> str:
        self.country = random.Random(seed).choice(self.countries)
        return f"What is the capital of {self.country}? Tools: {', '.join(tool.name for tool in tools)}."

    def call(self, call: ToolCall, arguments: dict) -> ToolResult:
        return ToolResult(call.id, call.name, f"answer recorded: {arguments['city']}")

    def reward(self, history: tuple[tuple[ToolCall, ToolResult], ...], reply: str) -> tuple[float, bool]:
        answers = [
            result.content.removeprefix("answer recorded: ")
            for _, result in history
            if result.name == "answer" and not result.is_error
        ]
        if not answers and extract_answer(reply) is not None:
            answers = [extract_answer(reply).strip()]
        if not answers:
            return 0.0, False
        return float(answers[-1].strip().lower() == CAPITALS[self.country].lower()), True


class ServerlessTask(CapitalTask):
    """The same task with no default server: its config must name one (server_command or url)."""

    server_command = ()
