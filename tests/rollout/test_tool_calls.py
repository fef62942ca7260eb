"""Tool-call parsers: every call the model wrote comes out, in order, judged by no one but the env."""

from __future__ import annotations

import json
import pickle

import pytest

from roll_lightning.rollout.tool_calls import HermesParser, ParsedCall, tool_parser_named


def test_hermes_calls_come_out_in_order_with_their_arguments_as_json_text() -> None:
    reply = (
        "I will compute first.\n<tool_call>\n"
        '{"name": "calculate", "arguments": {"expression": "37 * 12"}}\n</tool_call>\n'
        '<tool_call>{"name": "answer", "arguments": {"value": 449}}</tool_call>'
    )
    calls = HermesParser().parse(reply)
    assert [c.name for c in calls] == ["calculate", "answer"]
    assert [json.loads(c.arguments) for c in calls] == [{"expression": "37 * 12"}, {"value": 449}]


def test_a_call_that_does_not_parse_is_still_a_call_for_the_env_to_refuse() -> None:
    calls = HermesParser().parse('<tool_call>{"name": "answer", "arguments": {"value": </tool_call>')
    assert calls == [ParsedCall("", '{"name": "answer", "arguments": {"value":')]
    assert HermesParser().parse("<tool_call>[1, 2]</tool_call>") == [ParsedCall("", "[1, 2]")]


def test_an_unclosed_call_at_the_end_of_a_cut_reply_counts_and_text_has_none() -> None:
    assert HermesParser().parse('<tool_call>{"name": "f", "arguments": {}}') == [ParsedCall("f", "{}")]
    assert HermesParser().parse("The answer is 4.") == []
    assert HermesParser().parse('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>') == [
        ParsedCall("f", '{"a": 1}')
    ]


def test_parsers_are_chosen_by_name_once_and_travel_as_themselves() -> None:
    parser = tool_parser_named("hermes")
    assert tool_parser_named(parser) is parser and pickle.loads(pickle.dumps(parser)) is parser
    assert tool_parser_named("none").parse("<tool_call>{}</tool_call>") == []
    with pytest.raises(ValueError, match="unknown tool parser 'qwen9': choose one of none, hermes"):
        tool_parser_named("qwen9")
