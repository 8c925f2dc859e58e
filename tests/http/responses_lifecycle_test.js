// The Responses lifecycle through the official `openai` npm client: retrieve
// and delete; background responses answered at once and polled until they
// end (whole and streamed), cancelled, refused as a previous_response_id
// while they run; and reasoning returned encrypted (include:
// ["reasoning.encrypted_content"]) and passed back by a client that stores
// nothing. Where FLOTILLA_REASONING_KEY_FILE names the server's key file,
// the blobs are also opened and sealed here with node's own AES-256-GCM in
// the documented layout, with the current and the rotated key. Another
// key's responses are tests/grpc/api_auth_test.cc's.
// Usage: node responses_lifecycle_test.js BASE_URL MODEL   (NODE_PATH must hold `openai`)
'use strict';
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { check, clientFromArgs } = require('./openai_test_client');

const { model, client } = clientFromArgs('responses_lifecycle_test.js', 300000);

async function expectError(promise, status, param) {
  try {
    await promise;
  } catch (e) {
    assert.equal(e.status, status, e.message);
    assert.equal(e.param, param, e.message);
    return e;
  }
  assert.fail('no error');
}

function withoutIds(items) {
  const dropped = ['id', 'call_id', 'parsed', 'parsed_arguments', 'encrypted_content'];
  return JSON.parse(JSON.stringify(items, (key, value) => (dropped.includes(key) ? undefined : value)));
}

// The documented blob: version 1 | key id (SHA-256 of the key, first 8
// bytes) | nonce (12) | ciphertext | tag (16), base64; the version and key id
// authenticated with the purpose string.
const kPurpose = 'flotilla reasoning.encrypted_content';
function keyId(key) { return crypto.createHash('sha256').update(key).digest().subarray(0, 8); }
function openBlob(key, text) {
  const blob = Buffer.from(text, 'base64');
  const header = blob.subarray(0, 9);
  assert.equal(header[0], 1);
  assert.deepEqual(header.subarray(1), keyId(key));
  const decipher = crypto.createDecipheriv('aes-256-gcm', key, blob.subarray(9, 21));
  decipher.setAAD(Buffer.concat([header, Buffer.from(kPurpose)]));
  decipher.setAuthTag(blob.subarray(blob.length - 16));
  return Buffer.concat([decipher.update(blob.subarray(21, blob.length - 16)), decipher.final()]).toString();
}
function sealBlob(key, plaintext) {
  const header = Buffer.concat([Buffer.from([1]), keyId(key)]);
  const nonce = crypto.randomBytes(12);
  const cipher = crypto.createCipheriv('aes-256-gcm', key, nonce);
  cipher.setAAD(Buffer.concat([header, Buffer.from(kPurpose)]));
  const body = Buffer.concat([cipher.update(plaintext), cipher.final()]);
  return Buffer.concat([header, nonce, body, cipher.getAuthTag()]).toString('base64');
}
// The server's keys, current first, when the test knows them.
function serverKeys() {
  const file = process.env.FLOTILLA_REASONING_KEY_FILE;
  if (!file) return [];
  return require('node:fs').readFileSync(file, 'utf8').split('\n').map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#')).map((l) => Buffer.from(l, 'hex'));
}

const terminal = ['completed', 'incomplete', 'failed', 'cancelled'];

// Polls GET /v1/responses/{id} until the response ends (the test's own timeout bounds it).
async function poll(id) {
  for (;;) {
    const r = await client.responses.retrieve(id);
    assert.equal(r.id, id);
    if (terminal.includes(r.status)) return r;
    assert.ok(['queued', 'in_progress'].includes(r.status), r.status);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

// As responses_client_test.js: the bias opens an analysis message and the
// schema closes it, so a reasoning item and a message come out at temperature 0.
const kAnalysisToken = 35644;
const base = {
  model, input: 'Answer in JSON.', temperature: 0, max_output_tokens: 64, logit_bias: { [kAnalysisToken]: 100 },
  text: {
    format: {
      type: 'json_schema', name: 'answer', strict: true,
      schema: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], additionalProperties: false },
    },
  },
};
// Long enough that it is still running when the test cancels it.
const long = { model, input: 'Write a long story.', max_output_tokens: 2000, temperature: 1 };

const weather = {
  type: 'function', name: 'get_weather', description: 'Gets the current weather of a city',
  parameters: {
    type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'], additionalProperties: false,
  },
};
const ask = {
  model, input: 'What is the weather in Paris?', tools: [weather], tool_choice: 'required', temperature: 0,
  max_output_tokens: 160, logit_bias: { [kAnalysisToken]: 100 }, store: false,
};

async function main() {
  let foreground;
  await check('retrieve and delete a stored response', async () => {
    foreground = await client.responses.create(base);
    assert.equal(foreground.status, 'completed');
    assert.equal(foreground.background, false);
    const got = await client.responses.retrieve(foreground.id);
    assert.deepEqual(got.output, foreground.output);
    assert.deepEqual(got.usage, foreground.usage);
    await client.responses.delete(foreground.id);
    await expectError(client.responses.retrieve(foreground.id), 404, 'response_id');
    await expectError(client.responses.delete(foreground.id), 404, 'response_id');
    await expectError(client.responses.cancel(foreground.id), 404, 'response_id');
  });

  await check('background response polled until it completes', async () => {
    const started = await client.responses.create({ ...base, background: true });
    assert.equal(started.background, true);
    assert.ok(['queued', 'in_progress', 'completed'].includes(started.status), started.status);
    const done = await poll(started.id);
    assert.equal(done.status, 'completed');
    assert.equal(done.background, true);
    // The same generation as without background.
    assert.deepEqual(withoutIds(done.output), withoutIds(foreground.output));
    assert.deepEqual(done.usage, foreground.usage);
    // It can be continued, and cancelling it now is refused: it completed.
    const next = await client.responses.create({ model, previous_response_id: done.id, input: 'More.', max_output_tokens: 4 });
    assert.ok(next.usage.input_tokens > done.usage.input_tokens);
    const e = await expectError(client.responses.cancel(done.id), 400, 'response_id');
    assert.match(e.message, /completed/);
    await expectError(client.responses.cancel(next.id), 400, 'response_id');  // not a background one
  });

  await check('streamed background response, then retrieved', async () => {
    const stream = await client.responses.create({ ...base, background: true, stream: true });
    const events = [];
    for await (const event of stream) events.push(event);
    assert.equal(events[0].type, 'response.created');
    assert.equal(events[0].response.background, true);
    const last = events.at(-1);
    assert.equal(last.type, 'response.completed');
    const got = await client.responses.retrieve(last.response.id);
    assert.deepEqual(got.output, last.response.output);
    assert.deepEqual(withoutIds(got.output), withoutIds(foreground.output));
    await expectError(client.responses.retrieve(got.id, { stream: true }), 400, 'stream');
  });

  await check('cancel a running background response', async () => {
    const started = await client.responses.create({ ...long, background: true });
    assert.ok(['queued', 'in_progress'].includes(started.status), started.status);
    const follow = client.responses.create({ model, previous_response_id: started.id, input: 'and?' });
    await expectError(follow, 400, 'previous_response_id');
    const cancelled = await client.responses.cancel(started.id);
    assert.equal(cancelled.id, started.id);
    assert.equal(cancelled.status, 'cancelled');
    assert.equal((await client.responses.retrieve(started.id)).status, 'cancelled');
    assert.equal((await poll(started.id)).status, 'cancelled');
    // Cancelling twice answers the same.
    assert.equal((await client.responses.cancel(started.id)).status, 'cancelled');
    // Deleting a running one stops it too.
    const other = await client.responses.create({ ...long, background: true });
    await client.responses.delete(other.id);
    await expectError(client.responses.retrieve(other.id), 404, 'response_id');
  });

  await check('background needs the store', async () => {
    await expectError(client.responses.create({ ...base, background: true, store: false }), 400, 'background');
  });

  await check('encrypted reasoning passed back by a client that stores nothing', async () => {
    const include = ['reasoning.encrypted_content'];
    const first = await client.responses.create({ ...ask, include });
    assert.deepEqual(first.output.map((i) => i.type), ['reasoning', 'function_call'], JSON.stringify(first.output));
    const [reasoning, call] = first.output;
    assert.equal(typeof reasoning.encrypted_content, 'string');
    assert.ok(!reasoning.encrypted_content.includes(reasoning.content[0].text));
    const output = { type: 'function_call_output', call_id: call.call_id, output: '{"celsius": 21}' };
    const next = (items) => client.responses.create({
      model, input: [{ role: 'user', content: ask.input }, ...items, output], tools: [weather],
      max_output_tokens: 32, temperature: 0, store: false, include,
    });
    const plain = await next([{ ...reasoning, encrypted_content: undefined }, call]);
    // What a zero-data-retention client keeps: the sealed reasoning only.
    const sealed = { type: 'reasoning', id: reasoning.id, summary: [], encrypted_content: reasoning.encrypted_content };
    const replayed = await next([sealed, call]);
    assert.equal(replayed.usage.input_tokens, plain.usage.input_tokens);
    assert.deepEqual(withoutIds(replayed.output), withoutIds(plain.output));
    const keys = serverKeys();
    if (keys.length >= 2) {
      // Sealed with the current key, as documented; a blob of the rotated key still opens.
      assert.equal(openBlob(keys[0], reasoning.encrypted_content), reasoning.content[0].text);
      const rotated = await next([{ ...sealed, encrypted_content: sealBlob(keys[1], reasoning.content[0].text) }, call]);
      assert.equal(rotated.usage.input_tokens, plain.usage.input_tokens);
      assert.deepEqual(withoutIds(rotated.output), withoutIds(plain.output));
      console.log('ok the key file seals and its rotated key opens');
    }
    const withoutReasoning = await next([call]);
    assert.ok(withoutReasoning.usage.input_tokens < replayed.usage.input_tokens);

    const blob = Buffer.from(reasoning.encrypted_content, 'base64');
    blob[blob.length - 20] ^= 1;
    const tampered = { ...sealed, encrypted_content: blob.toString('base64') };
    let e = await expectError(next([tampered, call]), 400, 'input[1].encrypted_content');
    assert.match(e.message, /altered/);
    // A blob of another server key (the same layout, a key id this server lacks).
    const foreign = Buffer.concat([Buffer.from([1]), crypto.randomBytes(8 + 12 + 40)]).toString('base64');
    e = await expectError(next([{ ...sealed, encrypted_content: foreign }, call]), 400, 'input[1].encrypted_content');
    assert.match(e.message, /key/);
    await expectError(client.responses.create({ ...ask, include: ['message.output_text.logprobs'] }), 400, 'include[0]');
  });
  console.log('all ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
