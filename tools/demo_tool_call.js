// The demo's tool-call round trip over the OpenAI-compatible HTTP API (plain
// fetch, no packages): the model is offered get_weather and add and decides
// itself to call add (tool_choice "auto"); this script computes the call and
// the model answers from the result. Exits non-zero when it calls no tool.
// Usage: node tools/demo_tool_call.js BASE_URL MODEL
'use strict';
const { addTool, weatherTool, question, firstMessages, turnRequest } = require('./demo_tools');

const [baseURL, model] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error('usage: node tools/demo_tool_call.js BASE_URL MODEL');
  process.exit(2);
}

const tools = [weatherTool, addTool];

async function chat(messages) {
  const r = await fetch(`${baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(turnRequest(model, messages, tools)),
  });
  const body = await r.json();
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${JSON.stringify(body)}`);
  return body.choices[0];
}

async function main() {
  const messages = firstMessages();
  console.log(`user: ${question}`);
  const first = await chat(messages);
  if (first.message.reasoning_content) console.log(`reasoning: ${first.message.reasoning_content}`);
  const calls = first.message.tool_calls || [];
  if (calls.length === 0) {
    console.log(`answer: ${first.message.content}`);
    throw new Error(`the model called no tool (finish_reason ${first.finish_reason})`);
  }
  const call = calls[0];
  console.log(`tool_call: ${call.function.name}(${call.function.arguments})  [finish_reason ${first.finish_reason}]`);
  const args = JSON.parse(call.function.arguments);
  const result = call.function.name === 'add' ? JSON.stringify({ result: args.a + args.b })
                                              : JSON.stringify({ temperature: 24, condition: 'cloudy' });
  console.log(`tool result (computed by this script): ${result}`);
  messages.push(first.message, { role: 'tool', tool_call_id: call.id, content: result });
  const second = await chat(messages);
  if (second.message.reasoning_content) console.log(`reasoning: ${second.message.reasoning_content}`);
  console.log(`answer: ${second.message.content}`);
}

main().catch((e) => {
  console.error(`demo_tool_call: ${e.message}`);
  process.exit(1);
});
