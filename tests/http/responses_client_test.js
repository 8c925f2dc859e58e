// POST /v1/responses through the official `openai` npm client: whole and
// streamed answers (the client's own ResponseStream checks the event
// sequence), reasoning items, a function-tool round trip with the store
// (previous_response_id) and with the items passed back explicitly, and the
// errors a client can make.
// Usage: node responses_client_test.js BASE_URL MODEL   (NODE_PATH must hold `openai`)
'use strict';
const assert = require('node:assert/strict');
const OpenAI = require('openai');

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 300000 });

async function check(name, fn) {
  await fn();
  console.log(`ok ${name}`);
}

// Items without the ids that differ from one response to the next.
function withoutIds(items) {
  return items.map(({ id, call_id, ...rest }) => rest);
}

function checkUsage(r) {
  const u = r.usage;
  assert.ok(u.input_tokens > 0, JSON.stringify(u));
  assert.ok(u.output_tokens > 0, JSON.stringify(u));
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
  assert.ok(u.output_tokens_details.reasoning_tokens <= u.output_tokens);
}

const weather = {
  type: 'function',
  name: 'get_weather',
  description: 'Gets the current weather of a city',
  parameters: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 12 } },
    required: ['city'],
    additionalProperties: false,
  },
};

async function expectError(params, status, param) {
  try {
    await client.responses.create(params);
  } catch (e) {
    assert.equal(e.status, status, e.message);
    assert.equal(e.param, param, e.message);
    return e;
  }
  assert.fail(`no error for ${JSON.stringify(params)}`);
}

async function main() {
  const base = {
    model, instructions: 'You are terse.', input: 'Count to five.', temperature: 0, max_output_tokens: 48,
  };
  let whole;
  await check('non-streamed response', async () => {
    whole = await client.responses.create(base);
    assert.equal(whole.object, 'response');
    assert.ok(whole.id.startsWith('resp_'));
    assert.equal(whole.model, model);
    assert.ok(['completed', 'incomplete'].includes(whole.status), whole.status);
    assert.equal(whole.instructions, 'You are terse.');
    assert.equal(whole.max_output_tokens, 48);
    // The random model may never write a readable header: then, as in chat
    // completions, there is nothing to show.
    for (const item of whole.output) {
      assert.ok(['reasoning', 'message', 'function_call'].includes(item.type), item.type);
    }
    checkUsage(whole);
    const text = whole.output.filter((i) => i.type === 'message')
      .map((i) => i.content.map((c) => c.text).join('')).join('');
    assert.equal(whole.output_text, text);
  });

  await check('streamed response equals the whole one', async () => {
    const stream = client.responses.stream(base);
    const events = [];
    for await (const event of stream) events.push(event);
    const final = await stream.finalResponse();
    events.forEach((e, i) => assert.equal(e.sequence_number, i));
    assert.equal(events[0].type, 'response.created');
    assert.equal(events[1].type, 'response.in_progress');
    assert.equal(events.at(-1).type, whole.status === 'completed' ? 'response.completed' : 'response.incomplete');
    assert.deepEqual(withoutIds(final.output), withoutIds(whole.output));
    assert.deepEqual(final.usage, whole.usage);
    let deltas = '';
    for (const e of events) if (e.type === 'response.output_text.delta') deltas += e.delta;
    assert.equal(deltas, final.output_text);
  });

  await check('reasoning items carry the analysis text', async () => {
    // The structured-output constraint forces a final JSON answer; what the
    // random model reasons before it is free. Some seed gives a reasoning item.
    let found = null;
    for (let seed = 1; seed <= 12 && !found; seed++) {
      const r = await client.responses.create({
        model, input: 'Answer in JSON.', seed, max_output_tokens: 64, reasoning: { effort: 'high' },
        text: { format: { type: 'json_schema', name: 'answer', schema: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], additionalProperties: false } } },
      });
      found = r.output.find((i) => i.type === 'reasoning' && i.content[0].text.length > 0) ? r : null;
    }
    assert.ok(found, 'no reasoning item in 12 seeds');
    assert.equal(found.reasoning.effort, 'high');
    const rs = found.output.find((i) => i.type === 'reasoning');
    assert.equal(rs.content[0].type, 'reasoning_text');
    assert.ok(found.usage.output_tokens_details.reasoning_tokens > 0);
  });

  const ask = { model, input: 'What is the weather in Paris?', tools: [weather], tool_choice: 'required', temperature: 0, max_output_tokens: 160 };
  const output = (call) => ({ type: 'function_call_output', call_id: call.call_id, output: '{"celsius": 21}' });
  let stored;
  await check('tool call round trip through previous_response_id', async () => {
    const first = await client.responses.create(ask);
    const call = first.output.find((i) => i.type === 'function_call');
    assert.ok(call, JSON.stringify(first.output));
    assert.equal(call.name, 'get_weather');
    assert.ok(call.call_id.startsWith('call_'));
    const args = JSON.parse(call.arguments);
    assert.equal(typeof args.city, 'string');
    const second = await client.responses.create({
      model, previous_response_id: first.id, input: [output(call)], tools: [weather], max_output_tokens: 32, temperature: 0,
    });
    assert.equal(second.previous_response_id, first.id);
    assert.ok(['completed', 'incomplete'].includes(second.status));
    assert.ok(second.usage.input_tokens > first.usage.input_tokens);
    stored = { first, second };
  });

  await check('the same round trip with the items passed back, without the store', async () => {
    const first = await client.responses.create({ ...ask, store: false });
    assert.equal(first.store, false);
    assert.deepEqual(withoutIds(first.output), withoutIds(stored.first.output));
    const call = first.output.find((i) => i.type === 'function_call');
    const second = await client.responses.create({
      model, input: [{ role: 'user', content: ask.input }, ...first.output, output(call)], tools: [weather],
      max_output_tokens: 32, temperature: 0, store: false,
    });
    // The same conversation: the same Harmony prompt, so the same answer.
    assert.equal(second.usage.input_tokens, stored.second.usage.input_tokens);
    assert.deepEqual(withoutIds(second.output), withoutIds(stored.second.output));
    // Not stored: it cannot be continued.
    await expectError({ model, previous_response_id: first.id, input: 'and?' }, 404, 'previous_response_id');
  });

  await check('streamed tool call', async () => {
    const stream = client.responses.stream({ ...ask, store: false });
    let args = '';
    stream.on('response.function_call_arguments.delta', (e) => { args += e.delta; });
    const final = await stream.finalResponse();
    const call = final.output.find((i) => i.type === 'function_call');
    assert.equal(args, call.arguments);
    assert.deepEqual(withoutIds(final.output), withoutIds(stored.first.output));
  });

  await check('errors name the field', async () => {
    const e = await expectError({ model, previous_response_id: 'resp_nope', input: 'hi' }, 404, 'previous_response_id');
    assert.equal(e.code, 'previous_response_not_found');
    await expectError({ model, input: [{ type: 'image_generation_call', id: 'x' }] }, 400, 'input[0].type');
    await expectError({ model, input: 'hi', tools: [{ type: 'web_search' }] }, 400, 'tools[0].type');
    await expectError({ model, input: 'hi', background: true }, 400, 'background');
    await expectError({ model, input: [{ type: 'function_call_output', call_id: 'call_x', output: '1' }] }, 400, 'input[0].call_id');
    await expectError({ model: 'other', input: 'hi' }, 404, 'model');
  });
  console.log('all ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
