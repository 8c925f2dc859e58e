// The demo's tool-call round trip over the OpenAI-compatible HTTP API (plain
// fetch, no packages): the model is offered get_weather and add and decides
// itself to call add (tool_choice "auto"); this script computes the call and
// the model answers from the result. Exits non-zero when it calls no tool.
// Usage: node tools/demo_tool_call.js BASE_URL MODEL
'use strict';

const [baseURL, model] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error('usage: node tools/demo_tool_call.js BASE_URL MODEL');
  process.exit(2);
}

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Gets the current weather in a city.',
    parameters: {
      type: 'object',
      properties: { location: { type: 'string', description: 'The city, e.g. Paris' } },
      required: ['location'],
    },
  },
}, {
  type: 'function',
  function: {
    name: 'add',
    description: 'Adds two integers.',
    parameters: {
      type: 'object',
      properties: { a: { type: 'integer' }, b: { type: 'integer' } },
      required: ['a', 'b'],
    },
  },
}];

async function chat(messages) {
  const r = await fetch(`${baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages, tools, tool_choice: 'auto', temperature: 0,
                           max_completion_tokens: 64 }),
  });
  const body = await r.json();
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${JSON.stringify(body)}`);
  return body.choices[0];
}

async function main() {
  const question = 'Use the add tool to add 3 and 4.';
  const messages = [{ role: 'system', content: 'You are a helpful assistant.' },
                    { role: 'user', content: question }];
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
