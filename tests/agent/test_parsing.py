from hypothesis import given, settings
from hypothesis import strategies as st

from spa.agent.parsing import parse_response

WM = (
    "<think><observation>#P#</observation> go left "
    "<prediction>P##</prediction></think><answer>Left || Up</answer>"
)


def test_world_model_response_is_split_into_fields():
    parsed = parse_response(WM, world_model=True)
    assert parsed.observation == "#P#"
    assert parsed.prediction == "P##"
    assert parsed.answer == "Left || Up"
    assert parsed.actions == ["Left", "Up"]
    assert parsed.format_ok


def test_max_actions_keeps_the_first_ones():
    assert parse_response(WM, max_actions=1).actions == ["Left"]


def test_world_model_mode_requires_both_states():
    text = "<think>no states here</think><answer>Up</answer>"
    assert parse_response(text).format_ok
    assert not parse_response(text, world_model=True).format_ok


def test_missing_or_empty_answer_is_a_format_error():
    assert not parse_response("<think>x</think>").format_ok
    assert not parse_response("<think>x</think><answer> || </answer>").format_ok
    assert not parse_response("<think>x<answer>Up</answer>").format_ok  # unclosed think


def test_repeated_tags_use_the_first():
    parsed = parse_response("<think>a</think><answer>Up</answer><answer>Down</answer>")
    assert parsed.actions == ["Up"]


_tags = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "<observation>", "</observation>",
     "<prediction>", "</prediction>", "||", "<", ">", "/", "\n", "Up", "é", "\x00", "🙂"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_tags, st.text(max_size=20)), max_size=40), st.booleans())
def test_parse_never_raises_on_adversarial_text(pieces, world_model):
    parsed = parse_response("".join(pieces), world_model=world_model, max_actions=3)
    assert len(parsed.actions) <= 3
    assert all("||" not in action and action == action.strip() for action in parsed.actions)


def test_parse_never_raises_on_huge_or_odd_input():
    assert not parse_response("<think>" * 200_000).format_ok
    assert not parse_response(None).format_ok  # type: ignore[arg-type]
