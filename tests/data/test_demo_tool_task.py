"""The demo's tool task: the tool tokenizer keeps the demo's ids and writes a hermes call in single
tokens, the warm-up's tool trajectories train exactly the model's turns, and the scorer reads the
answer after the tool response."""

import pytest

from megarl.agent.tool_parser import HermesToolParser
from megarl.data.demo_tokenizer import TOOL_TOKENS, build_demo_tokenizer
from megarl.data.demo_tool_data import OPERANDS, PROBLEMS, generate_tool_rows, tool_call_text
from megarl.data.demo_warmup import IGNORE_INDEX, tool_warmup_batch
from megarl.reward import default_compute_score
from megarl.reward.demo_tool_task import DATA_SOURCE


@pytest.fixture(scope="module")
def tool_tokenizer():
    return build_demo_tokenizer(with_tools=True)


def test_tool_tokenizer_keeps_the_demo_ids_and_adds_single_token_markup(tokenizer, tool_tokenizer):
    base, tools = tokenizer.get_vocab(), tool_tokenizer.get_vocab()
    assert len(tool_tokenizer) == len(tokenizer) == 64
    assert {t: i for t, i in tools.items() if base.get(t) != i} == {t: 58 + k for k, t in enumerate(TOOL_TOKENS)}
    call = tool_call_text("47 + 58")
    ids = tool_tokenizer(call, add_special_tokens=False)["input_ids"]
    assert len(ids) == 4 + 6 and tool_tokenizer.decode(ids) == call  # markup 4 tokens, "47 + 58" 6
    parsed = HermesToolParser(tool_tokenizer).parse(ids + [tool_tokenizer.eos_token_id])
    assert parsed.malformed == 0 and [(c.name, c.arguments) for c in parsed.calls] == [("calculator", {"expression": "47 + 58"})]


def test_rows_are_two_digit_problems_with_their_expression():
    assert len(PROBLEMS) == 2 * len(OPERANDS) ** 2 == 16200
    rows = generate_tool_rows("val", 64, seed=0)
    assert len({r["extra_info"]["expression"] for r in rows}) == 64
    for r in rows:
        a, op, b = r["extra_info"]["expression"].split()
        assert r["prompt"] == [{"role": "user", "content": f"{a} {op} {b} ="}] and r["data_source"] == DATA_SOURCE
        assert r["reward_model"]["ground_truth"] == str(int(a) + int(b) if op == "+" else int(a) - int(b))


def test_warmup_trains_the_call_and_the_answer_not_the_observation(tool_tokenizer):
    row = {"prompt": [{"role": "user", "content": "47 - 58 ="}], "reward_model": {"ground_truth": "-11"},
           "extra_info": {"expression": "47 - 58"}}
    ids, labels = tool_warmup_batch(tool_tokenizer, [row, row], [True, False])
    tok = tool_tokenizer.convert_ids_to_tokens
    expected = ("<|user|> 4 7 Ġ- Ġ 5 8 Ġ= <|assistant|> <tool_call>".split() + [TOOL_TOKENS[4]] + "4 7 Ġ- Ġ 5 8".split()
                + [TOOL_TOKENS[5]] + "</tool_call> <eos> <tool_response> - 1 1 </tool_response> <|assistant|> - 1 1 <eos>".split())
    assert tok(ids[0].tolist()) == expected
    trained = [t for t, label in zip(expected, labels[0].tolist()) if label != IGNORE_INDEX]
    assert trained == expected[9:20] + ["-", "1", "1", "<eos>"]  # the call turn + EOS, then the answer + EOS
    direct = [t for t, label in zip(tok(ids[1].tolist()), labels[1].tolist()) if label != IGNORE_INDEX]
    assert direct == ["-", "1", "1", "<eos>"]


@pytest.mark.parametrize("text, expected", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "47 + 58"}}</tool_call>'
     "<tool_response>105</tool_response>105", 1.0),
    ("105", 1.0),  # answered directly
    ("<tool_response>105</tool_response>104", 0.0),
    ("<tool_response>104</tool_response>105", 1.0),  # the answer counts, not what the tool said
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "47 + 58"}}</tool_call>', 0.0),  # a call alone
])
def test_scorer_reads_the_answer_after_the_last_tool_response(text, expected):
    assert default_compute_score(DATA_SOURCE, text, "105") == expected
