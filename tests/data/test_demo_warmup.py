"""The warmed-up demo model writes well-formed answers, is right about 40% of the time, and
the warm-up is deterministic and leaves the caller's torch state alone."""

import re

import torch

from demo_eval import greedy_accuracy, greedy_answers
from megarl.data.demo_data import PROBLEMS
from megarl.data.demo_model import build_demo_model
from megarl.data.demo_warmup import warm_up


def test_answers_are_well_formed_and_imperfect(warm_model, tokenizer):
    responses = greedy_answers(warm_model, tokenizer)
    for problem, response in zip(PROBLEMS, responses):
        assert response[-1] == tokenizer.eos_token_id and len(response) <= 3, (problem, response)
        assert re.fullmatch(r"-?\d{1,2}", tokenizer.decode(response[:-1])), (problem, response)
    accuracy = greedy_accuracy(warm_model, tokenizer)
    assert 0.25 < accuracy < 0.55  # measured 0.38: room for GRPO, far above the best constant (0.055)


def test_warm_up_is_deterministic_and_restores_torch_state(tokenizer):
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    models = [build_demo_model(tokenizer) for _ in range(2)]
    losses = [warm_up(model, tokenizer, steps=3) for model in models]
    assert torch.equal(torch.rand(3), expected_draw)  # the caller's RNG stream is untouched
    assert torch.get_num_threads() == threads
    assert losses[0] == losses[1] and losses[0][-1] < losses[0][0]
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
    assert not models[0].training
