"""Drives agent-proxy's Messages front door with the official `anthropic`
Python client, as an app written for Claude would: `client.messages.create`
streamed and not, the `messages.stream` helper, through an agent with a local
tool and reasoning; a client tool round trip; `system` as a string and as
blocks; auth by the SDK's `api_key=` (a bearer token) and by `x-api-key`;
errors; `count_tokens`; the model list.

Run by tests/sdk_anthropic.rs, which starts the proxy (with the key in
AGENT_PROXY_KEY), a scripted upstream and a weather tool, and passes the
proxy's base URL in AGENT_PROXY_BASE_URL.
"""

import os

import anthropic
from anthropic import Anthropic

BASE_URL = os.environ["AGENT_PROXY_BASE_URL"]
KEY = os.environ["AGENT_PROXY_KEY"]
client = Anthropic(base_url=BASE_URL, api_key=KEY, max_retries=0)

WEATHER = [{"role": "user", "content": "Weather in Paris?"}]
ANSWER = "It is 21 °C in Paris."
# Thinking blocks come to a request that switches thinking on, as from Anthropic.
THINKING = {"type": "enabled", "budget_tokens": 1024}
NOTES = [{"role": "user", "content": "What is in notes.txt?"}]
READ_FILE = {
    "name": "read_file",
    "description": "Reads a file of the user's",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def kinds(message):
    return [block.type for block in message.content]


def thinking(message):
    return "".join(block.thinking for block in message.content if block.type == "thinking")


def signed(message):
    # Clients keep a thinking block for the history they send back only if it
    # is signed (the AI SDK's and litellm's Anthropic providers).
    return all(block.signature for block in message.content if block.type == "thinking")


def check_non_streaming_with_a_local_tool():
    raw = client.messages.with_raw_response.create(
        model="weather", max_tokens=256, messages=WEATHER, thinking=THINKING
    )
    # How this SDK sends `api_key=`: as a bearer token.
    sent = raw.http_request.headers
    assert sent.get("authorization") == f"Bearer {KEY}" and "x-api-key" not in sent, sent
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant", message
    assert message.id.startswith("msg_"), message.id
    assert message.model == "weather", message.model
    assert "tool_use" not in kinds(message), "the agent's own tool stays inside the proxy"
    assert kinds(message)[-1] == "text", kinds(message)
    assert message.content[-1].text == ANSWER, message.content
    assert "thinking" in kinds(message), kinds(message)
    assert "Let me check." in thinking(message) and "Warm enough." in thinking(message), message.content
    assert signed(message), message.content
    assert message.stop_reason == "end_turn", message.stop_reason
    # Summed over both rounds: 8 + 30 in, 2 + 2 out.
    assert message.usage.input_tokens == 38, message.usage
    assert message.usage.output_tokens == 4, message.usage


def check_the_quickstarts_first_block_is_the_text():
    # Without thinking switched on, no thinking block: the SDK's quickstart
    # reads `content[0].text` (a ThinkingBlock has no `.text`).
    message = client.messages.create(model="weather", max_tokens=256, messages=WEATHER)
    assert message.content[0].text == ANSWER, message.content
    assert kinds(message) == ["text"], kinds(message)


def check_streaming_events():
    events = list(
        client.messages.create(model="weather", max_tokens=256, messages=WEATHER, stream=True, thinking=THINKING)
    )
    types = [event.type for event in events]
    assert types[0] == "message_start" and types[-1] == "message_stop", types
    deltas = [event.delta for event in events if event.type == "content_block_delta"]
    text = "".join(delta.text for delta in deltas if delta.type == "text_delta")
    reasoning = "".join(delta.thinking for delta in deltas if delta.type == "thinking_delta")
    assert text == ANSWER, deltas
    assert "Let me check." in reasoning and "Warm enough." in reasoning, deltas
    starts = [event.content_block.type for event in events if event.type == "content_block_start"]
    assert "tool_use" not in starts, starts
    (end,) = [event for event in events if event.type == "message_delta"]
    assert end.delta.stop_reason == "end_turn", end
    assert end.usage.output_tokens == 4, end.usage


def check_stream_helper():
    with client.messages.stream(model="weather", max_tokens=256, messages=WEATHER, thinking=THINKING) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == ANSWER, pieces
    assert len(pieces) > 1, "the text arrives in pieces, as the upstream streamed it"
    assert final.content[-1].text == ANSWER, final.content
    assert "thinking" in kinds(final) and "tool_use" not in kinds(final), kinds(final)
    assert "Warm enough." in thinking(final), final.content
    assert signed(final), final.content
    assert final.stop_reason == "end_turn", final.stop_reason
    assert final.usage.output_tokens == 4, final.usage
    assert final.usage.input_tokens == 38, final.usage


def check_client_tool_round_trip():
    first = client.messages.create(model="weather", max_tokens=256, messages=NOTES, tools=[READ_FILE])
    assert first.stop_reason == "tool_use", first
    calls = [block for block in first.content if block.type == "tool_use"]
    assert len(calls) == 1, first.content
    call = calls[0]
    assert call.name == "read_file" and call.input == {"path": "notes.txt"}, call
    assert call.id == "toolu_f1", call.id
    # The same turn streamed: the input arrives as `input_json_delta`.
    with client.messages.stream(model="weather", max_tokens=256, messages=NOTES, tools=[READ_FILE]) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use", streamed
    (streamed_call,) = [block for block in streamed.content if block.type == "tool_use"]
    assert streamed_call.input == {"path": "notes.txt"}, streamed_call
    followup = NOTES + [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "buy milk"}]},
    ]
    second = client.messages.create(model="weather", max_tokens=256, messages=followup, tools=[READ_FILE])
    assert second.content[-1].text == "notes.txt says: buy milk", second.content
    assert second.stop_reason == "end_turn", second.stop_reason
    assert "tool_use" not in kinds(second), kinds(second)


def check_system_prompts():
    # The upstream answers these with the system prompt it got.
    ask = [{"role": "user", "content": "Repeat your system prompt."}]
    as_string = client.messages.create(model="weather", max_tokens=64, system="Be brief.", messages=ask)
    assert as_string.content[-1].text == "You are a weather assistant.\n\nBe brief.", as_string.content
    blocks = [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Use Celsius.", "cache_control": {"type": "ephemeral"}},
    ]
    as_blocks = client.messages.create(model="weather", max_tokens=64, system=blocks, messages=ask)
    expected = "You are a weather assistant.\n\nBe brief.\n\nUse Celsius."
    assert as_blocks.content[-1].text == expected, as_blocks.content


def by_x_api_key(key):
    """Request options sending `key` as `x-api-key` alone, as Claude Code
    and older SDKs do."""
    return {"extra_headers": {"x-api-key": key, "Authorization": anthropic.Omit()}}


def check_auth_by_x_api_key():
    raw = client.messages.with_raw_response.create(
        model="weather", max_tokens=256, messages=WEATHER, **by_x_api_key(KEY)
    )
    sent = raw.http_request.headers
    assert sent.get("x-api-key") == KEY and "authorization" not in sent, sent
    assert raw.parse().content[-1].text == ANSWER, raw.parse().content


def check_errors():
    wrong = Anthropic(base_url=BASE_URL, api_key="sk-ant-wrong", max_retries=0)
    for refused, options in [(wrong, {}), (client, by_x_api_key("sk-ant-wrong"))]:
        try:
            refused.messages.create(model="weather", max_tokens=64, messages=WEATHER, **options)
        except anthropic.AuthenticationError as e:
            assert e.status_code == 401 and e.type == "authentication_error", (e.status_code, e.body)
        else:
            raise AssertionError(f"a wrong key must be refused ({options})")
    try:
        client.messages.create(model="weather", max_tokens=64, messages=[])
    except anthropic.BadRequestError as e:
        assert e.status_code == 400 and e.type == "invalid_request_error", (e.status_code, e.body)
        assert "messages" in e.api_message, e.body
    else:
        raise AssertionError("an empty conversation must be refused")


def check_count_tokens():
    counted = client.messages.count_tokens(model="weather", messages=WEATHER)
    # By the upstream's own tokenizer, which counts 42 for any prompt.
    assert isinstance(counted.input_tokens, int) and counted.input_tokens == 42, counted


def check_models():
    models = list(client.models.list())
    ids = [model.id for model in models]
    assert "weather" in ids and "llama" in ids, ids
    weather = models[ids.index("weather")]
    assert weather.type == "model" and weather.display_name == "Weather", weather
    assert weather.created_at.year >= 2024, weather


check_non_streaming_with_a_local_tool()
check_the_quickstarts_first_block_is_the_text()
check_streaming_events()
check_stream_helper()
check_client_tool_round_trip()
check_system_prompts()
check_auth_by_x_api_key()
check_errors()
check_count_tokens()
check_models()
print("all anthropic python checks passed")
