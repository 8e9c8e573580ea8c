"""Drives agent-proxy's Responses front door with the official `openai` Python
client, as an Agents-SDK-style app would: `client.responses.create`, streamed
and not, through an agent with a local tool, with reasoning, `instructions`,
a client function tool round trip, and a conversation chained by
`previous_response_id` through the proxy's response store (retrieve,
input_items, delete).

Run by tests/sdk_responses.rs, which starts the proxy, a scripted upstream and
a weather tool, and passes the proxy's base URL in AGENT_PROXY_BASE_URL.
"""

import json
import os

import openai
from openai import OpenAI

client = OpenAI(base_url=os.environ["AGENT_PROXY_BASE_URL"], api_key="sk-client-test", max_retries=0)

READ_FILE = {
    "type": "function",
    "name": "read_file",
    "description": "Reads a file of the user's",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def check_non_streaming_with_a_local_tool():
    response = client.responses.create(
        model="weather", input="Weather in Paris?", instructions="Answer briefly."
    )
    assert response.status == "completed", response.status
    assert response.output_text == "It is 21 °C in Paris.", response.output_text
    kinds = [item.type for item in response.output]
    assert kinds[-1] == "message", kinds
    assert "reasoning" in kinds, kinds
    assert "function_call" not in kinds, "the agent's own tool stays inside the proxy"
    assert response.usage.input_tokens == 38, response.usage
    assert response.usage.output_tokens == 4, response.usage
    assert response.id.startswith("resp_"), response.id


def check_streaming_with_a_local_tool():
    deltas, reasoning, completed, numbers = [], [], None, []
    stream = client.responses.create(model="weather", input="Weather in Paris?", stream=True)
    for event in stream:
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            reasoning.append(event.delta)
        elif event.type == "response.completed":
            completed = event.response
    assert numbers == list(range(len(numbers))), numbers
    assert "".join(deltas) == "It is 21 °C in Paris.", deltas
    assert "Warm enough." in "".join(reasoning), reasoning
    assert completed is not None and completed.output_text == "It is 21 °C in Paris."


def check_stream_helper_and_client_tool_round_trip():
    with client.responses.stream(model="weather", input="What is in notes.txt?", tools=[READ_FILE]) as stream:
        for _ in stream:
            pass
        first = stream.get_final_response()
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1, first.output
    call = calls[0]
    assert call.name == "read_file" and json.loads(call.arguments) == {"path": "notes.txt"}, call
    followup = [{"role": "user", "content": "What is in notes.txt?"}]
    followup += [item.model_dump(exclude_none=True) for item in first.output]
    followup.append({"type": "function_call_output", "call_id": call.call_id, "output": "buy milk"})
    second = client.responses.create(model="weather", input=followup, tools=[READ_FILE])
    assert second.output_text == "notes.txt says: buy milk", second.output_text


def check_a_conversation_chained_by_previous_response_id():
    first = client.responses.create(model="weather", input="Weather in Paris?")
    assert first.store is True, first.store
    second = client.responses.create(
        model="weather", input="And tomorrow?", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id, second.previous_response_id
    assert second.output_text == "It is 21 °C in Paris.", second.output_text
    again = client.responses.retrieve(second.id)
    assert again.id == second.id and again.output_text == second.output_text, again
    items = list(client.responses.input_items.list(second.id))
    assert len(items) == 1 and items[0].content[0].text == "And tomorrow?", items
    client.responses.delete(first.id)
    try:
        client.responses.retrieve(first.id)
    except openai.NotFoundError:
        pass
    else:
        raise AssertionError("a deleted response is gone")
    try:
        client.responses.create(model="weather", input="hi", previous_response_id="resp_unknown")
    except openai.BadRequestError as e:
        # As OpenAI answers it: a 400 naming the field and the code.
        assert e.body["param"] == "previous_response_id", e.body
        assert e.code == "previous_response_not_found", e.body
    else:
        raise AssertionError("an unknown previous_response_id is a 400")


def check_a_failed_stream_is_read_to_its_end():
    # The stream ends after its `response.failed`: the client reads the
    # failure, not a broken connection (APIConnectionError).
    events = list(client.responses.create(model="weather", input="Break off.", stream=True))
    assert events[-1].type == "response.failed", [e.type for e in events]
    assert events[-1].response.status == "failed", events[-1].response
    assert events[-1].response.error.message, events[-1].response.error


check_non_streaming_with_a_local_tool()
check_streaming_with_a_local_tool()
check_stream_helper_and_client_tool_round_trip()
check_a_conversation_chained_by_previous_response_id()
check_a_failed_stream_is_read_to_its_end()
print("all openai responses checks passed")
