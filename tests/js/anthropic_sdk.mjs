// Drives the gateway's Messages API with Anthropic's TypeScript SDK: a message, a stream with the
// SDK's helper and its final message, a tool-use turn, count_tokens, and an error class. Prints
// what it saw as JSON for tests/python/test_anthropic.py to check.
//   TURNPIKE_BASE=http://127.0.0.1:PORT TURNPIKE_KEY=tp-... node anthropic_sdk.mjs
import Anthropic from "@anthropic-ai/sdk";

const client = new Anthropic({ baseURL: process.env.TURNPIKE_BASE, apiKey: process.env.TURNPIKE_KEY, maxRetries: 0 });
const messages = [{ role: "user", content: "Hello there, how are you?" }];
const weather = {
  name: "get_weather",
  input_schema: { type: "object", properties: { city: { enum: ["Paris", "Oslo"] } }, required: ["city"] },
};

const message = await client.messages.create({ model: "echo", max_tokens: 200, messages });
const counted = await client.messages.countTokens({ model: "echo", messages });
const stream = client.messages.stream({ model: "echo", max_tokens: 200, messages });
let streamedText = "";
stream.on("text", (text) => { streamedText += text; });
const final = await stream.finalMessage();
const tool = await client.messages.create({
  model: "agent", max_tokens: 200, messages: [{ role: "user", content: "Weather?" }],
  tools: [weather], tool_choice: { type: "any" },
});
let notFound = null;
try {
  await client.messages.create({ model: "nope", max_tokens: 10, messages });
} catch (e) {
  notFound = { name: e.constructor.name, status: e.status, type: e.error?.error?.type };
}
console.log(JSON.stringify({
  message: { stop_reason: message.stop_reason, text: message.content[0].text, input_tokens: message.usage.input_tokens },
  counted: counted.input_tokens,
  streamed: { text: streamedText, final_text: final.content[0].text, stop_reason: final.stop_reason },
  tool: { stop_reason: tool.stop_reason, block: tool.content[tool.content.length - 1] },
  notFound,
}));
