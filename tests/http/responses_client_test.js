// POST /v1/responses through the official `openai` npm client: whole and
// streamed answers (the client's own ResponseStream checks the event
// sequence), reasoning items, a function-tool round trip with the store
// (previous_response_id) and with the items passed back explicitly, and the
// errors a client can make.
// Usage: node responses_client_test.js BASE_URL MODEL   (NODE_PATH must hold `openai`)
'use strict';
const assert = require('node:assert/strict');
const { check, clientFromArgs } = require('./openai_test_client');

const { model, client } = clientFromArgs('responses_client_test.js', 300000);

// Items without the ids that differ from one response to the next, and
// without what the stream helper adds (parsed, parsed_arguments).
function withoutIds(items) {
  const dropped = ['id', 'call_id', 'parsed', 'parsed_arguments'];
  return JSON.parse(JSON.stringify(items, (key, value) => (dropped.includes(key) ? undefined : value)));
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

// The token of "analysis" (o200k): with a +100 bias the random model opens
// an analysis message, and the json_schema constraint (reasoning free, then a
// final answer that conforms) closes it, so both a reasoning item and a
// message come out, deterministically at temperature 0.
const kAnalysisToken = 35644;
const answerFormat = {
  format: {
    type: 'json_schema', name: 'answer', strict: true,
    schema: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], additionalProperties: false },
  },
};

async function main() {
  await check('unconstrained response', async () => {
    const r = await client.responses.create({ model, input: 'Count to five.', temperature: 0, max_output_tokens: 24 });
    assert.equal(r.object, 'response');
    assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
    // The random model may never write a readable header: then, as in chat
    // completions, there is nothing to show.
    for (const item of r.output) assert.ok(['reasoning', 'message', 'function_call'].includes(item.type), item.type);
    checkUsage(r);
  });

  const base = {
    model, instructions: 'You are terse.', input: 'Answer in JSON.', temperature: 0, max_output_tokens: 64,
    reasoning: { effort: 'high' }, text: answerFormat, logit_bias: { [kAnalysisToken]: 100 },
  };
  let whole;
  await check('non-streamed response with a reasoning item', async () => {
    whole = await client.responses.create(base);
    assert.equal(whole.object, 'response');
    assert.ok(whole.id.startsWith('resp_'));
    assert.equal(whole.model, model);
    assert.equal(whole.status, 'completed');
    assert.equal(whole.instructions, 'You are terse.');
    assert.equal(whole.max_output_tokens, 64);
    assert.equal(whole.reasoning.effort, 'high');
    assert.deepEqual(whole.output.map((i) => i.type), ['reasoning', 'message'], JSON.stringify(whole.output));
    const [rs, msg] = whole.output;
    assert.equal(rs.content[0].type, 'reasoning_text');
    assert.ok(rs.content[0].text.startsWith('analysis'), rs.content[0].text);
    assert.equal(msg.role, 'assistant');
    assert.equal(msg.content[0].type, 'output_text');
    assert.equal(typeof JSON.parse(msg.content[0].text).a, 'number');
    assert.equal(whole.output_text, msg.content[0].text);
    checkUsage(whole);
    assert.ok(whole.usage.output_tokens_details.reasoning_tokens > 0);
  });

  await check('streamed response equals the whole one', async () => {
    const stream = client.responses.stream(base);
    const events = [];
    for await (const event of stream) events.push(event);
    const final = await stream.finalResponse();
    events.forEach((e, i) => assert.equal(e.sequence_number, i));
    assert.equal(events[0].type, 'response.created');
    assert.equal(events[1].type, 'response.in_progress');
    assert.equal(events.at(-1).type, 'response.completed');
    assert.deepEqual(withoutIds(final.output), withoutIds(whole.output));
    assert.deepEqual(final.usage, whole.usage);
    let text = '', reasoning = '';
    for (const e of events) {
      if (e.type === 'response.output_text.delta') text += e.delta;
      if (e.type === 'response.reasoning_text.delta') reasoning += e.delta;
    }
    assert.equal(text, final.output_text);
    assert.equal(reasoning, whole.output[0].content[0].text);
    for (const type of ['response.output_item.added', 'response.content_part.added', 'response.output_text.done',
      'response.reasoning_text.done', 'response.content_part.done', 'response.output_item.done']) {
      assert.ok(events.some((e) => e.type === type), type);
    }
  });

  // tool_choice required: the grammar makes even the random model call the
  // tool; the bias makes it reason first, so the round trips below carry a
  // reasoning item back (Harmony keeps the analysis before a call).
  const ask = {
    model, input: 'What is the weather in Paris?', tools: [weather], tool_choice: 'required', temperature: 0,
    max_output_tokens: 160, logit_bias: { [kAnalysisToken]: 100 },
  };
  const output = (call) => ({ type: 'function_call_output', call_id: call.call_id, output: '{"celsius": 21}' });
  let stored;
  await check('tool call round trip through previous_response_id', async () => {
    const first = await client.responses.create(ask);
    assert.deepEqual(first.output.map((i) => i.type), ['reasoning', 'function_call'], JSON.stringify(first.output));
    const call = first.output[1];
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
    // The reasoning item is in the prompt: without it the prompt is shorter.
    const withoutReasoning = await client.responses.create({
      model, input: [{ role: 'user', content: ask.input }, first.output[1], output(call)], tools: [weather],
      max_output_tokens: 1, store: false,
    });
    assert.ok(withoutReasoning.usage.input_tokens < second.usage.input_tokens);
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
    await expectError({ model, input: 'hi', background: true, store: false }, 400, 'background');
    await expectError({ model, input: [{ type: 'function_call_output', call_id: 'call_x', output: '1' }] }, 400, 'input[0].call_id');
    await expectError({ model: 'other', input: 'hi' }, 404, 'model');
  });
  console.log('all ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
