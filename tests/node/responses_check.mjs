// Drives agent-proxy's Responses front door with the official `openai` Node
// client: `responses.create` streamed and not through an agent with a local
// tool and reasoning, and a client function tool round trip with the
// `responses.stream` helper.
//
// Run by tests/sdk_responses.rs (copied next to its node_modules under the
// target directory), which starts the proxy, a scripted upstream and a
// weather tool, and passes the proxy's base URL in AGENT_PROXY_BASE_URL.

import assert from "node:assert/strict";

import OpenAI from "openai";

const client = new OpenAI({
  baseURL: `${process.env.AGENT_PROXY_BASE_URL}`,
  apiKey: "sk-client-test",
  maxRetries: 0,
});

const ANSWER = "It is 21 °C in Paris.";
const READ_FILE = {
  type: "function",
  name: "read_file",
  description: "Reads a file of the user's",
  parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
  strict: false,
};

async function nonStreamingWithALocalTool() {
  const response = await client.responses.create({
    model: "weather",
    input: "Weather in Paris?",
    instructions: "Answer briefly.",
  });
  assert.equal(response.status, "completed");
  assert.ok(response.id.startsWith("resp_"), response.id);
  assert.equal(response.output_text, ANSWER);
  const kinds = response.output.map((item) => item.type);
  assert.equal(kinds.at(-1), "message");
  assert.ok(kinds.includes("reasoning"), kinds);
  assert.ok(!kinds.includes("function_call"), "the agent's own tool stays inside the proxy");
  assert.equal(response.usage.input_tokens, 38);
  assert.equal(response.usage.output_tokens, 4);
}

async function streamingWithALocalTool() {
  const stream = await client.responses.create({ model: "weather", input: "Weather in Paris?", stream: true });
  const numbers = [];
  let text = "";
  let reasoning = "";
  let completed = null;
  for await (const event of stream) {
    numbers.push(event.sequence_number);
    if (event.type === "response.output_text.delta") {
      text += event.delta;
    } else if (
      event.type === "response.reasoning_text.delta" ||
      event.type === "response.reasoning_summary_text.delta"
    ) {
      reasoning += event.delta;
    } else if (event.type === "response.completed") {
      completed = event.response;
    }
  }
  assert.deepEqual(
    numbers,
    numbers.map((_, i) => i),
  );
  assert.equal(text, ANSWER);
  assert.match(reasoning, /Warm enough\./);
  assert.ok(completed, "a response.completed event");
  assert.equal(completed.status, "completed");
  assert.equal(completed.output.at(-1).content[0].text, ANSWER);
}

async function streamHelperAndClientToolRoundTrip() {
  const first = await client.responses
    .stream({ model: "weather", input: "What is in notes.txt?", tools: [READ_FILE] })
    .finalResponse();
  const calls = first.output.filter((item) => item.type === "function_call");
  assert.equal(calls.length, 1, JSON.stringify(first.output));
  const [call] = calls;
  assert.equal(call.name, "read_file");
  assert.deepEqual(JSON.parse(call.arguments), { path: "notes.txt" });
  const input = [
    { role: "user", content: "What is in notes.txt?" },
    ...first.output,
    { type: "function_call_output", call_id: call.call_id, output: "buy milk" },
  ];
  const second = await client.responses.create({ model: "weather", input, tools: [READ_FILE] });
  assert.equal(second.output_text, "notes.txt says: buy milk");
}

await nonStreamingWithALocalTool();
await streamingWithALocalTool();
await streamHelperAndClientToolRoundTrip();
console.log("all openai node responses checks passed");
