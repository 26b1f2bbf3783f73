import json

import pytest

from cosmos_rl.data.prompts import BUILTIN_PROMPTS, PromptCursor, load_prompts
from cosmos_rl.data.vocab import COLOUR_RGB
from cosmos_rl.core.errors import UserError


def test_text_file_one_prompt_per_non_empty_line(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("a red square\n\n  a blue circle  \n\t\nlast\n")
    assert load_prompts(path) == ["a red square", "a blue circle", "last"]


def test_jsonl_rows(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "one", "extra": 1}) + "\n\n" + json.dumps({"prompt": "two"}) + "\n")
    assert load_prompts(path) == ["one", "two"]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": ', "malformed JSON"),
        ('{"text": "x"}', 'expected an object with a "prompt" field'),
        ('["x"]', 'expected an object with a "prompt" field'),
        ('{"prompt": ""}', '"prompt" must be a non-empty string'),
        ('{"prompt": 3}', '"prompt" must be a non-empty string'),
    ],
)
def test_bad_jsonl_rows_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n\n' + line + "\n")
    with pytest.raises(UserError, match=r"p\.jsonl:3: ") as raised:
        load_prompts(path)
    assert message in str(raised.value)


def test_missing_empty_and_unknown_files(tmp_path):
    with pytest.raises(UserError, match="prompt file not found"):
        load_prompts(tmp_path / "none.txt")
    (tmp_path / "e.txt").write_text("\n \n")
    with pytest.raises(UserError, match=r"e\.txt: no prompts found"):
        load_prompts(tmp_path / "e.txt")
    (tmp_path / "p.csv").write_text("a\n")
    with pytest.raises(UserError, match=r"must end in \.txt .* or \.jsonl, got '\.csv'"):
        load_prompts(tmp_path / "p.csv")


def test_prompt_cursor_yields_rows_with_their_prompts_each_epoch():
    prompts = [f"p{i}" for i in range(6)]
    cursor = PromptCursor(6, 3, seed=4)
    epoch = cursor.next_batch(prompts) + cursor.next_batch(prompts)
    assert sorted(row for row, _ in epoch) == list(range(6))
    assert all(prompt == prompts[row] for row, prompt in epoch)


def test_prompt_cursor_resume_matches_uninterrupted_run():
    prompts = [f"p{i}" for i in range(7)]
    straight_cursor = PromptCursor(7, 4, seed=11)
    straight = [straight_cursor.next_batch(prompts) for _ in range(8)]
    first = PromptCursor(7, 4, seed=11)
    before = [first.next_batch(prompts) for _ in range(4)]
    resumed = PromptCursor(7, 4, seed=11)
    resumed.load_state_dict(first.state_dict())
    assert before + [resumed.next_batch(prompts) for _ in range(4)] == straight


def test_prompt_cursor_refuses_other_prompt_count_on_resume_and_in_use():
    saved = PromptCursor(7, 4, seed=0).state_dict()
    with pytest.raises(UserError, match=r"prompt cursor: .*size=7 .* size=8"):
        PromptCursor(8, 4, seed=0).load_state_dict(saved)
    with pytest.raises(ValueError, match="walks 7 prompts"):
        PromptCursor(7, 4, seed=0).next_batch(["only one"])


def test_builtin_prompts_name_a_known_colour():
    assert len(BUILTIN_PROMPTS) >= 4 and len(set(BUILTIN_PROMPTS)) == len(BUILTIN_PROMPTS)
    for prompt in BUILTIN_PROMPTS:
        assert sum(word in COLOUR_RGB for word in prompt.split()) == 1


def test_builtin_prompts_are_understood_by_the_colour_reward():
    from cosmos_rl.rewards.functions import colour_named_in

    for prompt in BUILTIN_PROMPTS:
        word = next(word for word in prompt.split() if word in COLOUR_RGB)
        assert colour_named_in(prompt) == colour_named_in(word)
