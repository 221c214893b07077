from spa.worldmodel.tokenize import tokenize_example

MESSAGES = [{"role": "system", "content": "Rules."}, {"role": "user", "content": "Turn 1. Current state:\nP_\n"}]
RESPONSE = ("<think><observation>P_\nPlayer at (0,0).</observation> move right "
            "<prediction>_P\nPlayer at (0,1).</prediction></think><answer>Right</answer>")


def trained_text(tokenizer, example):
    return tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m])


def test_exactly_the_think_and_answer_tokens_carry_loss(tiny):
    _, tokenizer = tiny
    example = tokenize_example(tokenizer, MESSAGES, RESPONSE)
    assert trained_text(tokenizer, example) == RESPONSE
    # Token by token: the trained tokens are one contiguous run at the end, right after
    # the prompt, and nothing of the prompt is trained.
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True,
                                           return_dict=True)["input_ids"]
    assert example.input_ids[: len(prompt)] == prompt
    assert example.loss_mask == [False] * len(prompt) + [True] * (len(example) - len(prompt))


def test_mask_states_removes_exactly_the_state_contents(tiny):
    _, tokenizer = tiny
    example = tokenize_example(tokenizer, MESSAGES, RESPONSE, mask_states=True)
    expected = ("<think><observation></observation> move right <prediction></prediction></think>"
                "<answer>Right</answer>")
    assert trained_text(tokenizer, example) == expected
    full = tokenize_example(tokenizer, MESSAGES, RESPONSE)
    assert example.input_ids == full.input_ids
    assert all(f or not m for m, f in zip(example.loss_mask, full.loss_mask))  # a subset


def test_masked_names_the_states_one_example_leaves_out_of_the_loss(tiny):
    _, tokenizer = tiny
    example = tokenize_example(tokenizer, MESSAGES, RESPONSE, masked=["prediction"])
    assert trained_text(tokenizer, example) == RESPONSE.replace(
        RESPONSE[RESPONSE.index("<prediction>") + 12: RESPONSE.index("</prediction>")], "")
    assert trained_text(tokenizer, tokenize_example(tokenizer, MESSAGES, RESPONSE, masked=[])) == RESPONSE
