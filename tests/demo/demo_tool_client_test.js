// A tool-call round trip with the official `openai` npm client on the demo
// model: asked to add two numbers with `add` offered and tool_choice "auto",
// the model itself calls add with them; given the tool's result it answers
// with that result.
// Usage: node demo_tool_client_test.js BASE_URL MODEL   (NODE_PATH must hold `openai`)
'use strict';
const assert = require('node:assert/strict');
const { check, clientFromArgs } = require('../http/openai_test_client');
const { addTool, firstMessages, turnRequest } = require('../../tools/demo_tools');

const { model, client } = clientFromArgs('demo_tool_client_test.js', 300000);

const tools = [addTool];

async function main() {
  const messages = firstMessages();
  let call;
  await check('the model calls add on its own', async () => {
    const r = await client.chat.completions.create(turnRequest(model, messages, tools));
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    assert.equal(c.message.tool_calls.length, 1);
    call = c.message.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'add');
    assert.deepEqual(JSON.parse(call.function.arguments), { a: 3, b: 4 });
    messages.push(c.message);
  });

  await check('given the result, it answers with it', async () => {
    messages.push({
      role: 'tool', tool_call_id: call.id,
      content: JSON.stringify({ result: 7 }),
    });
    const r = await client.chat.completions.create(turnRequest(model, messages, tools));
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', JSON.stringify(c.message));
    assert.match(c.message.content, /\b7\b/);
  });
  console.log('all ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
