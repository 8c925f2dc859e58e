// Every /v1/completions prompt shape and choice field through the official
// `openai` npm client: n (whole and streamed, seeds per choice, the prompt's
// KV blocks shared), echo, token-id and batched prompts, n on chat, and the
// 400s naming the field.
// Usage: node completions_client_test.js BASE_URL MODEL   (NODE_PATH must hold `openai`)
'use strict';
const assert = require('node:assert/strict');
const OpenAI = require('openai');
const { check, clientFromArgs } = require('./openai_test_client');

const { baseURL, model, client } = clientFromArgs('completions_client_test.js', 120000);

function badRequest(param) {
  return (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === param;
}

// The summed flotilla_prefix_cache_hits_tokens_total of the workers.
async function prefixHits() {
  const res = await fetch(baseURL.replace(/\/v1$/, '') + '/metrics');
  const text = await res.text();
  const line = text.split('\n').find((l) => l.startsWith('flotilla_prefix_cache_hits_tokens_total'));
  return Number(line.split(' ').pop());
}

// The texts of a streamed completion by choice index, its finish reasons and usage.
async function streamed(params) {
  const stream = await client.completions.create({
    ...params, stream: true, stream_options: { include_usage: true },
  });
  const texts = {}, finish = {};
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      texts[c.index] = (texts[c.index] || '') + c.text;
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  return { texts, finish, usage };
}

async function main() {
  const base = { model, prompt: 'Once upon a time', max_tokens: 8, temperature: 1, seed: 11 };

  await check('n: 3 returns three choices, each with its own seed, reproducibly', async () => {
    const r = await client.completions.create({ ...base, n: 3 });
    assert.equal(r.choices.length, 3);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    const texts = r.choices.map((c) => c.text);
    assert.ok(new Set(texts).size > 1, `three identical choices: ${JSON.stringify(texts)}`);
    assert.equal(r.usage.completion_tokens, 3 * 8);
    const again = await client.completions.create({ ...base, n: 3 });
    assert.deepEqual(again.choices.map((c) => c.text), texts);
    // best_of equal to n is what we do anyway.
    const best = await client.completions.create({ ...base, n: 3, best_of: 3 });
    assert.deepEqual(best.choices.map((c) => c.text), texts);
  });

  await check('n: 3 streamed equals non-streamed, usage sums the choices', async () => {
    const whole = await client.completions.create({ ...base, n: 3 });
    const s = await streamed({ ...base, n: 3 });
    assert.deepEqual([0, 1, 2].map((i) => s.texts[i]), whole.choices.map((c) => c.text));
    assert.deepEqual(Object.keys(s.finish).sort(), ['0', '1', '2']);
    assert.equal(s.usage.completion_tokens, whole.usage.completion_tokens);
    assert.equal(s.usage.prompt_tokens, whole.usage.prompt_tokens);
  });

  await check('the n choices share the prompt KV blocks', async () => {
    // A prompt no earlier request had, several KV blocks long.
    const prompt = `Request ${Date.now()}: ` + 'the quick brown fox jumps over the lazy dog '.repeat(8);
    const before = await prefixHits();
    await client.completions.create({ model, prompt, max_tokens: 2, n: 3, seed: 1, temperature: 1 });
    // The workers' counters arrive with their heartbeats.
    let after = before;
    for (let i = 0; i < 50 && after - before < 64; i++) {
      await new Promise((r) => setTimeout(r, 200));
      after = await prefixHits();
    }
    // Choices 1 and 2 each find at least two of the first choice's 16-token blocks.
    assert.ok(after - before >= 64, `prefix cache hits rose by ${after - before}`);
  });

  await check('echo puts the prompt before the completion', async () => {
    const r = await client.completions.create({ ...base, echo: true, n: 2 });
    for (const c of r.choices) assert.ok(c.text.startsWith('Once upon a time'), c.text);
    const s = await streamed({ ...base, echo: true });
    assert.ok(s.texts[0].startsWith('Once upon a time'), s.texts[0]);
    await assert.rejects(client.completions.create({ ...base, echo: true, logprobs: 1 }),
      badRequest('echo'));
  });

  await check('token-id prompts', async () => {
    const text = await client.completions.create({ ...base, prompt: 'hello world', temperature: 0 });
    const ids = await client.completions.create({ ...base, prompt: [24912, 2375], temperature: 0 });
    assert.equal(ids.choices[0].text, text.choices[0].text);
    assert.equal(ids.usage.prompt_tokens, 2);
    const echoed = await client.completions.create({ ...base, prompt: [24912, 2375], echo: true });
    assert.ok(echoed.choices[0].text.startsWith('hello world'), echoed.choices[0].text);
  });

  await check('batched prompts: strings and token-id arrays, n each', async () => {
    const one = await client.completions.create({ ...base, prompt: 'alpha', temperature: 0 });
    const two = await client.completions.create({ ...base, prompt: 'beta', temperature: 0 });
    const r = await client.completions.create({
      ...base, prompt: ['alpha', 'beta'], temperature: 0, n: 2,
    });
    assert.equal(r.choices.length, 4);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
    // choice = prompt_index * n + i
    assert.equal(r.choices[0].text, one.choices[0].text);
    assert.equal(r.choices[1].text, one.choices[0].text);
    assert.equal(r.choices[2].text, two.choices[0].text);
    assert.equal(r.choices[3].text, two.choices[0].text);
    assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens + two.usage.prompt_tokens);
    const ids = await client.completions.create({
      ...base, prompt: [[24912, 2375], [24912]], temperature: 0,
    });
    assert.equal(ids.choices.length, 2);
    const s = await streamed({ ...base, prompt: ['alpha', 'beta'], temperature: 0 });
    assert.equal(s.texts[0], one.choices[0].text);
    assert.equal(s.texts[1], two.choices[0].text);
  });

  await check('chat with n: 2', async () => {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Hi' }], max_completion_tokens: 6, n: 2,
      seed: 3, temperature: 1,
    });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  });

  await check('bad prompts and choice fields -> 400 naming the field', async () => {
    await assert.rejects(client.completions.create({ ...base, prompt: [[1, 2], [3, 999999999]] }),
      badRequest('prompt[1][1]'));
    await assert.rejects(client.completions.create({ ...base, prompt: [5, -1] }),
      badRequest('prompt[1]'));
    await assert.rejects(client.completions.create({ ...base, prompt: Array(65).fill('x') }),
      badRequest('prompt'));
    await assert.rejects(client.completions.create({ ...base, prompt: ['ok', 7] }),
      badRequest('prompt[1]'));
    await assert.rejects(client.completions.create({ ...base, n: 17 }), badRequest('n'));
    await assert.rejects(client.completions.create({ ...base, n: 2, best_of: 3 }),
      badRequest('best_of'));
  });
}

main().then(() => console.log('all ok'), (e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
