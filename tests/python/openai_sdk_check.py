"""Drives agent-proxy with the official `openai` Python client, as an app would.

Run by tests/openai_sdk.rs, which starts the proxy, a scripted upstream and a
weather tool, and passes the proxy's base URL in AGENT_PROXY_BASE_URL.
"""

import os
import sys

import openai
from openai import OpenAI

client = OpenAI(base_url=os.environ["AGENT_PROXY_BASE_URL"], api_key="sk-client-test", max_retries=0)


def check_stream_through_agent():
    content, reasoning, models, finish = [], [], set(), []
    ids = set()
    stream = client.chat.completions.create(
        model="weather",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        models.add(chunk.model)
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            extra = getattr(choice.delta, "reasoning_content", None)
            if extra:
                reasoning.append(extra)
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    text, thought = "".join(content), "".join(reasoning)
    assert text == "It is 21 °C in Paris.", text
    assert thought == 'Let me check.\nCalling get_weather {"city":"Paris"}…\nWarm enough.', thought
    assert models == {"weather"}, models
    assert len(ids) == 1, ids
    assert finish == ["stop"], finish
    assert usage is not None and usage.total_tokens == 42, usage
    print("stream ok:", text)


def check_non_stream_through_agent():
    completion = client.chat.completions.create(
        model="weather", messages=[{"role": "user", "content": "Weather in Paris?"}]
    )
    message = completion.choices[0].message
    assert completion.model == "weather", completion.model
    assert message.content == "It is 21 °C in Paris.", message.content
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.total_tokens == 42, completion.usage
    print("non-stream ok")


def check_models_list():
    ids = [m.id for m in client.models.list()]
    assert ids == ["broken", "weather", "tiny"], ids
    print("models ok:", ids)


def check_broken_stream_raises():
    try:
        for _ in client.chat.completions.create(
            model="broken", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            pass
    except openai.APIError as e:
        print("broken stream raised:", type(e).__name__)
        return
    raise AssertionError("a stream cut by the upstream must raise, not end quietly")


def check_error_status():
    try:
        client.chat.completions.create(model="weather", messages=[])
    except openai.BadRequestError as e:
        assert e.status_code == 400
        assert e.body["param"] == "messages", e.body
        print("400 ok")
        return
    raise AssertionError("empty messages must be rejected")


if __name__ == "__main__":
    check_stream_through_agent()
    check_non_stream_through_agent()
    check_models_list()
    check_broken_stream_raises()
    check_error_status()
    print("all openai SDK checks passed")
    sys.exit(0)
