// The request field policy and honest finish reasons through the official
// `openai` npm client: every extra field clients send today is accepted (the
// ones acted on change the answer), unknown fields come back named in the
// x-flotilla-ignored-fields header, reasoning is in both `reasoning` and
// `reasoning_content`, and a forced function call cut by the token limit is
// finish_reason "length" (whole: no call in the message; streamed: the same
// reason) and a Responses "incomplete", never "tool_calls" with cut arguments.
// Usage: node request_fields_client_test.js BASE_URL MODEL   (NODE_PATH must hold `openai`)
'use strict';
const assert = require('node:assert/strict');
const OpenAI = require('openai');
const { check, clientFromArgs } = require('./openai_test_client');

const { model, client } = clientFromArgs('request_fields_client_test.js', 300000);
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['c', 'f'] } },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};

async function main() {
  await check('the extras clients send are accepted, unknown ones named in a header', async () => {
    const { data, response } = await client.chat.completions.create({
      model, messages, max_completion_tokens: 8, seed: 1,
      prompt_cache_key: 'user-42', safety_identifier: 'hash-1', verbosity: 'low', service_tier: 'auto',
      store: false, metadata: { k: 'v' }, user: 'u1', parallel_tool_calls: false, modalities: ['text'],
      prediction: { type: 'content', content: 'x' }, web_search_options: {}, logit_bias: { 13: 1 },
      chat_template_kwargs: { reasoning_effort: 'low', model_identity: 'You are a test.' },
      stop_token_ids: [13], min_tokens: 2, top_k: 20, min_p: 0.01, repetition_penalty: 1.05,
      guided_json: { type: 'object' }, priority: 3,
    }).withResponse();
    assert.equal(data.object, 'chat.completion');
    assert.equal(response.headers.get('x-flotilla-ignored-fields'), 'guided_json,priority');
    const clean = await client.chat.completions.create({ model, messages, max_completion_tokens: 2 }).withResponse();
    assert.equal(clean.response.headers.get('x-flotilla-ignored-fields'), null);
  });

  await check('completions take stop_token_ids and min_tokens', async () => {
    // Greedy "hello" repeats under this bias; stopping on it ends at once after min_tokens.
    const base = { model, prompt: 'Say something.', max_tokens: 8, temperature: 0, logit_bias: { 24912: 100 } };
    const stopped = await client.completions.create({ ...base, stop_token_ids: [24912] });
    assert.equal(stopped.choices[0].finish_reason, 'stop');
    assert.equal(stopped.choices[0].text, '');
    assert.equal(stopped.usage.completion_tokens, 1);
    const held = await client.completions.create({ ...base, stop_token_ids: [24912], min_tokens: 3 });
    assert.equal(held.choices[0].finish_reason, 'stop');
    assert.equal(held.usage.completion_tokens, 4);
    assert.equal(held.choices[0].text.length > 0, true);
    assert.ok(!held.choices[0].text.includes('hello'), held.choices[0].text);
    await assert.rejects(client.completions.create({ ...base, min_tokens: 9 }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'min_tokens');
    await assert.rejects(client.completions.create({ ...base, stop_token_ids: [-1] }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'stop_token_ids[0]');
  });

  await check('reasoning in both reasoning and reasoning_content, whole and streamed', async () => {
    // "analysis" (o200k 35644) at +100 makes the random model open an
    // analysis message; the json_schema constraint then closes it with an answer.
    const request = {
      model, messages, max_completion_tokens: 64, temperature: 0, logit_bias: { 35644: 100 },
      response_format: {
        type: 'json_schema',
        json_schema: { name: 'a', strict: true, schema: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], additionalProperties: false } },
      },
    };
    const whole = await client.chat.completions.create(request);
    const m = whole.choices[0].message;
    assert.ok(m.reasoning.startsWith('analysis'), JSON.stringify(m));
    assert.equal(m.reasoning, m.reasoning_content);
    const stream = await client.chat.completions.create({ ...request, stream: true });
    let reasoning = '', reasoningContent = '';
    for await (const chunk of stream) {
      for (const ch of chunk.choices) {
        reasoning += ch.delta.reasoning ?? '';
        reasoningContent += ch.delta.reasoning_content ?? '';
      }
    }
    assert.equal(reasoning, reasoningContent);
    assert.equal(reasoning, m.reasoning);
  });

  await check('a forced call cut by max_tokens is "length", never a broken tool_calls', async () => {
    let cut = 0, done = 0;
    for (const [i, toolChoice] of [['required'], [{ type: 'function', function: { name: 'get_weather' } }]]
      .flatMap((c) => [4, 8, 12, 16, 24, 200].map((n) => [n, c[0]]))
      .entries()) {
      const [maxTokens, tool_choice] = toolChoice;
      const r = await client.chat.completions.create({
        model, messages, tools: [weather], tool_choice, seed: 300 + i, temperature: 1,
        max_completion_tokens: maxTokens,
      });
      const c = r.choices[0];
      if (c.finish_reason === 'length') {
        cut++;
        assert.equal(c.message.tool_calls, undefined, JSON.stringify(c));
      } else {
        done++;
        assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
        const args = JSON.parse(c.message.tool_calls[0].function.arguments);
        assert.ok(['c', 'f'].includes(args.unit));
      }
      // The stream ends with the same reason.
      const s = await client.chat.completions.create({
        model, messages, tools: [weather], tool_choice, seed: 300 + i, temperature: 1,
        max_completion_tokens: maxTokens, stream: true,
      });
      let finish = null;
      for await (const chunk of s) for (const ch of chunk.choices) if (ch.finish_reason) finish = ch.finish_reason;
      assert.equal(finish, c.finish_reason);
    }
    assert.ok(cut > 0 && done > 0, `cut ${cut}, done ${done}`);
  });

  await check('the Responses API says incomplete for a cut call', async () => {
    const tool = { type: 'function', name: 'get_weather', parameters: weather.function.parameters };
    const cut = await client.responses.create({
      model, input: 'Weather in Paris?', tools: [tool], tool_choice: 'required', max_output_tokens: 6,
      prompt_cache_key: 'user-42', safety_identifier: 'hash-1', text: { verbosity: 'low' },
    });
    assert.equal(cut.status, 'incomplete');
    assert.deepEqual(cut.incomplete_details, { reason: 'max_output_tokens' });
    for (const item of cut.output) assert.notEqual(item.status, 'completed', JSON.stringify(item));
  });
}

main().then(() => console.log('all ok'), (e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
