// Drives the coordinator's HTTP API with the official `openai` npm client.
// Usage: node openai_client_test.js BASE_URL MODEL   (NODE_PATH must hold `openai`)
// Prints one line per check and exits non-zero on the first failure.
'use strict';
const assert = require('node:assert/strict');
const OpenAI = require('openai');
const { check, clientFromArgs } = require('./openai_test_client');

const { baseURL, model, client } = clientFromArgs('openai_client_test.js', 120000);

const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Count to five.' },
];

async function main() {
  let whole;
  await check('non-streamed chat', async () => {
    whole = await client.chat.completions.create({
      model, messages, temperature: 0, seed: 7, max_completion_tokens: 24, logprobs: true,
    });
    assert.equal(whole.object, 'chat.completion');
    assert.equal(whole.model, model);
    assert.equal(whole.choices.length, 1);
    const c = whole.choices[0];
    assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason), c.finish_reason);
    assert.equal(c.message.role, 'assistant');
    // usage counts what was generated: one logprob per emitted token, plus the
    // end token when the model stopped on one.
    const emitted = c.logprobs.content.length;
    const expected = emitted + (c.finish_reason === 'length' ? 0 : 1);
    assert.equal(whole.usage.completion_tokens, expected);
    assert.ok(whole.usage.completion_tokens <= 24);
    assert.ok(whole.usage.prompt_tokens > 20, `prompt_tokens ${whole.usage.prompt_tokens}`);
    assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
  });

  await check('streamed chat equals non-streamed', async () => {
    const stream = await client.chat.completions.create({
      model, messages, temperature: 0, seed: 7, max_completion_tokens: 24, logprobs: true,
      stream: true, stream_options: { include_usage: true },
    });
    let content = '', reasoning = '', finish = null, usage = null, chunks = 0, role = null;
    const tokens = [];
    for await (const chunk of stream) {
      chunks++;
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (chunk.usage) usage = chunk.usage;
      for (const ch of chunk.choices) {
        if (ch.delta.role) role = ch.delta.role;
        if (ch.delta.content) content += ch.delta.content;
        if (ch.delta.reasoning_content) reasoning += ch.delta.reasoning_content;
        if (ch.finish_reason) finish = ch.finish_reason;
        if (ch.logprobs && ch.logprobs.content) for (const t of ch.logprobs.content) tokens.push(t.token);
      }
    }
    const m = whole.choices[0].message;
    assert.ok(chunks >= 2);
    assert.equal(role, 'assistant');
    assert.equal(content, m.content ?? '');
    assert.equal(reasoning, m.reasoning_content ?? '');
    assert.equal(finish, whole.choices[0].finish_reason);
    assert.deepEqual(usage, whole.usage);
    // The same tokens were generated (the synthetic model's text rarely forms
    // a Harmony message, so the content alone could be empty in both).
    assert.deepEqual(tokens, whole.choices[0].logprobs.content.map((t) => t.token));
    assert.ok(tokens.length > 0);
  });

  await check('stream helper accumulates the same message', async () => {
    const runner = client.chat.completions.stream({
      model, messages, temperature: 0, seed: 7, max_completion_tokens: 24,
    });
    const final = await runner.finalChatCompletion();
    assert.equal(final.choices[0].message.content ?? '', whole.choices[0].message.content ?? '');
  });

  await check('completions', async () => {
    const r = await client.completions.create({ model, prompt: 'hello world', max_tokens: 5, temperature: 0 });
    assert.equal(r.object, 'text_completion');
    assert.equal(typeof r.choices[0].text, 'string');
    assert.equal(r.usage.prompt_tokens, 2);
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 5);
    const s = await client.completions.create({
      model, prompt: 'hello world', max_tokens: 5, temperature: 0, stream: true,
    });
    let text = '';
    for await (const chunk of s) for (const ch of chunk.choices) text += ch.text;
    assert.equal(text, r.choices[0].text);
  });

  await check('models', async () => {
    const list = await client.models.list();
    const ids = [];
    for await (const m of list) ids.push(m.id);
    assert.deepEqual(ids, [model]);
    const one = await client.models.retrieve(model);
    assert.equal(one.id, model);
  });

  await check('unknown model -> 404 NotFoundError', async () => {
    await assert.rejects(
      client.chat.completions.create({ model: 'no-such-model', messages }),
      (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && /no-such-model/.test(e.message));
  });

  await check('invalid field -> 400 BadRequestError naming it', async () => {
    await assert.rejects(
      client.chat.completions.create({ model, messages, n: 17 }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'n');
    await assert.rejects(
      client.chat.completions.create({ model, messages: [{ role: 'wizard', content: 'x' }] }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'messages[0].role');
  });

  await check('bad JSON -> 400 BadRequestError', async () => {
    // The client always sends valid JSON; a fetch wrapper cuts the body short.
    const broken = new OpenAI({
      baseURL, apiKey: 'unused', maxRetries: 0,
      fetch: (url, init) => fetch(url, { ...init, body: '{"model": ' }),
    });
    await assert.rejects(
      broken.chat.completions.create({ model, messages }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /JSON/.test(e.message));
  });
}

main().then(() => console.log('all ok'), (e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
