"""Tool-call parsers: every call the model wrote comes out, in order, judged by no one but the env."""

from __future__ import annotations

import json
import pickle

import pytest

from roll_lightning.rollout.prompts.tool_calls import (
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    ParsedCall,
    PythonicParser,
    tool_parser_named,
)


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
    with pytest.raises(
        ValueError, match="unknown tool parser 'qwen9': choose one of none, hermes, llama3_json, mistral, pythonic"
    ):
        tool_parser_named("qwen9")


def test_llama3_json_reads_one_object_or_several_joined_by_semicolons() -> None:
    parser = Llama3JsonParser()
    one = '<|python_tag|>{"name": "calculate", "parameters": {"expression": "2 * 3"}}'
    assert parser.parse(one) == [ParsedCall("calculate", '{"expression": "2 * 3"}')]
    two = '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}'
    assert parser.parse(two) == [ParsedCall("a", '{"x": 1}'), ParsedCall("b", "{}")]
    assert parser.parse("The answer is {4}.") == []  # text that does not start with an object
    assert parser.parse('{"name": "a", "parameters": {"x": ') == [ParsedCall("", '{"name": "a", "parameters": {"x":')]
    assert parser.parse('{"name": "a"}; [1]') == [ParsedCall("a", "{}"), ParsedCall("", "[1]")]


def test_mistral_reads_the_json_list_and_the_newer_name_args_form() -> None:
    parser = MistralParser()
    listed = '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
    assert parser.parse(listed) == [ParsedCall("a", '{"x": 1}'), ParsedCall("b", "{}")]
    newer = '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}'
    assert parser.parse(newer) == [ParsedCall("a", '{"x": 1}'), ParsedCall("b", "{}")]
    assert parser.parse("no calls here") == []
    assert parser.parse("[TOOL_CALLS][{oops") == [ParsedCall("", "[{oops")]
    assert parser.parse("[TOOL_CALLS]a{}") == [ParsedCall("", "a{}")]  # no [ARGS]: refused by the env


def test_pythonic_reads_a_list_of_calls_with_literal_keyword_arguments() -> None:
    parser = PythonicParser()
    reply = '[calculate(expression="37 * 12"), answer(value=449)]'
    calls = parser.parse(reply)
    assert calls == [ParsedCall("calculate", '{"expression": "37 * 12"}'), ParsedCall("answer", '{"value": 449}')]
    assert parser.parse("<|python_start|>[f(a=[1, 2])]<|python_end|>") == [ParsedCall("f", '{"a": [1, 2]}')]
    assert parser.parse("Four.") == []
    assert parser.parse("[f(x=y)]") == [ParsedCall("", "f(x=y)")]  # a name, not a literal
    assert parser.parse("[f(1)]") == [ParsedCall("", "f(1)")]  # positional arguments have no names
    assert parser.parse("[f(a=1]") == [ParsedCall("", "[f(a=1]")]
