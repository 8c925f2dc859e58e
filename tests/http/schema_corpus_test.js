// The schema corpus (schema_corpus/corpus.json: zod and pydantic-style
// schemas as clients write them) through the official `openai` client: every
// schema is either refused with a 400 that names the keyword and where it is,
// or enforced: constrained answers (response_format json_schema, and a
// required tool call for object schemas) that finish are validated by an
// independent validator (ajv with ajv-formats), and each enforced schema
// must finish at least once. No schema is silently unenforced.
//
// Random weights rarely end a free string, so after a first plain attempt
// the closing quote, ':' and '@' (schemes, emails) and closing brackets get a logit_bias: the model then
// ends values as soon as the mask allows it. The bias never widens the mask,
// so what it lets the model write is still only what the schema allows.
// Usage: node schema_corpus_test.js BASE_URL MODEL CORPUS_JSON
//        (NODE_PATH must hold openai, ajv and ajv-formats)
'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const OpenAI = require('openai');
const Ajv2020 = require('ajv/dist/2020').default;
const addFormats = require('ajv-formats').default;

const [baseURL, model, corpusPath] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
const messages = [{ role: 'user', content: 'Answer in JSON.' }];
const kAttempts = 8;       // seeds tried until an answer finishes within its tokens
const kMaxTokens = 300;
const kConcurrent = 8;     // schemas checked at once
// o200k ids: '"' 1, ':' 25, '@' 31, ']' 60, '}' 92.
const kFinishBias = { 1: 100, 25: 20, 31: 20, 60: 4, 92: 4 };

function validator() {
  // strict: false lets pydantic's `discriminator` annotation through.
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  // zod writes these beside the pattern that carries their meaning.
  for (const name of ['includes', 'starts_with', 'ends_with']) ajv.addFormat(name, true);
  return ajv;
}

// An answer's JSON text, or null when the token limit cut it off.
async function answer(schema, name, seed, asTool, biased = false) {
  const request = { model, messages, seed, temperature: 1, max_completion_tokens: kMaxTokens };
  if (biased) request.logit_bias = kFinishBias;
  if (asTool) {
    request.tools = [{ type: 'function', function: { name: 'submit', parameters: schema, strict: true } }];
    request.tool_choice = 'required';
  } else {
    request.response_format = { type: 'json_schema', json_schema: { name, schema, strict: true } };
  }
  const r = await client.chat.completions.create(request);
  const c = r.choices[0];
  if (c.finish_reason === 'length') return null;
  if (asTool) {
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
    return c.message.tool_calls[0].function.arguments;
  }
  assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
  return c.message.content;
}

async function enforced(entry, check, asTool) {
  let finished = 0;
  for (let attempt = 0; attempt < kAttempts && finished < 1; attempt++) {
    const text = await answer(entry.schema, entry.name, 1000 + attempt, asTool, attempt > 0);
    if (text === null) continue;
    const value = JSON.parse(text);
    assert.ok(check(value), `${entry.name}${asTool ? ' (tool)' : ''}: ${text} fails the schema: ` +
      JSON.stringify(check.errors));
    finished++;
  }
  assert.ok(finished > 0, `${entry.name}${asTool ? ' (tool)' : ''}: no answer finished within ` +
    `${kMaxTokens} tokens in ${kAttempts} attempts, so enforcement is unshown`);
  return finished;
}

async function refused(entry) {
  await assert.rejects(answer(entry.schema, entry.name, 1, false), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, `${entry.name}: ${e}`);
    assert.equal(e.param, 'response_format.json_schema.schema');
    assert.match(e.message, /json schema at #/, e.message);
    assert.ok(e.message.includes(entry.keyword), `${entry.name}: '${e.message}' does not name ${entry.keyword}`);
    return true;
  });
}

// One schema's checks; the line to print when they pass.
async function run(entry, ajv, tally) {
  if (entry.expect === 'refused') {
    await refused(entry);
    tally.refused++;
    return `ok ${entry.name}: refused naming ${entry.keyword}`;
  }
  assert.equal(entry.expect, 'enforced', entry.name);
  const check = ajv.compile(entry.schema);
  let n = await enforced(entry, check, false);
  if (entry.schema.type === 'object') n += await enforced(entry, check, true);
  tally.enforced++;
  tally.validated += n;
  return `ok ${entry.name}: ${n} answers validated`;
}

async function main() {
  const corpus = JSON.parse(fs.readFileSync(corpusPath, 'utf8'));
  assert.ok(corpus.length >= 40, `the corpus holds ${corpus.length} schemas`);
  const ajv = validator();
  const tally = { enforced: 0, refused: 0, validated: 0 };
  // kConcurrent schemas at once (the worker batches their requests); lines
  // print in corpus order. What is checked of an answer does not depend on
  // which requests shared its steps.
  const lines = new Array(corpus.length);
  let next = 0;
  const lane = async () => {
    for (let i = next++; i < corpus.length; i = next++) lines[i] = await run(corpus[i], ajv, tally);
  };
  await Promise.all(Array.from({ length: kConcurrent }, lane));
  for (const line of lines) console.log(line);
  console.log(`${tally.enforced} enforced (${tally.validated} answers validated), ${tally.refused} refused`);
  console.log('all ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
