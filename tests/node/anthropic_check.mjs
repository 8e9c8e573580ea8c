// Drives agent-proxy's Messages front door with the official Node client,
// `@anthropic-ai/sdk`: `messages.create` streamed and not, and the
// `messages.stream` helper, through an agent with a local tool and
// reasoning; a client tool round trip; auth by the SDK's `apiKey` (a bearer
// token) and by `x-api-key`.
//
// Run by tests/sdk_anthropic.rs (copied next to its node_modules under the
// target directory), which starts the proxy (its key in AGENT_PROXY_KEY), a
// scripted upstream and a weather tool, and passes the proxy's base URL in
// AGENT_PROXY_BASE_URL.

import assert from "node:assert/strict";

import Anthropic from "@anthropic-ai/sdk";

const baseURL = process.env.AGENT_PROXY_BASE_URL;
const apiKey = process.env.AGENT_PROXY_KEY;
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0 });

const WEATHER = [{ role: "user", content: "Weather in Paris?" }];
const ANSWER = "It is 21 °C in Paris.";
// Thinking blocks come to a request that switches thinking on, as from Anthropic.
const THINKING = { type: "enabled", budget_tokens: 1024 };
const NOTES = [{ role: "user", content: "What is in notes.txt?" }];
const READ_FILE = {
  name: "read_file",
  description: "Reads a file of the user's",
  input_schema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
};

const kinds = (message) => message.content.map((block) => block.type);
const thinking = (message) =>
  message.content
    .filter((block) => block.type === "thinking")
    .map((block) => block.thinking)
    .join("");
// Clients keep a thinking block for the history they send back only if it is
// signed (the AI SDK's and litellm's Anthropic providers).
const signed = (message) =>
  message.content.filter((block) => block.type === "thinking").every((block) => block.signature);

async function nonStreamingWithALocalTool() {
  const message = await client.messages.create({
    model: "weather",
    max_tokens: 256,
    messages: WEATHER,
    thinking: THINKING,
  });
  assert.equal(message.type, "message");
  assert.equal(message.model, "weather");
  assert.ok(!kinds(message).includes("tool_use"), "the agent's own tool stays inside the proxy");
  assert.equal(kinds(message).at(-1), "text");
  assert.equal(message.content.at(-1).text, ANSWER);
  assert.match(thinking(message), /Let me check\.[^]*Warm enough\./);
  assert.ok(signed(message), JSON.stringify(message.content));
  assert.equal(message.stop_reason, "end_turn");
  assert.equal(message.usage.input_tokens, 38);
  assert.equal(message.usage.output_tokens, 4);
}

async function theQuickstartsFirstBlockIsTheText() {
  // Without thinking switched on, no thinking block: the quickstart reads
  // `content[0].text`.
  const message = await client.messages.create({ model: "weather", max_tokens: 256, messages: WEATHER });
  assert.equal(message.content[0].text, ANSWER);
  assert.deepEqual(kinds(message), ["text"]);
}

async function streamingEvents() {
  const stream = await client.messages.create({
    model: "weather",
    max_tokens: 256,
    messages: WEATHER,
    stream: true,
    thinking: THINKING,
  });
  const types = [];
  let text = "";
  let reasoning = "";
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === "content_block_start") {
      assert.notEqual(event.content_block.type, "tool_use");
    } else if (event.type === "content_block_delta" && event.delta.type === "text_delta") {
      text += event.delta.text;
    } else if (event.type === "content_block_delta" && event.delta.type === "thinking_delta") {
      reasoning += event.delta.thinking;
    } else if (event.type === "message_delta") {
      assert.equal(event.delta.stop_reason, "end_turn");
      assert.equal(event.usage.output_tokens, 4);
    }
  }
  assert.equal(types[0], "message_start");
  assert.equal(types.at(-1), "message_stop");
  assert.equal(text, ANSWER);
  assert.match(reasoning, /Let me check\.[^]*Warm enough\./);
}

async function streamHelper() {
  const pieces = [];
  const stream = client.messages
    .stream({ model: "weather", max_tokens: 256, messages: WEATHER, thinking: THINKING })
    .on("text", (delta) => pieces.push(delta));
  const final = await stream.finalMessage();
  assert.equal(pieces.join(""), ANSWER);
  assert.ok(pieces.length > 1, "the text arrives in pieces, as the upstream streamed it");
  assert.equal(final.content.at(-1).text, ANSWER);
  assert.ok(kinds(final).includes("thinking") && !kinds(final).includes("tool_use"), kinds(final));
  assert.ok(signed(final), JSON.stringify(final.content));
  assert.equal(final.stop_reason, "end_turn");
  assert.equal(final.usage.input_tokens, 38);
  assert.equal(final.usage.output_tokens, 4);
}

async function clientToolRoundTrip() {
  // Streamed: the call's input arrives as `input_json_delta`.
  const first = await client.messages
    .stream({ model: "weather", max_tokens: 256, messages: NOTES, tools: [READ_FILE] })
    .finalMessage();
  assert.equal(first.stop_reason, "tool_use");
  const calls = first.content.filter((block) => block.type === "tool_use");
  assert.equal(calls.length, 1, JSON.stringify(first.content));
  const [call] = calls;
  assert.equal(call.name, "read_file");
  assert.deepEqual(call.input, { path: "notes.txt" });
  const followup = [
    ...NOTES,
    { role: "assistant", content: first.content },
    { role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: "buy milk" }] },
  ];
  const second = await client.messages.create({
    model: "weather",
    max_tokens: 256,
    messages: followup,
    tools: [READ_FILE],
  });
  assert.equal(second.content.at(-1).text, "notes.txt says: buy milk");
  assert.equal(second.stop_reason, "end_turn");
}

// Request options sending `key` as `x-api-key` alone (the SDK sends its
// `apiKey` as a bearer token), as Claude Code does.
const byXApiKey = (key) => ({ headers: { authorization: null, "x-api-key": key } });

async function auth() {
  const { data, response } = await client.messages
    .create({ model: "weather", max_tokens: 64, messages: WEATHER }, byXApiKey(apiKey))
    .withResponse();
  assert.equal(response.status, 200);
  assert.equal(data.content.at(-1).text, ANSWER);
  const wrong = new Anthropic({ baseURL, apiKey: "sk-ant-wrong", maxRetries: 0 });
  const refused = (error) => error instanceof Anthropic.AuthenticationError && error.status === 401;
  await assert.rejects(wrong.messages.create({ model: "weather", max_tokens: 64, messages: WEATHER }), refused);
  await assert.rejects(
    client.messages.create({ model: "weather", max_tokens: 64, messages: WEATHER }, byXApiKey("sk-ant-wrong")),
    refused,
  );
}

await nonStreamingWithALocalTool();
await theQuickstartsFirstBlockIsTheText();
await streamingEvents();
await streamHelper();
await clientToolRoundTrip();
await auth();
console.log("all anthropic node checks passed");
