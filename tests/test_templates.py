from eaglechat.engine.templates import render

MESSAGES = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "How?"}]


def test_vicuna_format_matches_fastchat_v1_1():
    assert render("vicuna", MESSAGES[:1], "SYS") == "SYS USER: Hi ASSISTANT:"
    assert render("vicuna", MESSAGES, "SYS") == "SYS USER: Hi ASSISTANT: Hello!</s>USER: How? ASSISTANT:"


def test_llama2_chat_format_has_system_block_and_trailing_space():
    assert render("llama-2-chat", MESSAGES[:1], "SYS") == "[INST] <<SYS>>\nSYS\n<</SYS>>\n\nHi [/INST] "
    assert render("llama-2-chat", MESSAGES, None) == "[INST] Hi [/INST] Hello! </s><s>[INST] How? [/INST] "


def test_a_conversation_system_prompt_overrides_the_default():
    msgs = [{"role": "system", "content": "Be brief."}, *MESSAGES[:1]]
    assert render("vicuna", msgs, "SYS").startswith("Be brief. USER: Hi")
